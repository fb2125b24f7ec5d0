"""Rules from DESIGN.md that hold across modules: one writer of state and events,
atomic transitions, an index-driven claim, idempotency-key lifetime, lost-lease logging."""

import logging
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from queue_app import bulk_enqueue, enqueue
from queue_app.core import flow, transitions
from queue_app.models import Event, Job, State

APP = Path(__file__).resolve().parent.parent / "queue_app"

# What writes a job's state or an event / dead letter, in Python or in SQL.
WRITES = re.compile(
    r"(?<![.\w])Event\(|Event\.objects(\.using\([^)]*\))?\.(create|bulk_create|update)"
    r"|(?<![.\w])DeadLetter\(|DeadLetter\.objects(\.using\([^)]*\))?\.(create|bulk_create)"
    r"|INSERT INTO queue_app_(event|deadletter)|UPDATE queue_app_job|update\([^)]*\bstate=State\."
)
# The claim's vendor SQL is the claim edge's own (called only from transitions.claim).
ALLOWED = {"transitions.py", "leasing.py", "models.py"}


def test_nothing_outside_transitions_writes_job_state_events_or_dead_letters():
    offenders = []
    for path in sorted(APP.rglob("*.py")):
        if path.name in ALLOWED or "migrations" in path.parts:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if WRITES.search(line) and not line.lstrip().startswith("#"):
                offenders.append(f"{path.relative_to(APP)}:{n}: {line.strip()}")
    assert offenders == []


def test_the_guard_recognises_a_direct_state_write():
    assert WRITES.search("Job.objects.filter(id=1).update(state=State.COMPLETED)")
    assert WRITES.search("Event.objects.using(db).bulk_create(rows)")
    assert WRITES.search("rows.append(Event(job_id=1))")
    assert not WRITES.search("stop = threading.Event()")
    assert WRITES.search('cursor.execute("INSERT INTO queue_app_event (job_id) VALUES (1)")')
    assert not WRITES.search("Job.objects.filter(state=State.PENDING).count()")


@pytest.mark.django_db(transaction=True)
def test_a_transition_whose_event_cannot_be_written_changes_nothing():
    job = enqueue("echo", {})
    transitions.claim("w1")
    # Make the event insert fail inside complete(): the job update must roll back with it.
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "ALTER TABLE queue_app_event ADD CONSTRAINT jq_test_no_completed CHECK (type <> 'completed') NOT VALID"
            )
        elif connection.vendor == "mysql":
            cursor.execute(
                "ALTER TABLE queue_app_event ADD CONSTRAINT jq_test_no_completed CHECK (type <> 'completed')"
            )
        else:
            cursor.execute(
                "CREATE TRIGGER jq_test_no_completed BEFORE INSERT ON queue_app_event "
                "WHEN NEW.type = 'completed' BEGIN SELECT RAISE(ABORT, 'no completed'); END"
            )
    try:
        with pytest.raises(DatabaseError):
            transitions.complete(job.id, worker_id="w1", attempt=1, result="x")
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "sqlite":
                cursor.execute("DROP TRIGGER jq_test_no_completed")
            elif connection.vendor == "mysql":
                cursor.execute("ALTER TABLE queue_app_event DROP CONSTRAINT jq_test_no_completed")
            else:
                cursor.execute("ALTER TABLE queue_app_event DROP CONSTRAINT jq_test_no_completed")
    job.refresh_from_db()
    assert (job.state, job.result, job.lease_owner) == (State.LEASED, None, "w1")
    assert [e.type for e in Event.objects.filter(job_id=job.id).order_by("id")] == ["enqueued", "claimed"]


def _plans(sqls):
    """EXPLAIN each captured statement that reads the job table; return the plan lines."""
    out = []
    with connection.cursor() as cursor:
        for sql, params in sqls:
            if connection.vendor == "postgresql":
                cursor.execute("EXPLAIN " + sql, params)
                out.extend(row[0] for row in cursor.fetchall())
            elif connection.vendor == "mysql":
                if not sql.lstrip().upper().startswith(("SELECT", "(SELECT", "UPDATE", "WITH")):
                    continue
                cursor.execute("EXPLAIN " + sql, params)
                cols = [c[0] for c in cursor.description]
                out.extend(str(dict(zip(cols, row))) for row in cursor.fetchall())
            else:
                cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
                out.extend(row[-1] for row in cursor.fetchall())
    return out


