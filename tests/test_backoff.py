import doctest

from queue_app import backoff


def test_backoff_doctests_pass():
    result = doctest.testmod(backoff)
    assert result.attempted > 0
    assert result.failed == 0


def test_delay_grows_exponentially_until_the_cap():
    assert [backoff.delay(a, base=2, cap=10) for a in range(1, 6)] == [2.0, 4.0, 8.0, 10.0, 10.0]


def test_delay_with_a_huge_attempt_is_capped_not_an_overflow():
    assert backoff.delay(10_000, base=2, cap=60) == 60.0
