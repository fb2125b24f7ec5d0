import doctest

import pytest

from queue_app.core import retrying
from queue_app.core.retrying import MAX_DELAY, RetryPolicy


class Throttled(Exception):
    def __init__(self, retry_after):
        super().__init__(f"429, retry after {retry_after}s")
        self.retry_after = retry_after


def test_retrying_doctests_pass():
    result = doctest.testmod(retrying)
    assert result.attempted > 0
    assert result.failed == 0


def test_discard_on_wins_over_retry_on_for_an_exception_in_both():
    policy = RetryPolicy(retry_on=(LookupError,), discard_on=(KeyError,))

    assert policy.decide(KeyError("k")) == (False, "discarded: KeyError")
    assert policy.decide(IndexError("i")) == (True, None)


def test_retry_on_matches_subclasses_as_except_does():
    assert RetryPolicy(retry_on=[OSError]).decide(ConnectionResetError()) == (True, None)


def test_a_backoff_function_sees_the_attempt_and_the_exception():
    seen = []

    def retry_after(attempt, exc):
        seen.append((attempt, type(exc)))
        return getattr(exc, "retry_after", None)

    policy = RetryPolicy(backoff=retry_after)

    assert policy.delay(2, Throttled(120)) == 120.0
    assert policy.delay(3, KeyError()) is None
    assert seen == [(2, Throttled), (3, KeyError)]


@pytest.mark.parametrize("returned", ["60", float("nan"), True, []])
def test_a_backoff_returning_no_number_falls_back_to_the_default(returned):
    assert RetryPolicy(backoff=lambda attempt, exc: returned).delay(1, KeyError()) is None


def test_a_backoff_that_raises_falls_back_to_the_default():
    assert RetryPolicy(backoff=lambda attempt, exc: 1 / 0).delay(1, KeyError()) is None


def test_a_backoff_delay_is_held_between_zero_and_a_week():
    assert RetryPolicy(backoff=lambda a, e: -5).delay(1, KeyError()) == 0.0
    assert RetryPolicy(backoff=lambda a, e: 10**9).delay(1, KeyError()) == MAX_DELAY


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"retry_on": "ValueError"}, "retry_on must be an exception class or a tuple of them"),
        ({"retry_on": (ValueError, "KeyError")}, "retry_on must be an exception class"),
        ({"discard_on": (int,)}, "discard_on must be an exception class"),
        ({"backoff": 30}, r"backoff must be a function of \(attempt, exception\)"),
    ],
)
def test_a_bad_policy_is_refused_with_what_to_give(options, message):
    with pytest.raises(TypeError, match=message):
        RetryPolicy(**options)


def test_a_long_exception_name_is_cut_to_the_reason_column():
    long = type("E" * 300, (Exception,), {})

    _, reason = RetryPolicy(discard_on=(long,)).decide(long())

    assert reason.startswith("discarded: EEE") and len(reason) == retrying.REASON_MAX_LENGTH
