"""An enqueue with an idempotency key that the database ends to break a deadlock (MariaDB
meets one between concurrent inserts of one unique key) goes again, outside a caller's
transaction; inside one it raises, as the caller's transaction is gone."""

import pytest
from django.db import DatabaseError, OperationalError, connection, transaction

from queue_app import engines, enqueue
from queue_app.core import transitions
from queue_app.models import Event, Job

pytestmark = pytest.mark.django_db(transaction=True)

# The database's own deadlock error, raised by the server itself.
RAISE_DEADLOCK = {
    "postgresql": "DO $$ BEGIN RAISE EXCEPTION 'deadlock' USING ERRCODE = '40P01'; END $$",
    "mysql": "SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213, MESSAGE_TEXT = 'Deadlock found'",
}


def _deadlock():
    with connection.cursor() as cursor:
        cursor.execute(RAISE_DEADLOCK[connection.vendor])


needs_server = pytest.mark.skipif(
    connection.vendor not in RAISE_DEADLOCK, reason="SQLite's writers take turns: no deadlocks"
)


@needs_server
def test_the_engine_tells_a_deadlock_from_other_errors():
    engine = engines.of(connection)
    with pytest.raises(OperationalError) as caught:
        _deadlock()
    assert engine.deadlocked(caught.value)
    with pytest.raises(DatabaseError) as other, connection.cursor() as cursor:
        cursor.execute("SELECT * FROM no_such_table")
    assert not engine.deadlocked(other.value)


@needs_server
def test_a_keyed_enqueue_the_database_deadlocked_goes_again_and_writes_one_job(monkeypatch):
    real, calls = transitions._enqueue_keyed, []

    def first_deadlocks(req, db, now):
        calls.append(req.idempotency_key)
        if len(calls) == 1:
            with transaction.atomic(using=db):
                Job.objects.using(db).exists()
                _deadlock()
        return real(req, db, now)

    monkeypatch.setattr(transitions, "_enqueue_keyed", first_deadlocks)
    job = enqueue("echo", {"n": 1}, idempotency_key="k1")
    assert calls == ["k1", "k1"] and job.was_created
    assert Job.objects.count() == 1 and Event.objects.count() == 1


@needs_server
def test_inside_the_callers_transaction_a_deadlock_is_raised(monkeypatch):
    def deadlocks(req, db, now):
        _deadlock()

    monkeypatch.setattr(transitions, "_enqueue_keyed", deadlocks)
    with pytest.raises(OperationalError), transaction.atomic():
        enqueue("echo", {"n": 1}, idempotency_key="k1")
    assert not Job.objects.exists()
