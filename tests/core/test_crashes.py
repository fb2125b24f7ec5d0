"""transitions.fail(crashed=True): crashes count apart from failures; at MAX_CRASHES the
job is dead-lettered as "poison"; an ordinary failure counts none; requeue resets them."""

import pytest

from queue_app import enqueue
from queue_app.core import events, transitions
from queue_app.models import DeadLetter, Event, EventType, Job, State

pytestmark = pytest.mark.django_db

ERROR = events.error("WorkerCrashed", "the worker process running the job exited with status 1")


def _claim_and_fail(job, **options):
    [claimed] = transitions.claim("w1")
    assert claimed.id == job.id
    Job.objects.filter(id=job.id).update(run_at=claimed.run_at)
    state = transitions.fail(
        job.id, worker_id="w1", attempt=claimed.attempts, error=ERROR, retry_delay=0, **options
    )
    job.refresh_from_db()
    return state


def test_a_crash_counts_on_the_job_and_in_its_failed_event():
    job = enqueue("crashy", max_attempts=5)

    assert _claim_and_fail(job, crashed=True) == State.PENDING

    assert job.crashes == 1
    assert Event.objects.get(job=job, type=EventType.FAILED).metadata["crashes"] == 1


def test_an_ordinary_failure_counts_no_crash():
    job = enqueue("crashy", max_attempts=5)

    _claim_and_fail(job)

    assert job.crashes is None
    assert "crashes" not in Event.objects.get(job=job, type=EventType.FAILED).metadata


def test_the_max_crashes_crash_dead_letters_the_job_as_poison_with_attempts_left(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_CRASHES": 2}
    job = enqueue("crashy", max_attempts=5)

    states = [_claim_and_fail(job, crashed=True) for _ in range(2)]

    assert states == [State.PENDING, State.DEAD_LETTER]
    assert (job.attempts, job.crashes) == (2, 2)
    assert DeadLetter.objects.get(job=job).reason == "poison"
    dead = Event.objects.get(job=job, type=EventType.DEAD_LETTERED)
    assert (dead.metadata["reason"], dead.metadata["crashes"]) == ("poison", 2)


def test_failures_between_crashes_do_not_reset_the_count(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_CRASHES": 2}
    job = enqueue("crashy", max_attempts=5)

    states = [_claim_and_fail(job, crashed=True), _claim_and_fail(job), _claim_and_fail(job, crashed=True)]

    assert states == [State.PENDING, State.PENDING, State.DEAD_LETTER]
    assert DeadLetter.objects.get(job=job).reason == "poison"


def test_requeue_gives_a_poison_job_a_fresh_count_of_crashes(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_CRASHES": 1}
    job = enqueue("crashy", max_attempts=5)
    _claim_and_fail(job, crashed=True)

    requeued = transitions.requeue(job.id, actor="test")

    assert (requeued.state, requeued.crashes) == (State.PENDING, None)
    assert Event.objects.get(job=job, type=EventType.REQUEUED).metadata["previous_crashes"] == 1
