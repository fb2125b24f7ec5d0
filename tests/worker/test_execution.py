"""run_one(): claim, run the handler, settle — end to end on the real database."""

import pytest

from queue_app import enqueue
from queue_app.handlers import registry
from queue_app.models import DeadLetter, Event
from queue_app.worker.execution import run_one

pytestmark = pytest.mark.django_db


def test_run_one_completes_a_job_with_the_handlers_return_value():
    job = enqueue("add", {"a": 2, "b": 3})
    done = run_one(worker_id="w")
    assert done.id == job.id
    assert (done.state, done.result) == ("completed", 5)


def test_run_one_returns_none_when_nothing_is_ready():
    assert run_one() is None


def test_a_raising_handler_fails_the_attempt_with_type_message_and_traceback():
    job = enqueue("boom", {"message": "kaput"}, max_attempts=2)
    done = run_one(worker_id="w")
    assert done.state == "pending" and done.attempts == 1
    assert done.last_error["type"] == "tests.sample_handlers.Boom"
    assert done.last_error["message"] == "kaput"
    assert "raise Boom" in done.last_error["traceback"]
    assert Event.objects.filter(job_id=job.id, type="failed").count() == 1


def test_async_handlers_and_handlers_that_ask_for_the_job_run():
    enqueue("async_echo", {"v": 1})
    assert run_one().result == {"v": 1}
    job = enqueue("with_job", {})
    assert run_one().result == {"id": job.id, "attempt": 1}


def test_unknown_kind_is_dead_lettered_at_once():
    job = enqueue("no-such-kind", {}, max_attempts=5)
    done = run_one()
    assert done.state == "dead_letter"
    assert "no handler registered" in done.last_error["message"]
    assert DeadLetter.objects.get(job_id=job.id).reason == "not_retryable"


def test_a_result_json_cannot_hold_dead_letters_the_job():
    enqueue("unserializable", {})
    done = run_one()
    assert done.state == "dead_letter"
    assert "result" in done.last_error["message"]


def test_handlers_from_settings_are_loaded(settings):
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "HANDLERS": {**settings.JOBQUEUE.get("HANDLERS", {}), "twice": "tests.worker.test_execution.twice"},
    }
    registry.load_configured_handlers()
    enqueue("twice", {"n": 4})
    assert run_one().result == 8


def twice(payload):
    return payload["n"] * 2
