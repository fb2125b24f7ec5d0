"""Retry control by exception: which errors a kind retries, which it discards, and how
long it waits, as its handler or ``@task`` declares them. Pure rules, no database.

>>> policy = RetryPolicy(retry_on=(ConnectionError,), discard_on=(ValueError,))
>>> policy.decide(ConnectionError("down"))
(True, None)
>>> policy.decide(ValueError("bad id"))
(False, 'discarded: ValueError')
>>> policy.decide(KeyError("x"))
(False, 'not in retry_on: KeyError')
>>> RetryPolicy().decide(KeyError("x"))
(True, None)
>>> RetryPolicy(backoff=lambda attempt, exc: 30).delay(2, KeyError())
30.0
>>> RetryPolicy(backoff=lambda attempt, exc: None).delay(2, KeyError()) is None
True
>>> RetryPolicy(retry_on=ValueError).retry_on
(<class 'ValueError'>,)
>>> RetryPolicy(discard_on=("ValueError",))
Traceback (most recent call last):
...
TypeError: discard_on must be an exception class or a tuple of them, got ('ValueError',)
"""

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Real

log = logging.getLogger("queue_app")

# A retry parked for longer than a week is a lost job, not a backoff (validation.py's
# per-job bound): a longer Retry-After is held to this.
MAX_DELAY = 7 * 24 * 3600
# The stored reason's room (DeadLetter.reason): a long exception name is cut, not refused.
REASON_MAX_LENGTH = 200


def _exception_types(value, field):
    if value is None:
        return ()
    if isinstance(value, type):
        value = (value,)
    elif isinstance(value, list):
        value = tuple(value)
    if not isinstance(value, tuple) or not all(
        isinstance(t, type) and issubclass(t, BaseException) for t in value
    ):
        raise TypeError(f"{field} must be an exception class or a tuple of them, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """What a kind does with a failed attempt's exception; checked when it is declared."""

    # Only these exceptions retry (empty: every one does); any other dead-letters at once.
    retry_on: tuple = ()
    # These dead-letter at once, whatever retry_on says, with the reason "discarded: <type>".
    discard_on: tuple = ()
    # backoff(attempt, exception) -> seconds, or None for the job's default backoff: a
    # rate-limited API's Retry-After.
    backoff: Callable | None = None

    def __post_init__(self):
        object.__setattr__(self, "retry_on", _exception_types(self.retry_on, "retry_on"))
        object.__setattr__(self, "discard_on", _exception_types(self.discard_on, "discard_on"))
        if self.backoff is not None and not callable(self.backoff):
            raise TypeError(
                f"backoff must be a function of (attempt, exception) returning seconds or None, "
                f"got {self.backoff!r}"
            )

    def __bool__(self):
        return bool(self.retry_on or self.discard_on or self.backoff)

    def decide(self, exc):
        """Return (whether ``exc`` may retry, the reason it may not or None)."""
        name = type(exc).__name__
        if self.discard_on and isinstance(exc, self.discard_on):
            return False, f"discarded: {name}"[:REASON_MAX_LENGTH]
        if self.retry_on and not isinstance(exc, self.retry_on):
            return False, f"not in retry_on: {name}"[:REASON_MAX_LENGTH]
        return True, None

    def delay(self, attempt, exc):
        """Seconds before the retry after failed attempt ``attempt``, or None for the
        default backoff. A backoff that raises or returns no usable number falls back to
        the default too (logged): a bug in it must not lose the retry."""
        if self.backoff is None:
            return None
        try:
            seconds = self.backoff(attempt, exc)
        except Exception:
            log.exception("backoff %r raised; using the default backoff", self.backoff)
            return None
        if seconds is None:
            return None
        if isinstance(seconds, bool) or not isinstance(seconds, Real) or not math.isfinite(seconds):
            log.warning(
                "backoff %r returned %r, not seconds; using the default backoff", self.backoff, seconds
            )
            return None
        return min(max(float(seconds), 0.0), float(MAX_DELAY))


NONE = RetryPolicy()