def _seed_analyzed(specs):
    """Enqueue ``specs``, refresh the planner's statistics, and return the time after."""
    bulk_enqueue(specs)
    with connection.cursor() as cursor:
        cursor.execute(
            {"postgresql": "ANALYZE queue_app_job", "mysql": "ANALYZE TABLE queue_app_job"}.get(
                connection.vendor, "ANALYZE"
            )
        )
        if connection.vendor == "mysql":
            cursor.fetchall()
    # After the inserts: on a loaded machine they can take longer than the second of
    # slack the claims give the jobs' run_at.
    return timezone.now()


def _assert_seeks(plans, *indexes):
    """No plan line scans the whole job table, and each of ``indexes`` is used."""
    text = "\n".join(plans)
    if connection.vendor == "postgresql":
        assert "Seq Scan on queue_app_job" not in text, text
    elif connection.vendor == "mysql":
        assert "'type': 'ALL'" not in text, text
    else:
        scans = [
            line for line in plans if re.match(r"SCAN (queue_app_job|j|k|k2)\b", line) and "USING" not in line
        ]
        assert scans == [], text
    for index in indexes:
        assert index in text, text


@pytest.mark.django_db(transaction=True)
def test_the_claim_seeks_indexes_and_never_scans_the_job_table():
    now = _seed_analyzed(
        [
            {"kind": "echo", "priority": (i % 5) * 10 - 20, "queue_name": "a" if i % 3 else "b"}
            for i in range(6000)
        ]
    )
    for queues in (None, ["b"]):
        captured = []

        def capture(execute, sql, params, many, context):
            if ("queue_app_job" in sql and "levels" in sql) or "priority" in sql:
                captured.append((sql, params))
            return execute(sql, params, many, context)

        with transaction.atomic():
            with connection.execute_wrapper(capture):
                jobs = transitions.claim(
                    "w", limit=10, queues=queues, aging=30, now=now + timedelta(seconds=1)
                )
            assert len(jobs) == 10
            plans = _plans(captured)
            transaction.set_rollback(True)
        assert plans, "no claim statement was captured"
        _assert_seeks(plans, "jq_ready")


@pytest.mark.django_db(transaction=True)
def test_a_per_key_claim_seeks_indexes_and_never_scans_the_job_table():
    flow.set_limit("echo", per_key=1)
    now = _seed_analyzed(
        [
            {"kind": "echo", "priority": (i % 5) * 10 - 20, "concurrency_key": f"k{i % 40}"}
            for i in range(6000)
        ]
    )
    # Keys already at their limit: the claim below counts them and excludes them.
    assert len(transitions.claim("w0", limit=10, now=now + timedelta(seconds=1))) == 10
    captured = []

    def capture(execute, sql, params, many, context):
        if "queue_app_job" in sql:
            captured.append((sql, params))
        return execute(sql, params, many, context)

    with transaction.atomic():
        with connection.execute_wrapper(capture):
            jobs = transitions.claim("w", limit=10, aging=30, now=now + timedelta(seconds=1))
        assert len({j.concurrency_key for j in jobs}) == len(jobs) == 10
        plans = _plans(captured)
        transaction.set_rollback(True)
    assert any("GROUP BY" in sql for sql, _ in captured), "the per-key count was not captured"
    _assert_seeks(plans, "jq_job_state_kind_queue", "jq_ready")


@pytest.mark.django_db
def test_an_idempotency_key_keeps_returning_the_finished_job_until_it_is_pruned_or_cancelled():
    job = enqueue("echo", {}, idempotency_key="once")
    transitions.claim("w")
    transitions.complete(job.id, worker_id="w", attempt=1)
    again = enqueue("echo", {}, idempotency_key="once")
    assert (again.id, again.was_created, again.state) == (job.id, False, State.COMPLETED)
    Job.objects.filter(id=job.id).delete()  # prune
    assert enqueue("echo", {}, idempotency_key="once").was_created is True


@pytest.mark.django_db
def test_a_worker_that_lost_its_lease_is_refused_and_it_is_logged(caplog):
    job = enqueue("echo", {})
    transitions.claim("w1")
    Job.objects.filter(id=job.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    transitions.recover()
    with caplog.at_level(logging.WARNING, logger="queue_app"):
        assert transitions.complete(job.id, worker_id="w1", attempt=1) is False
    assert any("lease lost" in r.getMessage() and f"id={job.id}" in r.getMessage() for r in caplog.records)
