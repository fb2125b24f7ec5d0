"""A database restart during a drain, twice, much shorter than the lease: it costs nothing.

Every job has one attempt (tests.sample_tasks.mark_once), so a job the worker gave up on
shows as a dead letter and a job run twice needs a recovery to explain it: neither may
happen. The worker rides both out (no exit), retrying the settles it could not write and
starting what it had claimed once the database answers.
"""

import signal

import pytest
from django.db import connection, connections

from queue_app.models import Worker
from tests import sample_tasks
from tests.chaos import harness

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

RESTART_SECONDS = 2.5


def test_two_database_restarts_during_a_drain_lose_no_job_and_run_none_twice(tmp_path):
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no server to restart (its faults are locks and a full disk)")
    marker = tmp_path / "runs"
    ids = {
        n: int(sample_tasks.mark_once.enqueue(str(marker), n, seconds=0.01).id) for n in range(harness.JOBS)
    }
    admin = harness.admin_connection()
    proc = harness.worker("restarted")
    try:
        for share in (0.2, 0.6):
            harness.wait_for_runs(marker, int(harness.JOBS * share))
            harness.restart(admin, RESTART_SECONDS)
        connections.close_all()
        took = harness.wait_finished(list(ids.values()))
        assert proc.poll() is None, "the worker exited during a restart"
    finally:
        admin.close()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)

    result = harness.tally("database_restart", ids, marker, restarts=2, after_faults_s=round(took, 1))
    harness.check(result)
    # One attempt each: nothing given up on (a dead letter), nothing run twice.
    assert result["states"] == {"completed": len(ids)}, (result, out)
    assert result["duplicates"] == 0, (result, out)
    assert proc.returncode == 0, out
    # An expected event: a warning when it starts and when it ends, no tracebacks.
    assert "database unavailable" in out, out
    assert "Traceback" not in out, out
    # Counted where /metrics reads it (jobqueue_db_reconnects_total): at least one per restart.
    assert Worker.objects.get(name="restarted").db_reconnects >= 2, out
