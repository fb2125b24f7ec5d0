"""Durations as operators type them: ``500ms``, ``30s``, ``5m``, ``1h``, or plain seconds.

>>> parse("500ms"), parse("30s"), parse("5m"), parse("1.5h"), parse("2")
(0.5, 30.0, 300.0, 5400.0, 2.0)
>>> parse("0")
0.0
"""

import math
import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?\s*$")


def parse(text):
    """Return the seconds that ``text`` names; raise ValueError saying what is accepted."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        match = _RE.match(str(text))
        if not match:
            raise ValueError(
                f"invalid duration {text!r}: use a number with an optional unit, e.g. 500ms, 30s, 5m, 1h"
            )
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"invalid duration {text!r}: must be a finite, non-negative number of seconds")
    return seconds


def format(seconds):
    """Return a short human form of ``seconds``: ``850ms``, ``12.3s``, ``4m05s``, ``2h10m``."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
