"""Ordered keys on real worker processes sharing one database: each key's jobs start in
enqueue order and never overlap; a blocking key waits behind its dead letter; concurrent
enqueues with one key line up in one chain."""

import itertools
import multiprocessing
import random

import pytest
from django.db import connections

from queue_app import enqueue
from queue_app.core import transitions
from queue_app.models import Job, State
from tests import worker_support

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

KEYS = ("acct:1", "acct:2", "acct:3")


def ended(ids):
    return lambda: not Job.objects.filter(id__in=ids).exclude(state__in=["completed", "dead_letter"]).exists()


def workers(n=2):
    return [
        worker_support.start_worker(concurrency=2, batch=5, poll=0.02, queues=("default",)) for _ in range(n)
    ]


def stop_all(procs):
    for proc in procs:
        assert worker_support.stop(proc, within=60) == 0


def in_line(key):
    """The key's jobs in enqueue order, each one's start after the one before finished."""
    jobs = list(Job.objects.filter(ordering_key=key).order_by("id"))
    for before, after in itertools.pairwise(jobs):
        assert after.started_at >= before.finished_at, (before.id, after.id)
    return jobs


def test_four_workers_over_three_keys_run_each_keys_jobs_in_enqueue_order_and_never_together():
    rnd = random.Random(16)
    ids = []
    for _ in range(20):
        for key in KEYS:
            # Priorities that would reorder them without the key.
            job = enqueue("sleepy", {"seconds": 0.01}, ordering_key=key, priority=rnd.randint(-5, 5))
            ids.append(job.id)
    procs = workers()  # two supervisors of two children each: four processes
    worker_support.wait_for(ended(ids), timeout=240, what="every ordered job to end")
    stop_all(procs)
    for key in KEYS:
        jobs = in_line(key)
        assert [j.state for j in jobs] == [State.COMPLETED] * 20


def test_a_blocking_key_waits_behind_its_dead_letter_while_the_other_keys_run(tmp_path):
    marker = str(tmp_path / "fails-once")
    blocked = [enqueue("echo", {"n": 0}, ordering_key="blocked", ordering_blocks=True)]
    dead = enqueue(
        "flaky", {"path": marker, "fails": 1}, ordering_key="blocked", ordering_blocks=True, max_attempts=1
    )
    blocked += [enqueue("echo", {"n": n}, ordering_key="blocked", ordering_blocks=True) for n in range(1, 6)]
    free = [enqueue("echo", {"n": n}, ordering_key="free") for n in range(10)]
    procs = workers(n=1)
    worker_support.wait_for(
        ended([j.id for j in free] + [dead.id]), timeout=120, what="the free key and the dead letter"
    )
    assert Job.objects.get(id=dead.id).state == State.DEAD_LETTER
    assert Job.objects.get(id=blocked[1].id).depends["held"] is True
    assert set(Job.objects.filter(id__in=[j.id for j in blocked[1:]]).values_list("state", flat=True)) == {
        State.WAITING
    }
    transitions.requeue(dead.id)  # its second run succeeds
    ids = [j.id for j in blocked] + [dead.id]
    worker_support.wait_for(ended(ids), timeout=120, what="the unblocked key")
    stop_all(procs)
    jobs = in_line("blocked")
    assert [j.state for j in jobs] == [State.COMPLETED] * 7
    in_line("free")


def _enqueue_many(key, n, start):
    connections.close_all()
    start.wait()
    for i in range(n):
        enqueue("echo", {"i": i}, ordering_key=key)
    connections.close_all()


def test_concurrent_enqueues_with_one_key_line_up_in_one_chain():
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    connections.close_all()
    procs = [ctx.Process(target=_enqueue_many, args=("race", 15, start)) for _ in range(4)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    jobs = list(Job.objects.filter(ordering_key="race").order_by("id"))
    assert len(jobs) == 60
    # One line in id order: each job waits for exactly the one before it.
    assert [j.depends and j.depends["after"] for j in jobs[1:]] == [j.id for j in jobs[:-1]]
    assert sum(j.state == State.PENDING for j in jobs) == 1
