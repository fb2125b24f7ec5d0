"""Aborting a running job: cooperative (the handler sees cancelled()) and, after the
grace period, by killing its worker child; with real runworker processes."""

import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from queue_app import current_job, enqueue
from queue_app.core import aborting, transitions
from queue_app.exceptions import InvalidTransition
from queue_app.handlers import registry
from queue_app.models import EventType, Job, State
from queue_app.ops import actions as operations
from queue_app.worker import execution
from tests import worker_support
from tests.factories import JobFactory
from tests.support import event_types as types
from tests.worker_support import lease_settings, start_worker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
# The tests that run all they test in this process (no worker process, no subprocess, no
# second connection) need no commit: a transaction rolled back after each, not a flush of
# every table.
in_process = pytest.mark.django_db


def polite(payload):
    """Report that it runs, then work in small steps until asked to stop."""
    job = current_job()
    job.progress(1, "started")
    end = time.monotonic() + payload.get("seconds", 60)
    while time.monotonic() < end:
        if job.cancelled():
            return "stopped early"
        time.sleep(0.02)
    return "ran to the end"


def stubborn(payload):
    """Report that it runs, then sleep in C without ever looking at cancelled()."""
    current_job().progress(1, "sleeping")
    time.sleep(payload.get("seconds", 60))
    return "woke up"


def spinning(payload):
    """Report that it runs, then busy-loop in Python without ever looking."""
    current_job().progress(1, "spinning")
    end = time.monotonic() + payload.get("seconds", 60)
    while time.monotonic() < end:
        pass
    return "spun"


def self_cancelling(payload, job):
    """Ask for its own abort, then wait to be told (no supervisor: the row is read)."""
    print("cleaning up before the abort")
    aborting.cancel(job.id, actor="itself")
    ctx = current_job()
    end = time.monotonic() + 10
    while not ctx.cancelled() and time.monotonic() < end:
        time.sleep(0.01)
    return "noticed" if ctx.cancelled() else "never noticed"


@pytest.fixture(autouse=True)
def _abort_handlers():
    for func in (polite, stubborn, spinning, self_cancelling):
        registry.register(func.__name__, func)


def _abort_settings(grace):
    return lease_settings(ABORT_CHECK_INTERVAL=0.1, ABORT_GRACE_SECONDS=grace, PROGRESS_INTERVAL=0)


@pytest.fixture
def fast_abort(settings):
    settings.JOBQUEUE = _abort_settings(1.0)


@pytest.fixture
def patient_abort(settings):
    # A handler that honours its abort should never meet the grace: a loaded CI machine took over a second
    # between the request and the handler's raise, and the kill then won the race.
    settings.JOBQUEUE = _abort_settings(60.0)


# The timeline of a job aborted while it ran: one event per transition.
ABORTED = [EventType.ENQUEUED, EventType.CLAIMED, EventType.ABORT_REQUESTED, EventType.CANCELLED]


def running(job):
    return Job.objects.filter(id=job.id, state=State.LEASED, progress__isnull=False).exists()


def stop(proc):
    assert worker_support.stop(proc, within=15) == 0


