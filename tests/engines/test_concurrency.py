"""Real processes against the real database: no job lost, none run twice."""

import multiprocessing
import time

import pytest
from django.db.models import Count

from queue_app import bulk_enqueue, enqueue
from queue_app.core import transitions
from queue_app.models import Event, Job, State
from tests.conftest import run_processes

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PROCESSES = 8
JOBS = 10_000


def _claim_and_complete(worker_id, batch):
    idle_since = None
    while True:
        jobs = transitions.claim(worker_id, limit=batch, lease_seconds=300)
        if not jobs:
            # Empty can mean "others hold the rest": stop only once nothing is pending.
            if not Job.objects.filter(state=State.PENDING).exists():
                return
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since > 60:
                raise RuntimeError("pending jobs left but none could be claimed for 60s")
            time.sleep(0.01)
            continue
        idle_since = None
        for job in jobs:
            assert transitions.complete(job.id, worker_id=worker_id, attempt=job.attempts, result=job.id)


def test_eight_processes_complete_ten_thousand_jobs_each_exactly_once():
    bulk_enqueue([{"kind": "echo", "payload": {"i": i}, "priority": i % 3} for i in range(JOBS)])
    started = time.monotonic()
    codes = run_processes(_claim_and_complete, [(f"w{n}", 25) for n in range(PROCESSES)])
    elapsed = time.monotonic() - started
    assert codes == [0] * PROCESSES
    assert Job.objects.count() == JOBS
    assert Job.objects.filter(state=State.COMPLETED).count() == JOBS
    per_job = Event.objects.values("job_id", "type").annotate(n=Count("id"))
    counts = {}
    for row in per_job:
        counts.setdefault(row["type"], []).append(row["n"])
    # One claim and one completion per job: nobody ran a job twice, none was skipped.
    for type_ in ("enqueued", "claimed", "completed"):
        assert len(counts[type_]) == JOBS and set(counts[type_]) == {1}, type_
    assert set(counts) == {"enqueued", "claimed", "completed"}
    workers = set(Event.objects.filter(type="claimed").values_list("worker", flat=True))
    assert len(workers) > 1  # the work really was shared
    print(f"\n{PROCESSES} processes completed {JOBS} jobs in {elapsed:.1f}s ({JOBS / elapsed:.0f} jobs/s)")


def _enqueue_same_keys(barrier, keys, out):
    ids = []
    for key in keys:
        barrier.wait(timeout=60)
        ids.append(enqueue("echo", {"key": key}, idempotency_key=key).id)
    out.put(ids)


def test_eight_processes_enqueueing_the_same_key_at_once_make_one_job():
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(PROCESSES)
    out = ctx.SimpleQueue()  # writes synchronously: children leave with os._exit
    keys = [f"order-{n}" for n in range(15)]
    codes = run_processes(_enqueue_same_keys, [(barrier, keys, out) for _ in range(PROCESSES)])
    assert codes == [0] * PROCESSES
    results = [out.get() for _ in range(PROCESSES)]
    assert Job.objects.count() == len(keys)
    assert Event.objects.filter(type="enqueued").count() == len(keys)
    for i, key in enumerate(keys):
        ids = {r[i] for r in results}
        assert ids == {Job.objects.get(idempotency_key=key).id}


@pytest.mark.django_db(transaction=True)
def test_a_claimer_holding_its_transaction_locks_only_the_jobs_it_took(vendor):
    if vendor == "sqlite":
        pytest.skip("SQLite serialises writers with the database lock; there are no row locks to share")
    import threading

    from django.db import connections as conns
    from django.db import transaction as tx

    jobs = bulk_enqueue([{"kind": "echo", "priority": 5 - i} for i in range(20)])
    held, release, got = threading.Event(), threading.Event(), {}

    def first():
        try:
            with tx.atomic():
                got["a"] = [j.id for j in transitions.claim("a", limit=1)]
                held.set()
                release.wait(10)
        finally:
            conns.close_all()

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert held.wait(10)
        got["b"] = [j.id for j in transitions.claim("b", limit=2)]
    finally:
        release.set()
        thread.join(10)
    assert got["a"] == [jobs[0].id]
    # The second claimer is not starved by the first one's open transaction.
    assert got["b"] == [jobs[1].id, jobs[2].id]
