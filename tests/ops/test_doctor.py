"""manage.py doctor on a live installation: healthy exits 0, each planted problem is one
line with its fix and exit 1."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from queue_app import engines
from queue_app.models import Event, EventType, Job
from queue_app.ops import doctor
from tests.factories import JobFactory, WorkerFactory

pytestmark = pytest.mark.django_db


def server_findings():
    """What the test database's server itself is found with (this machine's PostgreSQL may
    run with autovacuum off): each test expects these and its own planted ones."""
    return [f"{problem}: {fix}" for problem, fix in engines.of(connection).doctor()]


def planted():
    server = server_findings()
    return [line for line in doctor.findings() if line not in server]


def run_doctor():
    out = StringIO()
    try:
        call_command("doctor", stdout=out)
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, out.getvalue().splitlines()


def test_doctor_on_a_healthy_installation_says_so_and_exits_0():
    JobFactory(leased=True)  # a lease still running is no finding
    WorkerFactory()
    server = server_findings()
    assert run_doctor() == ((1, server) if server else (0, ["healthy: nothing to fix"]))


def test_doctor_finds_an_expired_lease_with_no_live_worker_and_says_to_start_one():
    JobFactory(expired=True)
    code, lines = run_doctor()
    assert code == 1
    assert lines[: len(lines) - len(server_findings())] == [
        "1 leased job(s) have expired leases and no live worker to recover them: "
        "start a worker (manage.py runworker), which takes them back"
    ]


def test_doctor_leaves_an_expired_lease_to_a_live_worker():
    JobFactory(expired=True)
    WorkerFactory()
    assert planted() == []


def test_doctor_names_a_lost_worker():
    lost = WorkerFactory(last_heartbeat=timezone.now() - timedelta(hours=1))
    code, _ = run_doctor()
    assert code == 1
    (line,) = planted()
    assert line.startswith(f"worker {lost.name} is lost (last heartbeat ")
    assert "restart it" in line


@pytest.mark.django_db(transaction=True)
def test_doctor_finds_sqlite_with_synchronous_off():
    if connection.vendor != "sqlite":
        pytest.skip("journal mode and synchronous are SQLite's")
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA synchronous=OFF")
    try:
        (line,) = doctor.findings()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA synchronous=NORMAL")
    assert line.startswith("SQLite synchronous is OFF")


def test_doctor_finds_a_worker_whose_clock_runs_ahead_of_the_database():
    WorkerFactory(name="fast", last_heartbeat=timezone.now() + timedelta(minutes=2))
    (line,) = planted()
    assert line.startswith("worker fast's clock is 1") and line.endswith("sync its host's clock (NTP)")


def test_doctor_finds_autovacuum_disabled_on_the_job_table():
    if connection.vendor != "postgresql":
        pytest.skip("autovacuum is PostgreSQL's")
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE queue_app_job SET (autovacuum_enabled = false)")  # rolled back
    found = doctor.findings()
    assert (
        "autovacuum is disabled on queue_app_job: ALTER TABLE queue_app_job RESET (autovacuum_enabled)"
        in found
    )
    # Only the table it was disabled on (earlier tests may leave the event table dead rows,
    # a finding of its own on a server whose autovacuum is off).
    assert not any(line.startswith("autovacuum is disabled on queue_app_event") for line in found)


def test_doctor_names_unapplied_migrations_first():
    from django.db import connection
    from django.db.migrations.loader import MigrationLoader
    from django.db.migrations.recorder import MigrationRecorder

    # The newest migration, whichever it is: forgetting it leaves it unapplied.
    ((_, latest),) = MigrationLoader(connection).graph.leaf_nodes("queue_app")
    MigrationRecorder.Migration.objects.filter(app="queue_app", name=latest).delete()
    (line,) = doctor.findings()
    assert line == f"1 migration(s) not applied (queue_app.{latest}): run manage.py migrate"


def test_doctor_finds_old_completed_events_that_nothing_prunes(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "DOCTOR_PRUNE_DAYS": 7}
    job = JobFactory(state="completed", finished_at=timezone.now() - timedelta(days=9))
    Event.objects.create(job=job, type=EventType.COMPLETED, at=timezone.now() - timedelta(days=9))
    (line,) = planted()
    assert line.startswith(
        "completed jobs' events go back 9 days, past DOCTOR_PRUNE_DAYS (7), in an event table of about "
    )
    assert line.endswith(
        " rows: nothing prunes them; run manage.py prune --older-than 7d daily (cron or a schedule)"
    )


def test_doctor_finds_the_claim_and_dashboard_queries_on_their_indexes(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "DOCTOR_EXPLAIN_MIN_ROWS": 0}
    if connection.vendor == "mysql":
        pytest.skip("MariaDB's optimizer reads a table of a few rows whole, index or not")
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL enable_seqscan = off")  # as on a large table; rolled back
    assert planted() == []


@pytest.mark.django_db(transaction=True)
def test_doctor_finds_the_claim_planned_without_its_index(settings):
    from queue_app.engines import schema

    settings.JOBQUEUE = {**settings.JOBQUEUE, "DOCTOR_EXPLAIN_MIN_ROWS": 0}
    vendor = connection.vendor
    with connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute("SET enable_seqscan = off")
        cursor.execute("DROP INDEX jq_ready_prio" + (" ON queue_app_job" if vendor == "mysql" else ""))
    try:
        found = [line for line in doctor.findings() if "planned without" in line]
    finally:
        cols = dict(schema.CLAIM_INDEXES_PREFIXED if vendor == "mysql" else schema.CLAIM_INDEXES_PARTIAL)
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE INDEX jq_ready_prio ON queue_app_job {cols['jq_ready_prio']}")
            if vendor == "postgresql":
                cursor.execute("RESET enable_seqscan")
    assert len(found) == 1
    assert found[0].startswith(
        "the claim's seek per priority level is planned without its index jq_ready_prio"
    )
    assert "ANALYZE queue_app_job" in found[0] and "manage.py migrate" in found[0]


@pytest.mark.django_db(transaction=True)
def test_doctor_finds_sqlite_not_in_wal_mode():
    if connection.vendor != "sqlite":
        pytest.skip("journal mode is SQLite's")
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode=DELETE")
    try:
        found = doctor.findings()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode=WAL")
    assert found == [
        'SQLite journal_mode is delete, not wal: add "PRAGMA journal_mode=WAL;" to OPTIONS["init_command"]'
        " (the example settings do)"
    ]


@pytest.mark.django_db(transaction=True)
def test_doctor_finds_a_job_table_mostly_dead_rows(monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("dead tuples are PostgreSQL's")
    from queue_app.engines.postgresql import PostgresEngine

    # A few rows stand in for the ten thousand the check waits for.
    monkeypatch.setattr(PostgresEngine, "DEAD_MIN", 5)
    JobFactory.create_batch(10)
    Job.objects.all().delete()  # committed (autocommit): 10 dead rows, none live
    with connection.cursor() as cursor:
        # The statistics reach pg_stat_user_tables when this backend flushes them.
        cursor.execute("SELECT pg_stat_force_next_flush()")
    found = doctor.findings()
    assert any(
        line.startswith("queue_app_job is ")
        and "% dead rows (" in line
        and line.endswith("VACUUM (ANALYZE) queue_app_job, and lower its autovacuum_vacuum_scale_factor")
        for line in found
    ), found