@pytest.mark.parametrize("batch", [1, 5])
def test_aborted_job_that_checks_cancelled_ends_cancelled_without_its_child_being_killed(settings, batch):
    # A grace far longer than the wait below: ending cancelled in time means it stopped itself.
    settings.JOBQUEUE = lease_settings(ABORT_CHECK_INTERVAL=0.1, ABORT_GRACE_SECONDS=60)
    job = enqueue("polite", {"seconds": 60})
    proc = start_worker(concurrency=1, batch=batch)
    try:
        wait_for(lambda: running(job), what="the job to start")
        aborting.cancel(job.id, actor="ops", reason="no longer needed")
        wait_for(
            lambda: Job.objects.filter(id=job.id, state=State.CANCELLED).exists(),
            timeout=10,
            what="the job to end cancelled",
        )
        job.refresh_from_db()
        assert (job.lease_owner, job.result, job.cancel_requested_at is not None) == (None, None, True)
        assert types(job) == ABORTED
        requested, cancelled = job.events.order_by("id")[2:]
        assert (requested.worker, requested.message) == ("ops", "no longer needed")
        assert requested.from_state == requested.to_state == State.LEASED
        assert cancelled.from_state == State.LEASED and cancelled.to_state == State.CANCELLED
        assert cancelled.metadata["how"] == "the handler returned after the abort request"
        # The same child goes on serving: no replacement was forked.
        follow = enqueue("echo", {"n": 1})
        wait_for(
            lambda: Job.objects.filter(id=follow.id, state=State.COMPLETED).exists(), what="the next job"
        )
        assert follow.events.get(type=EventType.CLAIMED).worker == cancelled.worker
    finally:
        stop(proc)


@pytest.mark.parametrize("kind", ["stubborn", "spinning"])
def test_aborted_job_that_ignores_it_is_killed_after_the_grace_and_the_child_replaced(fast_abort, kind):
    job = enqueue(kind, {"seconds": 60})
    proc = start_worker(concurrency=1, batch=1)
    try:
        wait_for(lambda: running(job), what="the job to start")
        aborting.cancel(job.id, actor="ops")
        wait_for(
            lambda: Job.objects.filter(id=job.id, state=State.CANCELLED).exists(),
            timeout=15,
            what="the job to end cancelled",
        )
        assert types(job) == ABORTED
        cancelled = job.events.get(type=EventType.CANCELLED)
        assert cancelled.metadata["how"] == "its handler was killed after the abort grace"
        assert cancelled.worker.endswith("/0.1")
        # A new child (generation 2 of slot 0) serves the next job.
        follow = enqueue("echo", {"n": 1})
        wait_for(
            lambda: Job.objects.filter(id=follow.id, state=State.COMPLETED).exists(),
            timeout=15,
            what="the replacement child to run the next job",
        )
        assert follow.events.get(type=EventType.CLAIMED).worker.endswith("/0.2")
        assert proc.is_alive()
    finally:
        stop(proc)


def test_a_job_aborted_while_its_handler_fails_is_cancelled_not_retried(patient_abort):
    # A handler that raises once it is told: still cancelled, with the error kept.
    registry.register("raising", _raise_when_cancelled)
    job = enqueue("raising")
    proc = start_worker(concurrency=1, batch=1)
    try:
        wait_for(lambda: running(job), what="the job to start")
        aborting.cancel(job.id)
        wait_for(
            lambda: Job.objects.filter(id=job.id, state=State.CANCELLED).exists(),
            timeout=10,
            what="the job to end cancelled",
        )
        cancelled = Job.objects.get(id=job.id).events.get(type=EventType.CANCELLED)
        assert cancelled.metadata["how"] == "the handler raised after the abort request"
        assert cancelled.metadata["error"]["message"] == "interrupted"
        assert EventType.FAILED not in types(job)
    finally:
        stop(proc)


def _raise_when_cancelled(payload):
    job = current_job()
    job.progress(1)
    while not job.cancelled():
        time.sleep(0.02)
    raise RuntimeError("interrupted")


@in_process
def test_without_a_supervisor_the_handler_sees_its_abort_from_the_row(settings):
    settings.JOBQUEUE = lease_settings(ABORT_CHECK_INTERVAL=0.05)
    job = enqueue("self_cancelling")

    done = execution.run_one(worker_id="here/0.0")

    assert done.state == State.CANCELLED
    assert types(job) == ABORTED
    # What the aborted attempt printed stays with its event, as on every other ending.
    cancelled = Job.objects.get(id=job.id).events.get(type=EventType.CANCELLED)
    assert "cleaning up before the abort" in cancelled.metadata["output"]["stdout"]


