"""Retry delays: pure functions, no database.

>>> delay(1), delay(2), delay(3)
(2.0, 4.0, 8.0)
>>> delay(20, cap=3600)
3600.0
>>> delay(3, base=3)
27.0
>>> 0 <= delay(5, jitter=True, rng=__import__("random").Random(1)) <= 32
True
"""

import random


def delay(attempt, *, base=2.0, cap=3600.0, jitter=False, rng=random):
    """Return the seconds to wait before retrying after failed attempt number ``attempt``."""
    attempt = max(1, int(attempt))
    try:
        seconds = float(base) ** attempt
    except OverflowError:
        seconds = float(cap)
    seconds = min(float(cap), seconds)
    if jitter:
        # "Full jitter": spreads retries of jobs that failed together over the whole window.
        seconds = rng.uniform(0, seconds)
    return seconds
