"""Connections killed over and over, and a graceful stop mid-drain.

One attempt per job (tests.sample_tasks.mark_once): a job given up on would be a dead
letter, a job run twice a duplicate no event explains. Neither may happen.
"""

import signal
import time

import pytest
from django.db import connection, connections

from tests import sample_tasks
from tests.chaos import harness

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_every_worker_connection_killed_every_second_loses_nothing_and_runs_nothing_twice(tmp_path):
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no connections to kill")
    marker = tmp_path / "runs"
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
    ids = harness.enqueue_marks(sample_tasks.mark_once, marker, harness.JOBS, seconds=0.002)
    for n in range(harness.JOBS, harness.JOBS + overrunning):
        ids[n] = int(sample_tasks.overruns.enqueue(str(marker), n).id)
    procs = [harness.worker("timeouts-a"), harness.worker("timeouts-b")]
    try:
        took = harness.wait_finished(list(ids.values()), timeout=180)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        outs = [p.communicate(timeout=60)[0] for p in procs]

    released = Event.objects.filter(job_id__in=ids.values(), type=EventType.RELEASED).count()
    result = harness.tally(
        "timeout_storm", ids, marker, kills=overrunning, released=released, after_faults_s=round(took, 1)
    )
    harness.check(result)
    assert result["states"] == {"completed": harness.JOBS, "dead_letter": overrunning}, (result, outs)
    assert result["duplicates"] == 0, result
    assert released == 0, (result, outs)
