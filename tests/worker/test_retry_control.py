"""Retry control by exception: retry_on, discard_on and a backoff function of (attempt,
exception), the same on a native handler and on a @task, in-process and with a real
worker."""

from datetime import timedelta

import pytest
from django.tasks import TaskResultStatus
from django.utils import timezone

from queue_app import enqueue
from queue_app.handlers import registry
from queue_app.models import DeadLetter, Event, EventType, Job, State
from queue_app.tasks import backend as backends
from queue_app.worker.execution import run_one
from tests.sample_tasks import options_task
from tests.support import event_types
from tests.worker_support import lease_settings, run_worker

pytestmark = pytest.mark.django_db


class Throttled(Exception):
    """A rate-limited API's answer: try again after ``retry_after`` seconds."""

    def __init__(self, retry_after):
        super().__init__(f"429 Too Many Requests, Retry-After: {retry_after}")
        self.retry_after = retry_after


class Unavailable(Exception):
    pass


def retry_after(attempt, exc):
    return getattr(exc, "retry_after", None)


RAISES = {"unavailable": Unavailable, "value": ValueError, "key": KeyError}


def raises(payload):
    """Raise the exception ``payload["raise"]`` names (Throttled: Retry-After ``after``)."""
    if payload["raise"] == "throttled":
        raise Throttled(payload.get("after", 120))
    raise RAISES[payload["raise"]]("from the handler")


@options_task(retry_on=(Unavailable, Throttled), discard_on=(ValueError,), backoff=retry_after)
def call_api(what, after=120):
    if what == "throttled":
        raise Throttled(after)
    raise RAISES[what]("from the task")


@pytest.fixture(autouse=True)
def _handlers():
    with registry.override():
        registry.register(
            "api",
            raises,
            retry_on=(Unavailable, Throttled),
            discard_on=(ValueError,),
            backoff=retry_after,
        )
        registry.register("plain", raises)
        yield


def _enqueue(kind, what, **options):
    if kind == "task":
        return Job.objects.get(id=call_api.using(**options).enqueue(what).id)
    return enqueue(kind, {"raise": what}, **options)


def _dead_letter_reason(job):
    return DeadLetter.objects.get(job_id=job.id).reason


@pytest.mark.parametrize("kind", ["api", "task"])
def test_discard_on_dead_letters_at_once_with_the_reason_in_the_event_and_the_dead_letter(kind):
    job = _enqueue(kind, "value", max_attempts=5)

    assert run_one().state == State.DEAD_LETTER

    job.refresh_from_db()
    assert job.attempts == 1
    assert _dead_letter_reason(job) == "discarded: ValueError"
    dead = Event.objects.get(job=job, type=EventType.DEAD_LETTERED)
    assert dead.metadata["reason"] == "discarded: ValueError"
    assert dead.metadata["error"]["type"] == "ValueError"


@pytest.mark.parametrize("kind", ["api", "task"])
def test_an_exception_outside_retry_on_dead_letters_at_once(kind):
    job = _enqueue(kind, "key", max_attempts=5)

    assert run_one().state == State.DEAD_LETTER

    job.refresh_from_db()
    assert (job.attempts, _dead_letter_reason(job)) == (1, "not in retry_on: KeyError")
    assert event_types(job) == [EventType.ENQUEUED, EventType.CLAIMED, EventType.DEAD_LETTERED]


@pytest.mark.parametrize("kind", ["api", "task"])
def test_a_retry_after_from_the_backoff_function_sets_the_retry_run_at(kind):
    job = _enqueue(kind, "throttled", max_attempts=5)
    before = timezone.now()

    assert run_one().state == State.PENDING

    job.refresh_from_db()
    assert before + timedelta(seconds=119) < job.run_at < timezone.now() + timedelta(seconds=121)
    failed = Event.objects.get(job=job, type=EventType.FAILED)
    assert failed.metadata["delay"] == 120.0


