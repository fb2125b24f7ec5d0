"""The demo, run for real once: its transcript tells each scenario's outcome."""

import os
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from tests.worker_support import ROOT

# Whatever database the suite runs on, the demo makes its own (SQLite) one.
env = {
    k: v
    for k, v in os.environ.items()
    if k not in ("DATABASE_URL", "SQLITE_TEST_NAME") and not k.startswith("JOBQUEUE_")
}


@pytest.mark.skipif(
    connection.vendor != "sqlite",
    reason="the demo ignores DATABASE_URL and always runs on its own SQLite database: the SQLite suite runs it",
)
def test_demo_tells_the_whole_story_on_a_throwaway_database():
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "demo"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    for line in [
        "on a throwaway SQLite database",
        "claimed in order of priority: 20 -> 5 -> 0",
        "attempt 1: ConnectionError: flaky upstream (attempt 1); retried after a 2s backoff",
        "attempt 2: completed",
        "attempt 1: WorkerCrashed: the worker process running the job exited with code 70",
        "the supervisor started a new process; attempt 2: completed",
        "claimed not before its run_at; completed",
        "recovered after the lease expired (attempt 1 counted), back to pending",
        "attempt 2 on worker 2: completed",
        "the older priority-0 email ran first",
        "both attempts failed (ValueError: invalid recipient 'nobody'): dead_letter",
        'attempt 1 after the requeue: completed, result {"sent_to": "somebody@example.com"}',
        "pending 0, leased 0, completed 11, dead_letter 0, cancelled 0",
        'jobqueue_events_total{type="recovered"} 1.0',
        "demo finished in",
    ]:
        assert line in out, f"missing {line!r} in:\n{out}"


def test_demo_refuses_kind_without_run():
    # Refused before it makes its database or starts anything.
    with pytest.raises(CommandError, match="give --run DURATION too") as err:
        call_command("demo", "--kind", "email")
    assert err.value.returncode == 2
