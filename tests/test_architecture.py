"""Rules from DESIGN.md that hold across modules: atomic transitions, idempotency-key
lifetime, lost-lease logging. (One writer of state and events, and the layers:
tests/test_layers.py; the index-driven claim's plans: tests/engines/test_claim_plans.py.)"""

import logging

import pytest
from django.db import DatabaseError, connection

from queue_app import enqueue
from queue_app.core import transitions
from queue_app.models import Event, Job, State
from tests.support import lapse


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
    lapse(job)
    transitions.recover()
    with caplog.at_level(logging.WARNING, logger="queue_app"):
        assert transitions.complete(job.id, worker_id="w1", attempt=1) is False
    assert any("lease lost" in r.getMessage() and f"id={job.id}" in r.getMessage() for r in caplog.records)
