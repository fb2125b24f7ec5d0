"""A single enqueue outside any transaction (a view's): its job row and its one enqueued
event commit together or not at all, on every engine (SQLite writes it on the driver's
connection, engines/sqlite.py _insert_one; PostgreSQL in one statement)."""

import pytest
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext

from queue_app import enqueue
from queue_app.models import Event, Job

pytestmark = pytest.mark.django_db(transaction=True)

# A trigger that refuses every event row: the job's INSERT has run when it fires.
NO_EVENTS = {
    "sqlite": (
        [
            "CREATE TRIGGER jq_test_no_events BEFORE INSERT ON queue_app_event"
            " BEGIN SELECT RAISE(ABORT, 'no events today'); END"
        ],
        ["DROP TRIGGER jq_test_no_events"],
    ),
    "postgresql": (
        [
            "CREATE FUNCTION jq_test_no_events() RETURNS trigger AS $$"
            " BEGIN RAISE EXCEPTION 'no events today'; END $$ LANGUAGE plpgsql",
            "CREATE TRIGGER jq_test_no_events BEFORE INSERT ON queue_app_event"
            " FOR EACH ROW EXECUTE FUNCTION jq_test_no_events()",
        ],
        ["DROP TRIGGER jq_test_no_events ON queue_app_event", "DROP FUNCTION jq_test_no_events()"],
    ),
    "mysql": (
        [
            "CREATE TRIGGER jq_test_no_events BEFORE INSERT ON queue_app_event FOR EACH ROW"
            " SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'no events today'"
        ],
        ["DROP TRIGGER jq_test_no_events"],
    ),
}


def run(statements):
    with connection.cursor() as cursor:
        for sql in statements:
            cursor.execute(sql)


def test_a_single_enqueue_commits_its_job_and_exactly_one_enqueued_event():
    job = enqueue("echo", {"n": 1}, priority=5, queue_name="mail")
    assert not connection.in_atomic_block
    row = Job.objects.get(id=job.id)
    for field in Job._meta.concrete_fields:
        assert getattr(job, field.attname) == getattr(row, field.attname), field.name
    assert (row.kind, row.payload, row.state, row.priority, row.queue_name) == (
        "echo",
        {"n": 1},
        "pending",
        5,
        "mail",
    )
    events = list(Event.objects.filter(job_id=job.id))
    assert [(e.type, e.from_state, e.to_state) for e in events] == [("enqueued", "", "pending")]
    assert events[0].metadata["queue"] == "mail" and events[0].metadata["priority"] == 5


def test_a_refused_event_leaves_no_job_and_the_connection_usable():
    create, drop = NO_EVENTS[connection.vendor]
    run(create)
    try:
        with pytest.raises(DatabaseError, match="no events today"):
            enqueue("echo", {"n": 1})
        assert not connection.in_atomic_block
    finally:
        run(drop)
    assert Job.objects.count() == 0 and Event.objects.count() == 0
    job = enqueue("echo", {"n": 2})
    assert Job.objects.get().id == job.id
    assert Event.objects.get().job_id == job.id


def test_a_single_enqueue_is_seen_by_djangos_query_log():
    # Debug toolbars and assertNumQueries read this log: while it is on, the enqueue's
    # statements go through Django's cursor.
    with CaptureQueriesContext(connection) as queries:
        job = enqueue("echo")
    assert any("INSERT INTO" in q["sql"] and "queue_app_job" in q["sql"] for q in queries.captured_queries)
    assert Event.objects.filter(job_id=job.id, type="enqueued").count() == 1
