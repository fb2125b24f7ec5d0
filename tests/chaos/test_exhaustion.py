"""Connections exhausted: the worker's database role may open a few connections, and
something else holds all of them.

At start the worker is refused (it waits, logging once, and starts when a connection
frees up: no exit, no crash loop); mid-drain its connections are cut while every slot is
taken for 2.5 s (it waits, then carries on). One attempt per job: nothing lost, nothing
run twice.
"""

import signal
import time

import pytest
from django.db import connection, connections

from tests import sample_tasks
from tests.chaos import harness
from tests.worker_support import database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ROLE = "jq_chaos_limited"
SLOTS = 8


def limited_role(admin):
    """A role (user) that may hold SLOTS connections, with rights on the test database."""
    name = connection.settings_dict["NAME"]
    if connection.vendor == "postgresql":
        exists = admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [ROLE]).fetchone()
        if not exists:
            admin.execute(f"CREATE ROLE {ROLE} LOGIN")
        admin.execute(f"ALTER ROLE {ROLE} CONNECTION LIMIT {SLOTS}")
        with connection.cursor() as c:  # grants live in the test database itself
            c.execute(f"GRANT ALL ON SCHEMA public TO {ROLE}")
            c.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {ROLE}")
            c.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {ROLE}")
    else:
        cur = admin.cursor()
        cur.execute(f"CREATE USER IF NOT EXISTS '{ROLE}'@'%' WITH MAX_USER_CONNECTIONS {SLOTS}")
        cur.execute(f"ALTER USER '{ROLE}'@'%' WITH MAX_USER_CONNECTIONS {SLOTS}")
        cur.execute(f"GRANT ALL ON `{name}`.* TO '{ROLE}'@'%'")
    return database_url().replace(f"//{connection.settings_dict['USER']}@", f"//{ROLE}@", 1)


def hog(n, patience=0.0):
    """Open ``n`` connections as the limited role; return them. With ``patience``, keep
    trying that long for the slots a worker holds as it reconnects (then hold what we got)."""
    s = connection.settings_dict
    held, end = [], time.monotonic() + patience
    while len(held) < n:
        try:
            if connection.vendor == "postgresql":
                import psycopg

                conn = psycopg.connect(
                    host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, user=ROLE, dbname=s["NAME"]
                )
            else:
                import MySQLdb

                conn = MySQLdb.connect(
                    host=s["HOST"] or "127.0.0.1", port=int(s["PORT"] or 3306), user=ROLE, db=s["NAME"]
                )
        except Exception:
            if time.monotonic() > end:
                if not patience:
                    raise
                return held
            time.sleep(0.01)
            continue
        held.append(conn)
    return held


def release(held):
    for conn in held:
        conn.close()
    held.clear()


def test_exhausted_connections_at_start_and_mid_drain_cost_no_job_and_no_worker_exit(tmp_path):
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no connections to exhaust")
    marker = tmp_path / "runs"
    ids = harness.enqueue_marks(sample_tasks.mark_once, marker, harness.JOBS, seconds=0.01)
    admin = harness.admin_connection()
    url = limited_role(admin)
    held = hog(SLOTS)
    proc = harness.worker("starved", database_url=url)
    try:
        before = harness.output_until(proc, "the database refused the start", timeout=60)
        time.sleep(1.0)
        assert proc.poll() is None, before  # refused, and still there
        release(held)
        harness.wait_for_runs(marker, harness.JOBS // 5)
        # Mid-drain: cut the worker's connections and take every slot for 2.5 s.
        harness.cut(admin)
        held = hog(SLOTS, patience=1.0)
        time.sleep(2.5)
        release(held)
        connections.close_all()
        took = harness.wait_finished(list(ids.values()))
        assert proc.poll() is None, "the worker exited"
    finally:
        release(held)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        admin.close()

    result = harness.tally("connections_exhausted", ids, marker, kills=2, after_faults_s=round(took, 1))
    harness.check(result)
    assert result["states"] == {"completed": len(ids)}, (result, out)
    assert result["duplicates"] == 0, (result, out)
    assert proc.returncode == 0, out
