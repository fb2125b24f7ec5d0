import doctest
from datetime import datetime, timedelta

import pytest

from queue_app import bulk_enqueue, enqueue
from queue_app.core import backoff, transitions
from queue_app.exceptions import InvalidJob
from queue_app.models import Event, EventType, Job, State
from queue_app.worker import execution


def test_backoff_doctests_pass():
    result = doctest.testmod(backoff)
    assert result.attempted > 0
    assert result.failed == 0


def test_delay_grows_exponentially_until_the_cap():
    assert [backoff.delay(a, base=2, cap=10) for a in range(1, 6)] == [2.0, 4.0, 8.0, 10.0, 10.0]


def test_delay_with_a_huge_attempt_is_capped_not_an_overflow():
    assert backoff.delay(10_000, base=2, cap=60) == 60.0


# --- per-job overrides: the retry's run_at follows the job's own base, cap and jitter ------

WORKER = "test-host:1:backoff"


def _fail_once(job):
    """Claim ``job`` and fail its attempt; return (seconds from the failure to run_at, the
    recorded delay, job). Both ends come from the database: no clock of the test's own."""
    [claimed] = transitions.claim(WORKER, kinds=[job.kind])
    assert claimed.id == job.id
    assert (
        transitions.fail(job.id, worker_id=WORKER, attempt=claimed.attempts, error={"message": "no"})
        == State.PENDING
    )
    job.refresh_from_db()
    event = Event.objects.filter(job=job, type=EventType.FAILED).latest("id")
    assert datetime.fromisoformat(event.metadata["retry_at"]) == job.run_at
    return (job.run_at - event.at).total_seconds(), event.metadata["delay"], job


def _retry_now(job):
    # As an operator's "retry now": the next claim takes it without waiting out the delay.
    transitions.retry_now(job.id)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "overrides, expected",
    [
        # Its own base to the power of the attempt.
        ({"backoff_base": 10}, [10.0, 100.0, 1000.0]),
        # Capped at its own backoff_max.
        ({"backoff_base": 10, "backoff_max": timedelta(seconds=30)}, [10.0, 30.0, 30.0]),
    ],
)
def test_a_jobs_own_backoff_beats_the_settings(settings, overrides, expected):
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "BACKOFF_BASE": 2,
        "BACKOFF_MAX_SECONDS": 3600,
        "BACKOFF_JITTER": False,
    }
    job = enqueue("backoff-own", max_attempts=5, **overrides)
    delays = []
    for _ in range(3):
        waited, delay, job = _fail_once(job)
        assert waited == pytest.approx(delay, abs=0.001)
        delays.append(delay)
        _retry_now(job)
    assert delays == expected


@pytest.mark.django_db
def test_a_job_without_overrides_follows_the_settings(settings):
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "BACKOFF_BASE": 3,
        "BACKOFF_MAX_SECONDS": 20,
        "BACKOFF_JITTER": False,
    }
    job = enqueue("backoff-defaults", max_attempts=5)
    assert (job.backoff_base, job.backoff_max, job.backoff_jitter) == (None, None, None)
    delays = []
    for _ in range(3):
        _, delay, job = _fail_once(job)
        delays.append(delay)
        _retry_now(job)
    assert delays == [3.0, 9.0, 20.0]


@pytest.mark.django_db
def test_a_job_can_turn_jitter_off_when_the_settings_turn_it_on(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "BACKOFF_BASE": 2, "BACKOFF_JITTER": True}
    job = enqueue("backoff-no-jitter", max_attempts=5, backoff_base=5, backoff_jitter=False)
    _, delay, job = _fail_once(job)
    assert delay == 5.0


@pytest.mark.django_db
def test_a_job_with_jitter_waits_anywhere_up_to_its_delay(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "BACKOFF_JITTER": False}
    jobs = bulk_enqueue(
        [
            {"kind": "backoff-jitter", "max_attempts": 2, "backoff_base": 100, "backoff_jitter": True}
            for _ in range(20)
        ]
    )
    delays = []
    for _job in jobs:
        [claimed] = transitions.claim(WORKER, kinds=["backoff-jitter"])
        transitions.fail(claimed.id, worker_id=WORKER, attempt=claimed.attempts, error={"message": "no"})
        delays.append(Event.objects.filter(job_id=claimed.id, type=EventType.FAILED).get().metadata["delay"])
    assert all(0 <= d <= 100 for d in delays)
    # Twenty draws from [0, 100] are not all the full delay: jitter was applied.
    assert len(set(delays)) > 1 and max(delays) < 100
    assert {j.backoff_jitter for j in Job.objects.filter(id__in=[j.id for j in jobs])} == {True}


@pytest.mark.django_db
def test_an_explicit_retry_delay_still_wins_over_the_jobs_backoff():
    job = enqueue("backoff-explicit", max_attempts=3, backoff_base=50)
    [claimed] = transitions.claim(WORKER, kinds=[job.kind])
    transitions.fail(
        job.id, worker_id=WORKER, attempt=claimed.attempts, error={"message": "no"}, retry_delay=1.5
    )
    assert Event.objects.filter(job=job, type=EventType.FAILED).get().metadata["delay"] == 1.5


@pytest.mark.django_db
def test_a_chained_follow_up_carries_its_own_backoff():
    parent = enqueue(
        "echo", on_success={"kind": "add", "payload": {"a": 1, "b": 2}, "backoff_base": 7, "backoff_max": 60}
    )

    assert execution.run_one(worker_id=WORKER).id == parent.id

    child = Job.objects.exclude(id=parent.id).get()
    assert (child.kind, child.backoff_base, child.backoff_max) == ("add", 7, 60)


@pytest.mark.django_db
def test_a_chained_follow_up_with_an_out_of_range_backoff_is_refused():
    with pytest.raises(InvalidJob, match="on_success: backoff_base 0 is out of range"):
        enqueue("echo", on_success={"kind": "add", "backoff_base": 0})
    assert not Job.objects.exists()
