"""SQLite on a disk that fills up mid-drain, then frees up again.

The database lives on a small tmpfs of its own (mounting one needs root; skipped
otherwise). A ballast file fills every free byte for a few seconds while a worker drains
one-attempt tasks: every write fails with "database or disk is full" meanwhile. The
worker stays up, waits, and carries on: every job runs once and completes.
"""

import contextlib
import errno
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from django.db import connection

from tests.chaos import harness
from tests.worker_support import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FULL_SECONDS = 3.0


@contextlib.contextmanager
def small_disk(path, size="64m"):
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path):
    """Write zeros to ``path`` until the disk is full."""
    chunk = b"\0" * (1 << 20)
    with open(path, "wb") as f:
        while True:
            try:
                f.write(chunk)
                f.flush()
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return


def states(db):
    with sqlite3.connect(db) as c:
        return dict(c.execute("SELECT state, count(*) FROM queue_app_job GROUP BY state").fetchall())


def test_a_disk_that_fills_up_mid_drain_costs_no_job_and_no_worker(tmp_path):
    if connection.vendor != "sqlite":
        pytest.skip("a full disk is SQLite's fault to meet; the servers' disks are theirs")
    with small_disk(tmp_path / "disk") as disk:
        db, marker = disk / "queue.db", tmp_path / "runs"
        env = {**harness.TASKS_ENV, "DATABASE_URL": f"sqlite:///{db}"}
        subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "migrate", "-v0"], cwd=ROOT, env=_env(env), check=True
        )
        enqueue = (
            "from tests import sample_tasks\n"
            f"for n in range({harness.JOBS}): sample_tasks.mark_once.enqueue({str(marker)!r}, n, seconds=0.005)\n"
        )
        subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "shell", "-c", enqueue],
            cwd=ROOT,
            env=_env(env),
            check=True,
        )
        proc = harness.worker("full", database_url=env["DATABASE_URL"])
        try:
            harness.wait_for_runs(marker, harness.JOBS // 5)
            fill(disk / "ballast")
            time.sleep(FULL_SECONDS)
            assert proc.poll() is None, "the worker exited on a full disk"
            (disk / "ballast").unlink()
            end = time.monotonic() + 120
            while states(db).get("completed", 0) < harness.JOBS and time.monotonic() < end:
                time.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=60)
        final = states(db)

    runs = harness.runs(marker)
    harness.report(
        {
            "scenario": "disk_full",
            "db": "sqlite",
            "jobs": harness.JOBS,
            "executed": len(runs),
            "duplicates": sum(runs.values()) - len(runs),
            "duplicates_explained": 0,
            "stuck": harness.JOBS - final.get("completed", 0),
            "lost": harness.JOBS - len(runs),
            "states": final,
            "kills": 1,
        }
    )
    assert final == {"completed": harness.JOBS}, out
    assert len(runs) == harness.JOBS and set(runs.values()) == {1}, out
    assert proc.returncode == 0, out
    assert "database unavailable" in out and "Traceback" not in out, out


def _env(extra):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBQUEUE_") and k != "SQLITE_TEST_NAME"}
    return {**env, "PYTHONUNBUFFERED": "1", "DEBUG": "1", **extra}