@in_process
def test_cancel_of_a_pending_job_cancels_it_at_once():
    job = enqueue("echo")

    assert aborting.cancel(job.id, actor="ops").state == State.CANCELLED

    assert types(job) == [EventType.ENQUEUED, EventType.CANCELLED]


@in_process
def test_asking_twice_to_abort_writes_one_event_and_a_finished_job_is_refused():
    job = JobFactory(leased=True)

    first = aborting.cancel(job.id)
    again = aborting.cancel(job.id)

    assert first.cancel_requested_at == again.cancel_requested_at is not None
    assert types(job) == [EventType.ABORT_REQUESTED]
    done = JobFactory(state=State.COMPLETED)
    with pytest.raises(InvalidTransition, match="is completed; cannot cancel"):
        aborting.cancel(done.id)


@in_process
def test_a_stale_worker_cannot_settle_an_abort():
    job = JobFactory(leased=True)
    aborting.cancel(job.id)

    assert transitions.abort(job.id, worker_id="someone-else", attempt=1, how="test") is False
    assert transitions.abort(job.id, worker_id="worker-1", attempt=2, how="test") is False
    assert Job.objects.get(id=job.id).state == State.LEASED
    assert transitions.abort(job.id, worker_id="worker-1", attempt=1, how="test") is True
    assert Job.objects.get(id=job.id).state == State.CANCELLED


@in_process
def test_abort_edge_refuses_a_job_whose_abort_was_not_requested():
    job = JobFactory(leased=True)

    assert transitions.abort(job.id, worker_id="worker-1", attempt=1, how="test") is False
    assert Job.objects.get(id=job.id).state == State.LEASED


@in_process
def test_lapsed_lease_of_an_aborted_job_is_recovered_as_cancelled_not_retried():
    job = JobFactory(expired=True)
    aborting.cancel(job.id)

    assert transitions.recover() == [(job.id, State.CANCELLED)]

    job.refresh_from_db()
    assert (job.state, job.lease_owner, job.finished_at is not None) == (State.CANCELLED, None, True)
    assert types(job) == [EventType.ABORT_REQUESTED, EventType.RECOVERED]


@in_process
def test_an_aborted_job_given_back_unstarted_is_cancelled_and_requeue_clears_the_request():
    job = JobFactory(leased=True)
    aborting.cancel(job.id)

    assert transitions.release(job.id, worker_id="worker-1", attempt=1) is True
    assert Job.objects.get(id=job.id).state == State.CANCELLED

    requeued = transitions.requeue(job.id)
    assert (requeued.state, requeued.cancel_requested_at) == (State.PENDING, None)


@in_process
def test_cancel_command_requests_abort_of_a_running_job(capsys):
    job = JobFactory(leased=True)

    call_command("cancel", str(job.id), "--reason", "wrong customer")

    assert "abort requested for job" in capsys.readouterr().out
    assert Job.objects.get(id=job.id).cancel_requested_at is not None
    assert job.events.get().message == "wrong customer"
    with pytest.raises(CommandError, match="does not exist"):
        call_command("cancel", "999999")


@in_process
def test_api_delete_of_a_running_job_answers_202_with_the_abort_requested(admin_client):
    job = JobFactory(leased=True)

    response = admin_client.delete(f"/api/jobs/{job.id}")

    assert response.status_code == 202
    body = response.json()
    assert body["state"] == "leased" and body["cancel_requested_at"] is not None
    assert admin_client.delete(f"/api/jobs/{JobFactory().id}").status_code == 200


@in_process
def test_operations_cancel_action_requests_abort_of_a_running_job():
    running_job, pending_job = JobFactory(leased=True), JobFactory()
    both = Job.objects.filter(id__in=[running_job.id, pending_job.id])

    out = operations.apply_many("cancel", both, actor="admin:op")

    assert out.done == 2
    assert Job.objects.get(id=running_job.id).state == State.LEASED
    assert Job.objects.get(id=running_job.id).cancel_requested_at is not None
    assert Job.objects.get(id=pending_job.id).state == State.CANCELLED
