"""Connections killed over and over, and a graceful stop mid-drain.

One attempt per job (tests.sample_tasks.mark_once): a job given up on would be a dead
letter, a job run twice a duplicate no event explains. Neither may happen.
"""

import signal
import time

import pytest
from django.db import connection, connections, transaction

from tests import sample_tasks
from tests.chaos import harness

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_every_worker_connection_killed_every_second_loses_nothing_and_runs_nothing_twice(tmp_path):
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no connections to kill")
    marker = tmp_path / "runs"
    # One commit for the lot, not one per job (a disk flush each on PostgreSQL and MariaDB):
    # the workers start after it.
    with transaction.atomic():
        ids = harness.enqueue_marks(sample_tasks.mark_once, marker, harness.JOBS, seconds=0.01)
    admin = harness.admin_connection()
    proc = harness.worker("storm")
    rounds = 0
    try:
        end = time.monotonic() + 120
        while time.monotonic() < end and (
            rounds < 2 or sum(harness.runs(marker).values()) < harness.JOBS * 0.9
        ):
            time.sleep(1.0)
            harness.cut(admin)
            rounds += 1
        connections.close_all()
        took = harness.wait_finished(list(ids.values()))
        assert proc.poll() is None
    finally:
        admin.close()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)

    result = harness.tally("backend_kill_storm", ids, marker, kills=rounds, after_faults_s=round(took, 1))
    harness.check(result)
    assert rounds >= 2
    assert result["states"] == {"completed": len(ids)}, (result, out)
    assert result["duplicates"] == 0, (result, out)
    assert proc.returncode == 0, out


def test_sigterm_mid_drain_then_a_restart_finishes_every_job_once(tmp_path):
    marker = tmp_path / "runs"
    with transaction.atomic():
        ids = harness.enqueue_marks(sample_tasks.mark_once, marker, harness.JOBS, seconds=0.005)
    stops = 0
    for share in (0.3, 0.6):
        proc = harness.worker(f"graceful-{stops}")
        harness.wait_for_runs(marker, int(harness.JOBS * share))
        proc.send_signal(signal.SIGTERM)  # finish the running jobs, give the claimed back
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        stops += 1
    proc = harness.worker("graceful-last")
    try:
        took = harness.wait_finished(list(ids.values()))
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)

    result = harness.tally("sigterm_mid_drain", ids, marker, kills=stops, after_faults_s=round(took, 1))
    harness.check(result)
    assert result["states"] == {"completed": len(ids)}, (result, out)
    assert result["duplicates"] == 0, (result, out)


