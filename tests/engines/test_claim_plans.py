"""The claim must use an index (DESIGN.md, Ordering): its statements' plans seek the
claim indexes and never scan the job table, on whichever database the suite runs on."""

import re
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from queue_app import bulk_enqueue, enqueue
from queue_app.core import flow, transitions
from queue_app.models import Event, EventType, Job


def _prepared(cursor, sql):
    """PostgreSQL: the name of the statement psycopg prepared for ``sql`` on this
    connection (engines/postgresql.py prepares the worker's hot statements), or None."""
    cursor.execute("SELECT name, statement FROM pg_prepared_statements WHERE NOT from_sql")
    for name, statement in cursor.fetchall():
        if re.sub(r"\$\d+", "%s", statement) == sql:
            return name
    return None


def _plans(sqls):
    """EXPLAIN each captured statement that reads the job table; return the plan lines.
    On PostgreSQL a prepared statement is explained as it runs (EXPLAIN EXECUTE, the
    parameters as literals): its generic plan once PostgreSQL chose one."""
    out = []
    with connection.cursor() as cursor:
        for sql, params in sqls:
            if connection.vendor == "postgresql":
                name = _prepared(cursor, sql)
                if name is None:
                    cursor.execute("EXPLAIN " + sql, params)
                else:
                    marks = ", ".join(["%s"] * len(params))
                    cursor.execute(f"EXPLAIN EXECUTE {name}({marks})", params)
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


def _claim_explained(wanted, **claim):
    """transitions.claim("w", **claim) in a transaction rolled back after: return its
    jobs, the statements ``wanted(sql)`` picked out, and their plans (_plans)."""
    captured = []

    def capture(execute, sql, params, many, context):
        if wanted(sql):
            captured.append((sql, params))
        return execute(sql, params, many, context)

    with transaction.atomic():
        with connection.execute_wrapper(capture):
            jobs = transitions.claim("w", **claim)
        plans = _plans(captured)
        transaction.set_rollback(True)
    return jobs, captured, plans


def _assert_seeks(plans, *indexes):
    """No plan line scans the whole job table, and each of ``indexes`` is used."""
    text = "\n".join(plans)
    if connection.vendor == "postgresql":
        assert "Seq Scan on queue_app_job" not in text, text
    elif connection.vendor == "mysql":
        # The claim's look at the pause and limit tables (a few rows, usually none) may scan them.
        gates = ("'queue_app_pause'", "'queue_app_kindlimit'")
        job_rows = [line for line in plans if not any(table in line for table in gates)]
        assert not any("'type': 'ALL'" in line for line in job_rows), text
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
        jobs, _, plans = _claim_explained(
            lambda sql: ("queue_app_job" in sql and "levels" in sql) or "priority" in sql,
            limit=10,
            queues=queues,
            aging=30,
            now=now + timedelta(seconds=1),
        )
        assert len(jobs) == 10
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
    jobs, captured, plans = _claim_explained(
        lambda sql: "queue_app_job" in sql, limit=10, aging=30, now=now + timedelta(seconds=1)
    )
    assert len({j.concurrency_key for j in jobs}) == len(jobs) == 10
    assert any("GROUP BY" in sql for sql, _ in captured), "the per-key count was not captured"
    _assert_seeks(plans, "jq_job_state_kind_queue", "jq_ready")


@pytest.mark.django_db(transaction=True)
def test_a_fair_claim_seeks_the_tenant_index_and_never_scans_the_job_table():
    flow.set_limit("echo", fair=True)
    # One tenant's burst, 40 small tenants and keyless jobs, over five priority levels.
    now = _seed_analyzed(
        [{"kind": "echo", "priority": (i % 5) * 10 - 20, "concurrency_key": "big"} for i in range(5000)]
        + [
            {
                "kind": "echo",
                "priority": (i % 5) * 10 - 20,
                "concurrency_key": f"k{i % 40}" if i % 41 else None,
            }
            for i in range(1000)
        ]
    )
    jobs, captured, plans = _claim_explained(
        lambda sql: "queue_app_job" in sql, limit=10, aging=30, now=now + timedelta(seconds=1)
    )
    assert len({j.concurrency_key for j in jobs}) == len(jobs) == 10
    assert any("concurrency_key" in sql and "ORDER BY" in sql for sql, _ in captured), "no fair seek captured"
    assert None in {j.concurrency_key for j in jobs}  # the keyless tenant's seek ran too
    _assert_seeks(plans, "jq_ready_tenant")
    # Each tenant's seek reads the index in order: a sort under it would read the
    # tenant's whole level (PostgreSQL sorts the keyless one unless told the full order).
    assert not re.search(r"Sort Key: j_\d+\.run_at", "\n".join(plans)), "\n".join(plans)


