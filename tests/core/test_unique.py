"""Uniqueness by state: an enqueue with a unique_key returns the key's newest job while it
is in one of unique_while's states, and otherwise inserts a new job that takes the key;
race-free through the key's row."""

import multiprocessing

import pytest

from queue_app import bulk_enqueue, enqueue
from queue_app.core import transitions
from queue_app.exceptions import InvalidJob
from queue_app.models import AdmissionKey, Event, Job, State
from tests.conftest import run_processes


def claim_and_run(job):
    (claimed,) = transitions.claim("w", limit=1)
    assert claimed.id == job.id
    return claimed


@pytest.mark.django_db
def test_pending_returns_the_waiting_job_and_queues_one_follow_up_while_it_runs():
    first = enqueue("echo", {"n": 1}, unique_key="sync:1", unique_while="pending")
    assert enqueue("echo", {"n": 2}, unique_key="sync:1", unique_while="pending").id == first.id
    running = claim_and_run(first)
    follow_up = enqueue("echo", {"n": 3}, unique_key="sync:1", unique_while="pending")
    assert follow_up.was_created and follow_up.id != first.id
    again = enqueue("echo", {"n": 4}, unique_key="sync:1", unique_while="pending")
    assert again.id == follow_up.id and again.was_created is False
    assert Job.objects.count() == 2 and Job.objects.get(id=follow_up.id).payload == {"n": 3}
    meta = Event.objects.get(job_id=follow_up.id, type="enqueued").metadata
    assert meta["unique_key"] == "sync:1" and meta["after"] == first.id
    transitions.complete(first.id, worker_id="w", attempt=running.attempts)
    assert enqueue("echo", unique_key="sync:1", unique_while="pending").id == follow_up.id


@pytest.mark.django_db
def test_active_the_default_returns_the_running_job_too_and_a_finished_one_gives_up_the_key():
    first = enqueue("echo", unique_key="k")
    running = claim_and_run(first)
    assert enqueue("echo", unique_key="k").id == first.id
    transitions.complete(first.id, worker_id="w", attempt=running.attempts)
    second = enqueue("echo", unique_key="k", unique_while=("pending", "leased"))
    assert second.was_created and second.id != first.id


@pytest.mark.django_db
def test_states_beyond_the_live_ones_keep_the_key_after_the_job_ends():
    first = enqueue("echo", unique_key="once", unique_while=["pending", "leased", "completed"])
    running = claim_and_run(first)
    transitions.complete(first.id, worker_id="w", attempt=running.attempts)
    assert enqueue("echo", unique_key="once", unique_while=["pending", "leased", "completed"]).id == first.id
    transitions_cancelled = enqueue("echo", unique_key="c", unique_while="pending")
    transitions.cancel(transitions_cancelled.id)
    assert enqueue("echo", unique_key="c", unique_while="pending").id != transitions_cancelled.id


@pytest.mark.django_db
def test_bulk_enqueue_applies_the_key_within_the_batch():
    jobs = bulk_enqueue([{"kind": "echo", "unique_key": "b", "unique_while": "pending"}] * 3)
    assert len({j.id for j in jobs}) == 1 and Job.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"unique_while": "pending"}, "unique_while"),
        ({"unique_key": "k", "unique_while": "running"}, "unique_while"),
        ({"unique_key": "k", "unique_while": []}, "unique_while"),
        ({"unique_key": "k", "idempotency_key": "i"}, "unique_key"),
        ({"unique_key": "k", "run_after": 5}, "unique_key"),
        ({"unique_key": ""}, "unique_key"),
    ],
)
def test_bad_unique_options_are_refused_and_nothing_is_written(options, field):
    with pytest.raises(InvalidJob) as exc:
        enqueue("echo", **options)
    assert exc.value.field == field
    assert not Job.objects.exists() and not AdmissionKey.objects.exists()


PROCESSES = 8


def _enqueue_at_once(barrier, out):
    barrier.wait(timeout=60)
    out.put(enqueue("echo", unique_key="nightly", unique_while="pending").id)


@pytest.mark.django_db(transaction=True)
def test_eight_processes_enqueueing_one_unique_key_at_once_make_one_job_and_one_follow_up():
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(PROCESSES), ctx.SimpleQueue()
    assert run_processes(_enqueue_at_once, [(barrier, out)] * PROCESSES) == [0] * PROCESSES
    first = Job.objects.get()
    assert {out.get() for _ in range(PROCESSES)} == {first.id}
    claim_and_run(first)
    assert run_processes(_enqueue_at_once, [(barrier, out)] * PROCESSES) == [0] * PROCESSES
    follow_up = Job.objects.get(state=State.PENDING)
    assert {out.get() for _ in range(PROCESSES)} == {follow_up.id}
    assert Job.objects.count() == 2
