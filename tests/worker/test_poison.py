"""Poison-pill quarantine with real workers: a job whose worker process dies under it
(os._exit) or is killed for its timeout counts crashes apart from its failures, and at
MAX_CRASHES is dead-lettered as "poison" while the worker goes on serving other kinds."""

import pytest

from queue_app import bulk_enqueue, enqueue
from queue_app.models import DeadLetter, Event, EventType, Job, State
from tests.worker_support import lease_settings, start_worker, stop, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _settled(*jobs):
    return not Job.objects.filter(
        id__in=[j.id for j in jobs], state__in=[State.PENDING, State.LEASED]
    ).exists()


def test_a_job_that_kills_its_process_every_time_is_poison_after_three_crashes(settings):
    settings.JOBQUEUE = lease_settings(BACKOFF_BASE=0.001)
    poison = enqueue("crash", {"code": 1}, max_attempts=10, priority=10)
    others = bulk_enqueue([{"kind": "echo", "payload": {"n": n}} for n in range(12)])

    proc = start_worker(concurrency=2, batch=2)
    wait_for(lambda: _settled(poison, *others), timeout=60, what="every job settled")
    assert stop(proc) == 0

    poison.refresh_from_db()
    assert (poison.state, poison.attempts, poison.crashes) == (State.DEAD_LETTER, 3, 3)
    assert DeadLetter.objects.get(job_id=poison.id).reason == "poison"
    assert poison.last_error["type"] == "WorkerCrashed"
    failed = Event.objects.filter(job=poison, type=EventType.FAILED).order_by("id")
    assert [e.metadata["crashes"] for e in failed] == [1, 2]
    dead = Event.objects.get(job=poison, type=EventType.DEAD_LETTERED)
    assert (dead.metadata["reason"], dead.metadata["crashes"]) == ("poison", 3)
    assert Job.objects.filter(id__in=[j.id for j in others], state=State.COMPLETED).count() == 12


def test_timeout_kills_count_as_crashes(settings):
    settings.JOBQUEUE = lease_settings(BACKOFF_BASE=0.001, MAX_CRASHES=2)
    stuck = enqueue("spin", {"seconds": 60}, timeout=0.3, max_attempts=5)
    after = enqueue("echo", {"after": True})

    proc = start_worker(concurrency=1, batch=1, timeout=None)
    wait_for(lambda: _settled(stuck, after), timeout=60, what="both jobs settled")
    assert stop(proc) == 0

    stuck.refresh_from_db()
    assert (stuck.state, stuck.attempts, stuck.crashes) == (State.DEAD_LETTER, 2, 2)
    assert stuck.last_error["type"] == "TimeoutError"
    assert DeadLetter.objects.get(job_id=stuck.id).reason == "poison"
    after.refresh_from_db()
    assert after.state == State.COMPLETED