@pytest.mark.django_db(transaction=True)
def test_a_batched_completion_seeks_each_job_by_id():
    # Many jobs leased to other workers: a completion that found its rows through the
    # state index would read all of them for each job it settles (SQLite's planner took
    # that path for UPDATE ... FROM until told otherwise).
    now = _seed_analyzed([{"kind": "echo"} for _ in range(3000)])
    transitions.claim("others", limit=1000, now=now + timedelta(seconds=1))
    transitions.claim("others", limit=1000, now=now + timedelta(seconds=1))
    mine = transitions.claim("w", limit=10, now=now + timedelta(seconds=1))
    captured = []

    def capture(execute, sql, params, many, context):
        if sql.lstrip().upper().startswith(("UPDATE", "WITH")) and "queue_app_job" in sql:
            captured.append((sql, params))
        return execute(sql, params, many, context)

    with transaction.atomic():
        with connection.execute_wrapper(capture):
            done = transitions.complete_many(
                [(job.id, job.attempts, {"n": i}) for i, job in enumerate(mine)], worker_id="w"
            )
        assert done == {job.id for job in mine}
        # Each row got its own result, not another's (one statement, a result per row).
        stored = dict(Job.objects.filter(id__in=done).values_list("id", "result"))
        assert stored == {job.id: {"n": i} for i, job in enumerate(mine)}
        plans = _plans(captured)
        transaction.set_rollback(True)
    assert len(captured) == 1, [sql for sql, _ in captured]  # one statement for the batch
    text = "\n".join(plans)
    if connection.vendor == "postgresql":
        assert "queue_app_job_pkey" in text and "Seq Scan on queue_app_job" not in text, text
    elif connection.vendor == "mysql":
        job_rows = [line for line in plans if "'queue_app_job'" in line]
        assert job_rows and all("'key': 'PRIMARY'" in line for line in job_rows), text
    else:
        assert "SEARCH queue_app_job USING INTEGER PRIMARY KEY" in text, text
        assert "jq_job_state" not in text, text


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements: PostgreSQL's engine")
@pytest.mark.django_db(transaction=True)
def test_the_claim_and_the_batched_completion_are_prepared_once_on_postgresql():
    # Parsed once per connection, not per call (a third of the server's work on a claim);
    # the plans the tests above check are the prepared statements' own (_plans).
    now = _seed_analyzed([{"kind": "echo"} for _ in range(200)])
    for _ in range(3):
        jobs = transitions.claim("w", limit=10, now=now + timedelta(seconds=1))
        assert len(jobs) == 10
        assert transitions.complete_many([(job.id, job.attempts, None) for job in jobs], worker_id="w")
    runs = _prepared_runs("%queue_app_job%")
    assert runs == [3, 3], runs


def _prepared_runs(pattern):
    """How many times each statement this connection prepared whose text is LIKE ``pattern`` ran."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans + custom_plans FROM pg_prepared_statements"
            " WHERE NOT from_sql AND statement LIKE %s",
            [pattern],
        )
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements: PostgreSQL's engine")
@pytest.mark.django_db(transaction=True)
def test_a_single_enqueue_is_one_prepared_statement_on_postgresql():
    # The job row, its event and the NOTIFY: parsed and planned once per connection.
    jobs = [enqueue("echo", {"n": n}) for n in range(3)]
    assert len({job.id for job in jobs}) == 3
    runs = _prepared_runs("%INSERT INTO queue_app_job%pg_notify%")
    assert runs == [3], runs
    assert Event.objects.filter(job_id__in=[job.id for job in jobs], type=EventType.ENQUEUED).count() == 3


@pytest.mark.django_db(transaction=True)
def test_the_claims_lock_step_probes_the_primary_key_even_when_statistics_are_stale():
    """The planner's statistics lag a queue's backlog: ANALYZEd empty, then a burst.
    With them, the lock step (picked) must still fetch its candidates by id, not scan a
    ready index for run_at <= now and filter by id (PostgreSQL chose jq_ready_tenant
    there: 5,000 rows read for 26, 2.6 ms of a 3.6 ms claim of 10)."""
    if connection.vendor != "postgresql":
        pytest.skip("the lock step's plan is PostgreSQL's (SQLite names its index; MariaDB's claim differs)")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE queue_app_job")
    try:
        bulk_enqueue([{"kind": "echo"} for _ in range(5000)])
        jobs, _, plans = _claim_explained(lambda sql: "levels" in sql, limit=10, queues=["default"], aging=30)
    finally:
        # Statistics outlive the test's rows: leave those of a full table, as the other
        # tests here do, not of an empty one (the doctor's plans read them).
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE queue_app_job")
    assert len(jobs) == 10
    text = "\n".join(plans)
    assert "CTE picked" in text, text
    picked = text.split("CTE picked", 1)[1].split("CTE leased", 1)[0]
    assert "jq_ready" not in picked, picked
    assert "queue_app_job_pkey" in picked, picked