def test_a_timeout_storm_beside_quick_jobs_releases_nothing_and_runs_each_once(tmp_path):
    """Tasks that overrun their 1 s timeout, mixed in among quick ones: each overrun costs
    a kill, and the killed child's claimed-but-unstarted jobs go to its replacement, not
    back to the queue (no `released` events, no second claims)."""
    from queue_app.models import Event, EventType

    marker = tmp_path / "runs"
    overrunning = max(4, harness.JOBS // 150)
    with transaction.atomic():
        ids = harness.enqueue_marks(sample_tasks.mark_once, marker, harness.JOBS, seconds=0.002)
        for n in range(harness.JOBS, harness.JOBS + overrunning):
            ids[n] = int(sample_tasks.overruns.enqueue(str(marker), n).id)
    procs = [harness.worker("timeouts-a"), harness.worker("timeouts-b")]
    try:
        took = harness.wait_finished(list(ids.values()), timeout=180)
    finally:
        outs = harness.stop_all(procs)

    released = Event.objects.filter(job_id__in=ids.values(), type=EventType.RELEASED).count()
    result = harness.tally(
        "timeout_storm", ids, marker, kills=overrunning, released=released, after_faults_s=round(took, 1)
    )
    harness.check(result)
    assert result["states"] == {"completed": harness.JOBS, "dead_letter": overrunning}, (result, outs)
    assert result["duplicates"] == 0, result
    assert released == 0, (result, outs)


def test_a_retry_storm_runs_each_job_exactly_its_attempts_and_no_more(tmp_path):
    """Half the jobs fail twice before they succeed, a quarter fail every attempt, all with
    a 1 s backoff, beside quick jobs: thousands of retries churn the claim index at once.
    Each job runs exactly as often as its attempts say, the hopeless ones are dead letters
    after exactly four runs, and nothing is lost or left behind."""
    from queue_app.models import Event, EventType, Job

    marker = tmp_path / "runs"
    flaky, hopeless = harness.JOBS // 2, harness.JOBS // 4
    ids = {}
    with transaction.atomic():
        for n in range(harness.JOBS):
            failures = 2 if n < flaky else 4 if n < flaky + hopeless else 0
            ids[n] = int(sample_tasks.mark_flaky.enqueue(str(marker), n, failures).id)
    procs = [harness.worker("retries-a"), harness.worker("retries-b")]
    try:
        took = harness.wait_finished(list(ids.values()), timeout=180)
    finally:
        outs = harness.stop_all(procs)

    failed = Event.objects.filter(job_id__in=ids.values(), type=EventType.FAILED).count()
    result = harness.tally("retry_storm", ids, marker, kills=0, failed=failed, after_faults_s=round(took, 1))
    harness.check(result)
    executed = harness.runs(marker)
    attempts = dict(Job.objects.filter(id__in=ids.values()).values_list("id", "attempts"))
    expected = {n: 3 if n < flaky else 4 if n < flaky + hopeless else 1 for n in ids}
    assert {n: executed[n] for n in ids} == expected, outs
    assert {n: attempts[ids[n]] for n in ids} == expected
    assert result["states"] == {"completed": harness.JOBS - hopeless, "dead_letter": hopeless}, (result, outs)
    assert failed == 2 * flaky + 3 * hopeless  # a last failure is `dead_lettered`, not `failed`


@pytest.mark.parametrize("cap", [1, None], ids=["capped", "uncapped"])
def test_a_stuck_kind_in_a_stream_of_quick_jobs_runs_each_once(tmp_path, cap):
    """The README's advice for stuck jobs, measured: a steady stream of quick jobs with
    every tenth an overrun of its 1 s timeout, with the overrunning kind limited to one
    leased job (a KindLimit, as `manage.py limits ... --concurrency 1` writes) and without.
    The quick jobs' enqueue-to-claim times are printed (p50, p99) for the two side by
    side, not asserted: this machine is shared."""
    from queue_app.models import Event, EventType, Job, KindLimit

    marker = tmp_path / "runs"
    if cap:
        KindLimit.objects.create(kind=sample_tasks.overruns.module_path, concurrency=cap)
    # Every tenth overruns for 1 s and, capped, they run one at a time, a second each: 100
    # at CI's size (JOBQUEUE_CHAOS_JOBS=300, 10 overruns), 600 at most (make chaos's).
    total = min(max(100, harness.JOBS // 3), 600)
    stuck = set(range(5, total, 10))
    procs = [harness.worker("stream-a"), harness.worker("stream-b")]
    ids = {}
    try:
        harness.registered("stream-a", "stream-b")
        for n in range(total):
            task = sample_tasks.overruns if n in stuck else sample_tasks.mark_once
            ids[n] = int(task.enqueue(str(marker), n).id)
            time.sleep(0.02)
        took = harness.wait_finished(list(ids.values()), timeout=180)
    finally:
        outs = harness.stop_all(procs)

    quick_ids = [ids[n] for n in range(total) if n not in stuck]
    created = dict(Job.objects.filter(id__in=quick_ids).values_list("id", "created_at"))
    claimed = Event.objects.filter(job_id__in=quick_ids, type=EventType.CLAIMED).values_list("job_id", "at")
    waits = sorted((at - created[job_id]).total_seconds() * 1000 for job_id, at in claimed)
    pickup = {
        "quick_pickup_p50_ms": round(waits[len(waits) // 2], 1),
        "quick_pickup_p99_ms": round(waits[int(len(waits) * 0.99) - 1], 1),
    }
    name = f"timeout_stream_{'capped' if cap else 'uncapped'}"
    result = harness.tally(name, ids, marker, kills=len(stuck), after_faults_s=round(took, 1), **pickup)
    harness.check(result)
    assert len(waits) == len(quick_ids)  # one claim each: none released and re-claimed
    assert result["states"] == {"completed": len(quick_ids), "dead_letter": len(stuck)}, (result, outs)
    assert result["duplicates"] == 0, result