@pytest.mark.parametrize("kind", ["api", "task"])
def test_a_backoff_function_returning_none_leaves_the_default_backoff(kind):
    job = _enqueue(kind, "unavailable", max_attempts=5, backoff_base=3)

    assert run_one().state == State.PENDING

    assert Event.objects.get(job=job, type=EventType.FAILED).metadata["delay"] == 3.0  # 3 ** 1


def test_a_kind_without_a_policy_retries_every_exception_as_before():
    job = enqueue("plain", {"raise": "value"}, max_attempts=2, backoff_base=1)

    assert run_one().state == State.PENDING

    assert Event.objects.get(job=job, type=EventType.FAILED).metadata["delay"] == 1.0


def test_a_discarded_tasks_result_reads_failed_with_its_one_error():
    result = call_api.enqueue("value")

    run_one()

    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in result.errors] == [ValueError]


def test_using_keeps_a_tasks_policy():
    copy = call_api.using(priority=5)

    assert (copy.retry_on, copy.discard_on, copy.backoff_function) == (
        (Unavailable, Throttled),
        (ValueError,),
        retry_after,
    )
    assert registry.policy(call_api.module_path).discard_on == (ValueError,)


# --- validated where declared --------------------------------------------------------------


def test_register_refuses_a_bad_retry_on_and_registers_nothing():
    with pytest.raises(TypeError, match="retry_on must be an exception class or a tuple of them"):
        registry.register("bad", raises, retry_on=("ValueError",))
    assert "bad" not in registry.kinds()


def test_the_handler_decorator_refuses_a_bad_option_where_it_is_written():
    with pytest.raises(TypeError, match=r"backoff must be a function of \(attempt, exception\)"):
        registry.handler("bad", backoff="60")
    with pytest.raises(TypeError, match="unexpected keyword argument 'retry'"):
        registry.handler("bad", retry=(KeyError,))


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"discard_on": [1]}, TypeError, "discard_on must be an exception class"),
        ({"retry_on": "KeyError"}, TypeError, "retry_on must be an exception class"),
        ({"backoff": "60"}, Exception, r"or a function of \(attempt, exception\)"),
    ],
)
def test_a_task_with_a_bad_policy_is_refused_at_declaration(options, error, message):
    with pytest.raises(error, match=message):
        options_task(**options)(raises)


def test_a_backoff_function_cannot_be_given_per_call():
    with pytest.raises(TypeError, match="belongs to the task's definition"):
        call_api.using(backoff=retry_after)


def test_with_options_takes_the_policy_too():
    made = backends.with_options(backends.task(raises), retry_on=KeyError, backoff=retry_after)

    assert (made.retry_on, made.backoff_function) == ((KeyError,), retry_after)


# --- a real worker ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_follows_each_kinds_retry_policy(settings):
    settings.JOBQUEUE = lease_settings()
    # Retry-After: 0, so the burst worker sees each retry ready at once.
    retried = enqueue("api", {"raise": "throttled", "after": 0}, max_attempts=3)
    task_retried = Job.objects.get(id=call_api.using(max_attempts=2).enqueue("throttled", after=0).id)
    discarded = enqueue("api", {"raise": "value"}, max_attempts=3)
    outside = enqueue("api", {"raise": "key"}, max_attempts=3)
    task_discarded = Job.objects.get(id=call_api.using(max_attempts=3).enqueue("value").id)

    assert run_worker(burst=True, batch=5, within=60) == 0

    reasons = {
        job.id: (job.state, job.attempts, DeadLetter.objects.get(job_id=job.id).reason)
        for job in Job.objects.all()
    }
    assert reasons == {
        retried.id: (State.DEAD_LETTER, 3, "failed"),
        task_retried.id: (State.DEAD_LETTER, 2, "failed"),
        discarded.id: (State.DEAD_LETTER, 1, "discarded: ValueError"),
        outside.id: (State.DEAD_LETTER, 1, "not in retry_on: KeyError"),
        task_discarded.id: (State.DEAD_LETTER, 1, "discarded: ValueError"),
    }
