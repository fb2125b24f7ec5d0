"""Snooze: a handler or task asks to run later; the job goes back to pending at a later
run_at without spending an attempt, at most MAX_SNOOZES times."""

from datetime import timedelta

import pytest
from django.tasks import TaskResultStatus, task
from django.utils import timezone

from queue_app import Snooze, enqueue
from queue_app.core import transitions
from queue_app.handlers import registry
from queue_app.models import Event, EventType, Job, State
from queue_app.worker.execution import run_one
from tests.support import event_types
from tests.worker_support import lease_settings, run_worker

pytestmark = pytest.mark.django_db


def snoozes_until_told(payload, job):
    print(f"looked at attempt {job.attempts}")
    if not payload.get("ready"):
        raise Snooze(payload.get("seconds", 30))
    return "done"


LOOKS = []  # run_one() runs the task in this process


@task(takes_context=True)
def waits_for_upstream(context, times):
    LOOKS.append(context.attempt)
    if len(LOOKS) <= times:
        raise Snooze(0)
    return len(context.task_result.worker_ids)


@pytest.fixture(autouse=True)
def _handler():
    registry.register("snoozy", snoozes_until_told)
    return


def test_a_snooze_sends_the_job_back_later_with_its_attempt_unspent():
    job = enqueue("snoozy", {"seconds": 30}, max_attempts=1)
    before = timezone.now()

    assert run_one().state == State.PENDING

    job.refresh_from_db()
    assert (job.state, job.attempts, job.lease_owner) == (State.PENDING, 0, None)
    assert before + timedelta(seconds=29) < job.run_at < timezone.now() + timedelta(seconds=31)
    assert event_types(job) == [EventType.ENQUEUED, EventType.CLAIMED, EventType.SNOOZED]
    snoozed = Event.objects.get(job=job, type=EventType.SNOOZED)
    assert (snoozed.metadata["seconds"], snoozed.metadata["snoozes"]) == (30.0, 1)
    assert snoozed.metadata["output"] == {"stdout": "looked at attempt 1\n"}


def test_a_snoozed_job_runs_again_when_its_time_comes_and_its_one_attempt_is_still_there():
    job = enqueue("snoozy", {"seconds": 0.05}, max_attempts=1)
    run_one()
    Job.objects.filter(id=job.id).update(payload={"ready": True}, run_at=timezone.now())

    done = run_one()

    assert (done.state, done.attempts, done.result) == (State.COMPLETED, 1, "done")


def test_past_max_snoozes_the_snooze_fails_the_attempt(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_SNOOZES": 2}
    job = enqueue("snoozy", {"seconds": 0}, max_attempts=1)

    outcomes = [run_one().state for _ in range(3)]

    assert outcomes == [State.PENDING, State.PENDING, State.DEAD_LETTER]
    job.refresh_from_db()
    assert job.last_error["type"].endswith("TooManySnoozes")
    assert Event.objects.filter(job=job, type=EventType.SNOOZED).count() == 2


def test_a_stale_worker_cannot_snooze_a_job_it_lost():
    job = enqueue("snoozy")
    [claimed] = transitions.claim("w1")
    transitions.release(job.id, worker_id="w1", attempt=claimed.attempts)

    assert transitions.snooze(job.id, worker_id="w1", attempt=1, seconds=5) is None
    assert not Event.objects.filter(job=job, type=EventType.SNOOZED).exists()


@pytest.mark.parametrize("seconds", [-1, True, "5", float("nan")])
def test_snooze_refuses_what_is_not_a_number_of_seconds(seconds):
    with pytest.raises(ValueError, match="Snooze takes a number of seconds"):
        Snooze(seconds)


def test_a_task_that_snoozes_reads_ready_and_its_snoozed_claims_are_no_attempts():
    LOOKS.clear()
    result = waits_for_upstream.enqueue(2)

    for _ in range(2):
        assert run_one().state == State.PENDING
        result.refresh()
        assert (result.status, result.worker_ids, result.errors) == (TaskResultStatus.READY, [], [])
    done = run_one()

    result.refresh()
    assert (done.state, done.attempts) == (State.COMPLETED, 1)
    assert result.status == TaskResultStatus.SUCCESSFUL and len(result.worker_ids) == 1
    assert LOOKS == [1, 1, 1]  # every look was its first attempt


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_snoozes_and_later_completes_without_spending_attempts(settings):
    settings.JOBQUEUE = lease_settings()
    # A snooze long enough that the first worker, however slow a loaded machine makes
    # it, has left before it ends; the test then brings the job's time forward itself.
    job = enqueue("snoozy", {"seconds": 30}, max_attempts=1)

    assert run_worker(burst=True, batch=5) == 0  # a burst worker leaves the snoozed job be
    job.refresh_from_db()
    assert job.state == State.PENDING and job.run_at > timezone.now() + timedelta(seconds=20)
    Job.objects.filter(id=job.id).update(payload={"ready": True}, run_at=timezone.now())
    assert run_worker(burst=True, batch=5, within=30) == 0

    job.refresh_from_db()
    assert (job.state, job.attempts) == (State.COMPLETED, 1)
    assert event_types(job).count(EventType.SNOOZED) == 1
