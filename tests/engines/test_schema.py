"""The schema SQL of engines/schema.py: what the migrations built is there, on every database,
and the app's migrations unapply and apply again."""

import os
import subprocess
import sys

import pytest
from django.db import connection

from tests.worker_support import ROOT

CLAIM_INDEXES = {"jq_ready_prio", "jq_ready_queue", "jq_lease_expiry"}


@pytest.mark.django_db
def test_the_claim_indexes_exist_on_the_migrated_database():
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "queue_app_job")

    assert set(constraints) >= CLAIM_INDEXES
    # Partial where the database has partial indexes; led by state on MariaDB, which has none.
    expected_first = "state" if connection.vendor == "mysql" else "priority"
    assert constraints["jq_ready_prio"]["columns"][0] == expected_first


@pytest.mark.django_db
def test_postgresql_indexes_parent_group_and_keys_only_where_they_are_set():
    # A job without them adds no entry to those indexes on any of its transitions
    # (engines/schema.py, 0029); a lookup by a value still seeks them.
    if connection.vendor != "postgresql":
        pytest.skip(
            "only PostgreSQL adds every index's entry on each update; the others skip unchanged columns"
        )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'queue_app_job'"
            " AND (indexdef LIKE '%%(group_id)%%' OR indexdef LIKE '%%(parent_id)%%'"
            " OR indexdef LIKE '%%(idempotency_key varchar_pattern_ops)%%')"
        )
        indexes = dict(cursor.fetchall())
        cursor.execute(
            "EXPLAIN SELECT id FROM queue_app_job WHERE idempotency_key LIKE 'schedule:x:%%' AND parent_id = 1"
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())

    assert len(indexes) == 3, indexes
    for definition in indexes.values():
        column = definition.split("(")[1].split()[0].rstrip(")")
        assert definition.endswith(f"WHERE ({column} IS NOT NULL)"), definition
    assert "Seq Scan" not in plan, plan


@pytest.mark.django_db
def test_idempotency_keys_compare_as_exact_bytes():
    if connection.vendor != "mysql":
        pytest.skip("only MariaDB collates the keys (SQLite and PostgreSQL compare bytes already)")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT collation_name FROM information_schema.columns"
            " WHERE table_schema = DATABASE() AND table_name = 'queue_app_job'"
            " AND column_name IN ('idempotency_key', 'concurrency_key')"
        )
        collations = {row[0] for row in cursor.fetchall()}

    assert collations == {"utf8mb4_nopad_bin"}


def test_the_apps_migrations_unapply_and_apply_again(tmp_path):
    # SQLite alone: unapplying rebuilds the job table there, which drops the indexes Django
    # does not know of (the claim indexes), so this is the database where reversing can break.
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBQUEUE_") and k != "SQLITE_TEST_NAME"}
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'schema.db'}"

    def migrate(*target):
        return subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "migrate", *target, "-v0"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )

    for target in ((), ("queue_app", "zero"), ()):
        done = migrate(*target)
        assert done.returncode == 0, done.stderr[-2000:]
