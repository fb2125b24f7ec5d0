"""The demo, run for real once: its transcript tells each scenario's outcome."""
import os
import subprocess
import sys

from tests.worker_support import ROOT

# Whatever database the suite runs on, the demo makes its own.
env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SQLITE_TEST_NAME")}


def test_demo_tells_the_whole_story_on_a_throwaway_database():
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "demo"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
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
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "demo", "--kind", "email"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2
    assert "give --run DURATION too" in done.stderr
