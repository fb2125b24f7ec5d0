"""The django.tasks backend: enqueue, results, validation, system checks, transactions."""

import threading
from datetime import datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from django.core import checks
from django.db import connections, transaction
from django.db.utils import load_backend
from django.tasks import TaskResultStatus, default_task_backend, task_backends
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils import timezone

from queue_app.core import enqueueing
from queue_app.models import Event, Job
from queue_app.tasks.backend import DatabaseBackend, QueueTask, with_options
from tests import sample_tasks as tasks

BACKEND = "queue_app.backends.DatabaseBackend"


def job_of(result, using="default"):
    return Job.objects.using(using).get(id=int(result.id))


@pytest.fixture
def queues(settings):
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": ["default", "emails"]}}


@pytest.fixture
def enqueued_signals():
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append((sender, task_result.id, task_result.status))

    task_enqueued.connect(receiver, dispatch_uid="test_backends")
    yield seen
    task_enqueued.disconnect(dispatch_uid="test_backends")


def test_default_task_backend_is_ours_with_every_capability():
    assert isinstance(task_backends["default"], DatabaseBackend)
    assert default_task_backend.alias == "default"
    assert default_task_backend.queues == {"default"}
    backend = task_backends["default"]
    assert (backend.supports_defer, backend.supports_async_task) == (True, True)
    assert (backend.supports_get_result, backend.supports_priority) == (True, True)
    assert isinstance(tasks.add, QueueTask)


@pytest.mark.django_db
def test_enqueue_writes_an_ordinary_job_with_the_task_path_and_arguments():
    result = tasks.add.enqueue(2, b=3)
    job = job_of(result)
    assert job.kind == "tests.sample_tasks.add"
    assert job.payload == {"args": [2], "kwargs": {"b": 3}}
    assert (job.queue_name, job.priority, job.state) == ("default", 0, "pending")
    assert job.run_at == job.created_at
    assert Event.objects.filter(job=job, type="enqueued").count() == 1
    assert result.id == str(job.id)
    assert result.status == TaskResultStatus.READY
    assert result.enqueued_at == job.created_at
    assert (result.args, result.kwargs) == ([2], {"b": 3})
    assert result.task is tasks.add
    assert result.backend == "default"
    assert (result.errors, result.worker_ids, result.started_at, result.finished_at) == ([], [], None, None)
    with pytest.raises(ValueError, match="not finished"):
        result.return_value
    # Every field set (it is built field by field), the second call's as the first's.
    assert default_task_backend.get_result(result.id) == result
    again = tasks.add.enqueue(2, b=3)
    assert default_task_backend.get_result(again.id) == again


@pytest.mark.django_db
def test_tuples_in_arguments_are_stored_as_lists():
    result = tasks.echo.enqueue((1, 2), pair=(3, 4))
    assert job_of(result).payload == {"args": [[1, 2]], "kwargs": {"pair": [3, 4]}}
    assert result.args == [[1, 2]]


@pytest.mark.django_db
def test_priority_queue_and_run_after_become_the_jobs_priority_queue_and_run_at(queues):
    later = timezone.now() + timedelta(hours=2)
    result = tasks.add.using(priority=42, queue_name="emails", run_after=later).enqueue(1, 1)
    job = job_of(result)
    assert (job.priority, job.queue_name, job.run_at) == (42, "emails", later)
    assert result.task.run_after == later
    fetched = default_task_backend.get_result(result.id)
    assert (fetched.task.priority, fetched.task.queue_name) == (42, "emails")
    assert fetched == result


@pytest.mark.django_db
def test_get_result_of_a_deferred_task_equals_what_enqueue_returned():
    now = timezone.now()
    # In the future, in the past (it runs at once), in another time zone.
    for run_after in (
        now + timedelta(minutes=5),
        now - timedelta(minutes=5),
        (now + timedelta(hours=1)).astimezone(timezone.get_fixed_timezone(-300)),
    ):
        result = tasks.add.using(run_after=run_after).enqueue(1, 2)
        fetched = default_task_backend.get_result(result.id)
        assert fetched == result
        assert fetched.task.run_after == run_after
        job = job_of(result)
        assert job.run_after == run_after
        assert job.run_at == run_after if run_after > now else job.run_at >= now
    plain = tasks.add.enqueue(1, 2)
    assert default_task_backend.get_result(plain.id) == plain
    assert job_of(plain).run_after is None


@pytest.mark.django_db
def test_a_retry_moves_run_at_but_not_the_run_after_get_result_reports():
    from queue_app.worker.execution import run_one

    asked = timezone.now() - timedelta(seconds=1)
    result = tasks.fail.using(run_after=asked, max_attempts=2).enqueue()
    job = run_one(worker_id="test-host:1:deferred")
    assert (job.state, job.run_after) == ("pending", asked)
    assert job.run_at > job.created_at  # the retry's backoff
    assert default_task_backend.get_result(result.id).task.run_after == asked


@pytest.mark.django_db
def test_task_options_from_the_decorator_become_job_columns():
    job = job_of(tasks.with_extras.enqueue())
    assert (job.max_attempts, job.timeout) == (7, 12.5)


@pytest.mark.django_db
def test_using_sets_our_options_per_call_and_keeps_the_others():
    task = tasks.with_extras.using(max_attempts=2, priority=5)
    assert (task.max_attempts, task.timeout, task.priority) == (2, 12.5, 5)
    job = job_of(task.enqueue())
    assert (job.max_attempts, job.timeout, job.priority) == (2, 12.5, 5)


@pytest.mark.django_db
def test_an_idempotency_key_returns_the_live_job_instead_of_a_second_one():
    first = tasks.add.using(idempotency_key="sum:1").enqueue(1, 2)
    again = tasks.add.using(idempotency_key="sum:1").enqueue(1, 2)
    assert again.id == first.id
    assert Job.objects.filter(kind="tests.sample_tasks.add").count() == 1
    assert job_of(first).idempotency_key == "sum:1"


@pytest.mark.django_db
def test_a_concurrency_key_is_a_per_call_task_option():
    assert (
        job_of(tasks.add.using(concurrency_key="customer:42").enqueue(1, 2)).concurrency_key == "customer:42"
    )
    assert (
        job_of(with_options(tasks.noop, concurrency_key="customer:7").enqueue()).concurrency_key
        == "customer:7"
    )
    assert job_of(tasks.add.enqueue(1, 2)).concurrency_key is None


@pytest.mark.django_db
def test_backend_options_give_defaults_for_max_attempts_and_timeout(settings):
    settings.TASKS = {"default": {"BACKEND": BACKEND, "OPTIONS": {"max_attempts": 9, "timeout": 30}}}
    job = job_of(tasks.add.enqueue(1, 2))
    assert (job.max_attempts, job.timeout) == (9, 30.0)
    # A task's own option beats the backend's default.
    assert job_of(tasks.with_extras.enqueue()).max_attempts == 7


@pytest.mark.django_db
def test_a_stored_default_max_attempts_reaches_a_task_already_enqueued_in_this_process():
    from queue_app.conf import settings as queue_settings
    from queue_app.core import runtime

    before = job_of(tasks.add.enqueue(1, 2)).max_attempts
    runtime.set_value("max-attempts", before + 4)
    # As another process sees it once its read of the table is older than the TTL.
    queue_settings.reload()
    assert job_of(tasks.add.enqueue(1, 2)).max_attempts == before + 4
    runtime.unset("max-attempts")
    assert job_of(tasks.add.enqueue(1, 2)).max_attempts == before


@pytest.mark.django_db
def test_with_options_gives_any_task_our_options():
    plain = tasks.noop
    task = with_options(plain, max_attempts=4, timeout=2)
    assert isinstance(task, QueueTask) and task.func is plain.func
    assert job_of(task.enqueue()).max_attempts == 4
    with pytest.raises(TypeError, match="unknown task option"):
        with_options(plain, retries=4)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: tasks.add.using(priority=101), "priority must be a whole number"),
        (lambda: tasks.add.using(priority=-101), "priority must be a whole number"),
        (lambda: tasks.add.using(priority=1.5), "priority must be a whole number"),
        (lambda: tasks.add.using(queue_name="nope"), "Queue 'nope' is not valid for backend"),
        (lambda: tasks.add.using(max_attempts=0), "max_attempts 0 is out of range"),
        (lambda: tasks.add.using(timeout=-1), "timeout must be > 0"),
        (lambda: tasks.add.using(idempotency_key="k" * 300), "idempotency_key is 300 characters"),
        (lambda: tasks.add.using(concurrency_key="k" * 300), "concurrency_key is 300 characters"),
        (lambda: tasks.add.using(concurrency_key=42), "concurrency_key must be a non-empty string"),
        (lambda: with_options(tasks.noop, concurrency_key=""), "concurrency_key must be a non-empty string"),
        (lambda: tasks.add.using(run_after=datetime(2030, 1, 1)), "run_after must be an aware datetime"),
        # Every field spelled out: Django 6.0's Task has no defaults for them.
        (
            lambda: QueueTask(
                func=tasks.add.func,
                takes_context=True,
                priority=0,
                backend="default",
                queue_name="default",
                run_after=None,
            ),
            "first argument of 'context'",
        ),
    ],
)
def test_validate_task_refuses_what_the_queue_cannot_run(make, message):
    with pytest.raises(InvalidTask, match=message):
        make()


def test_queue_names_the_queue_cannot_store_are_refused(settings):
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": []}}
    with pytest.raises(InvalidTask, match="queue_name 'with space'"):
        tasks.add.using(queue_name="with space")


@pytest.mark.django_db
def test_a_task_validated_elsewhere_is_validated_again_on_enqueue(settings):
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": []}}
    task = tasks.add.using(queue_name="anything")
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": ["default"]}}
    with pytest.raises(InvalidTask, match="Queue 'anything' is not valid"):
        task.enqueue(1, 2)
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_a_non_json_argument_is_refused_and_nothing_is_written():
    with pytest.raises(TypeError, match="tests.sample_tasks.echo: task arguments must be JSON-serializable"):
        tasks.echo.enqueue(object())
    with pytest.raises(TypeError, match="JSON-serializable"):
        tasks.echo.enqueue(when={1, 2})
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_a_tasks_options_are_checked_once_but_again_when_the_settings_change(settings):
    assert job_of(tasks.with_extras.enqueue()).timeout == 12.5
    assert job_of(tasks.add.enqueue(1, 2)).max_attempts == 3
    with pytest.raises(TypeError, match="JSON-serializable"):
        tasks.add.enqueue(object(), 2)  # the arguments, unlike the options, every call
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_TIMEOUT_SECONDS": 10, "DEFAULT_MAX_ATTEMPTS": 9}
    with pytest.raises(InvalidTask, match="timeout 12.5s is more than the limit of 10s"):
        tasks.with_extras.enqueue()
    first, second = tasks.add.enqueue(1, 2), tasks.add.enqueue(3, 4)
    assert [job_of(r).max_attempts for r in (first, second)] == [9, 9]
    assert [job_of(r).payload["args"] for r in (first, second)] == [[1, 2], [3, 4]]


@pytest.mark.django_db
def test_get_result_reads_the_row_back():
    result = tasks.add.enqueue(1, b=2)
    fetched = default_task_backend.get_result(result.id)
    assert fetched.id == result.id
    assert fetched.status == TaskResultStatus.READY
    assert fetched.task == tasks.add
    assert (fetched.args, fetched.kwargs) == ([1], {"b": 2})
    assert fetched.enqueued_at == result.enqueued_at
    assert tasks.add.get_result(result.id).id == result.id
    assert default_task_backend.get_result(int(result.id)).id == result.id


@pytest.mark.django_db
def test_get_result_of_an_unknown_id_raises_task_result_does_not_exist():
    for bad in ("123456789", "not-a-number", ""):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(bad)


@pytest.mark.django_db
def test_get_result_of_a_job_that_is_not_a_task_says_so():
    job = enqueueing.enqueue("echo", {"x": 1})
    with pytest.raises(TaskResultDoesNotExist, match=f"job {job.id} \\(pending\\) is not a task here"):
        default_task_backend.get_result(job.id)


@pytest.mark.django_db
def test_get_result_for_another_task_raises_mismatch():
    from django.tasks.exceptions import TaskResultMismatch

    result = tasks.add.enqueue(1, 2)
    with pytest.raises(TaskResultMismatch):
        tasks.noop.get_result(result.id)


@pytest.mark.django_db
def test_aenqueue_and_aget_result_work_from_async_code():
    async def go():
        result = await tasks.async_add.aenqueue(1, 2)
        fetched = await default_task_backend.aget_result(result.id)
        via_task = await tasks.async_add.aget_result(result.id)
        return result, fetched, via_task

    result, fetched, via_task = async_to_sync(go)()
    assert job_of(result).kind == "tests.sample_tasks.async_add"
    assert fetched.id == via_task.id == result.id
    assert fetched.status == TaskResultStatus.READY


@pytest.mark.django_db
def test_refresh_reloads_the_result_from_the_row():
    result = tasks.add.enqueue(1, 2)
    Job.objects.filter(id=int(result.id)).update(priority=3)  # no state change; refresh must still work
    result.refresh()
    assert result.status == TaskResultStatus.READY
    from queue_app.core import transitions

    transitions.cancel(int(result.id))
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.finished_at is not None


@pytest.mark.django_db
def test_task_enqueued_fires_when_the_enqueue_commits(enqueued_signals, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        result = tasks.add.enqueue(1, 2)
        assert enqueued_signals == []
    assert enqueued_signals == [(DatabaseBackend, result.id, TaskResultStatus.READY)]


@pytest.mark.django_db
def test_an_idempotent_repeat_does_not_fire_task_enqueued(
    enqueued_signals, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        tasks.add.using(idempotency_key="once").enqueue(1, 2)
        tasks.add.using(idempotency_key="once").enqueue(1, 2)
    assert len(enqueued_signals) == 1


# --- several backends, several databases ----------------------------------------------------


@pytest.fixture
def second_alias(settings):
    """A second connection alias on the same test database, so writes through it are real.

    It is registered on the handler, not in DATABASES, so Django's test isolation treats
    it as a dynamically created connection.
    """
    config = dict(connections.settings["default"])
    conn = load_backend(config["ENGINE"]).DatabaseWrapper(config, "second")
    connections._connections.second = conn
    settings.TASKS = {
        "default": {"BACKEND": BACKEND},
        "other": {"BACKEND": BACKEND, "OPTIONS": {"database": "second"}},
    }
    yield "second"
    conn.close()
    delattr(connections._connections, "second")


@pytest.mark.django_db(transaction=True)
def test_options_database_selects_the_alias_jobs_are_written_through(second_alias):
    other = task_backends["other"]
    assert other.database == "second" and task_backends["default"].database == "default"
    with transaction.atomic(using="second"):
        result = tasks.add.using(backend="other").enqueue(1, 2)
        # Written through the second connection: the first sees it only once that commits.
        assert not Job.objects.using("default").filter(id=int(result.id)).exists()
    assert Job.objects.using("default").filter(id=int(result.id)).exists()
    assert result.backend == "other"
    assert other.get_result(result.id).task.backend == "other"
    assert Job.objects.using("second").get(id=int(result.id)).kind == "tests.sample_tasks.add"


def test_an_unknown_database_alias_is_refused_when_writing(settings):
    settings.TASKS = {"default": {"BACKEND": BACKEND, "OPTIONS": {"database": "nowhere"}}}
    from django.utils.connection import ConnectionDoesNotExist

    with pytest.raises(ConnectionDoesNotExist):
        tasks.add.enqueue(1, 2)


# --- system checks --------------------------------------------------------------------------


def check_ids(params):
    return [message.id for message in DatabaseBackend("x", {"BACKEND": BACKEND, **params}).check()]


def test_a_good_configuration_passes_the_checks():
    assert check_ids({}) == []
    options = {"database": "default", "max_attempts": 5}
    assert check_ids({"QUEUES": ["default", "emails"], "OPTIONS": options}) == []
    assert check_ids({"QUEUES": []}) == []


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"QUEUES": "default"}, "queue_app.E002"),
        ({"QUEUES": ["default", 7]}, "queue_app.E002"),
        ({"QUEUES": ["default", "bad name"]}, "queue_app.E003"),
        ({"QUEUES": ["emails"]}, "queue_app.W001"),
        ({"OPTIONS": ["database"]}, "queue_app.E004"),
        ({"OPTIONS": {"colour": "blue"}}, "queue_app.E005"),
        ({"OPTIONS": {"database": "nowhere"}}, "queue_app.E006"),
        ({"OPTIONS": {"max_attempts": 0}}, "queue_app.E007"),
        ({"OPTIONS": {"timeout": "soon"}}, "queue_app.E007"),
    ],
)
def test_checks_report_bad_configuration(params, expected):
    assert expected in check_ids(params)


def test_django_check_framework_runs_the_backend_checks(settings):
    settings.TASKS = {"default": {"BACKEND": BACKEND, "OPTIONS": {"database": "nowhere"}}}
    from django.tasks.checks import check_tasks

    assert check_tasks in checks.registry.registry.get_checks()
    messages = list(check_tasks())
    found = [m for m in messages if m.id == "queue_app.E006"]
    assert found and "TASKS['default']['OPTIONS']['database'] is 'nowhere'" in found[0].msg


def test_checks_report_queue_app_missing_from_installed_apps(settings):
    settings.INSTALLED_APPS = [app for app in settings.INSTALLED_APPS if app != "queue_app"]
    assert "queue_app.E001" in check_ids({})


# --- transactions: what a worker (another connection) sees ---------------------------------


def visible_elsewhere(job_id):
    """Whether a fresh connection in another thread sees the job row."""
    seen = []

    def look():
        try:
            seen.append(Job.objects.filter(id=job_id).exists())
        finally:
            connections.close_all()

    thread = threading.Thread(target=look)
    thread.start()
    thread.join(30)
    return seen[0]


@pytest.mark.django_db(transaction=True)
def test_enqueue_inside_atomic_is_visible_to_workers_only_after_commit(enqueued_signals):
    with transaction.atomic():
        result = tasks.add.enqueue(1, 2)
        assert not visible_elsewhere(int(result.id))
        assert enqueued_signals == []
    assert visible_elsewhere(int(result.id))
    assert [s[1] for s in enqueued_signals] == [result.id]


@pytest.mark.django_db(transaction=True)
def test_enqueue_inside_a_rolled_back_atomic_leaves_nothing(enqueued_signals):
    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():  # noqa: PT012  the enqueue and the rollback are the case
        result = tasks.add.enqueue(1, 2)
        raise Abort
    assert not Job.objects.filter(id=int(result.id)).exists()
    assert not visible_elsewhere(int(result.id))
    assert not Event.objects.exists()
    assert enqueued_signals == []
    with pytest.raises(TaskResultDoesNotExist):
        result.refresh()


# --- backoff as a task option -----------------------------------------------------------------


def backoff_of(job):
    return (job.backoff_base, job.backoff_max, job.backoff_jitter)


@pytest.mark.django_db
def test_a_backoff_dict_from_the_decorator_reaches_the_row():
    assert backoff_of(job_of(tasks.with_backoff.enqueue())) == (5.0, 60.0, False)


@pytest.mark.django_db
def test_using_sets_backoff_per_call_as_a_base_a_dict_or_one_field():
    assert backoff_of(job_of(tasks.with_backoff.using(backoff=3).enqueue())) == (3.0, 60.0, False)
    assert backoff_of(job_of(tasks.add.using(backoff={"max": 90, "jitter": True}).enqueue(1, 2))) == (
        None,
        90.0,
        True,
    )
    assert backoff_of(job_of(tasks.add.using(backoff_max=timedelta(minutes=2)).enqueue(1, 2))) == (
        None,
        120.0,
        None,
    )
    # Untouched by a plain .using(): the task's own backoff stays.
    assert backoff_of(job_of(tasks.with_backoff.using(priority=3).enqueue())) == (5.0, 60.0, False)


@pytest.mark.django_db
def test_with_options_takes_backoff_too():
    task = with_options(tasks.noop, backoff={"base": 4, "max": 30})
    assert (task.backoff_base, task.backoff_max) == (4, 30)
    assert backoff_of(job_of(task.enqueue())) == (4.0, 30.0, None)
    assert backoff_of(job_of(with_options(tasks.noop, backoff_base=1.5).enqueue())) == (1.5, None, None)


@pytest.mark.django_db
def test_backend_options_give_a_default_backoff_that_a_task_overrides(settings):
    settings.TASKS = {"default": {"BACKEND": BACKEND, "OPTIONS": {"backoff": {"base": 6, "max": 100}}}}
    assert backoff_of(job_of(tasks.add.enqueue(1, 2))) == (6.0, 100.0, None)
    assert backoff_of(job_of(tasks.with_backoff.enqueue())) == (5.0, 60.0, False)
    settings.TASKS = {"default": {"BACKEND": BACKEND, "OPTIONS": {"backoff": 8}}}
    assert backoff_of(job_of(tasks.add.enqueue(1, 2))) == (8.0, None, None)


@pytest.mark.django_db
def test_a_task_retries_on_its_own_backoff(settings):
    from queue_app.core import transitions
    from queue_app.models import EventType
    from queue_app.worker.execution import run_one

    settings.JOBQUEUE = {**settings.JOBQUEUE, "BACKOFF_BASE": 2, "BACKOFF_JITTER": False}
    result = tasks.fail.using(backoff={"base": 9, "max": 50}, max_attempts=3).enqueue()
    delays = []
    for _ in range(2):
        job = run_one(worker_id="test-host:1:backoff")
        delays.append(Event.objects.filter(job=job, type=EventType.FAILED).latest("id").metadata["delay"])
        transitions.retry_now(job.id)
    assert int(result.id) == job.id
    assert delays == [9.0, 50.0]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: tasks.add.using(backoff=0.5), "backoff_base 0.5 is out of range 1..100"),
        (lambda: tasks.add.using(backoff="fast"), "backoff must be a number"),
        (lambda: tasks.add.using(backoff={"base": 2, "cap": 9}), "backoff: unknown key"),
        (lambda: tasks.add.using(backoff={"max": 0}), "backoff_max must be > 0"),
        (lambda: tasks.add.using(backoff_max=8 * 24 * 3600), "more than the limit of 604800s"),
        (lambda: tasks.add.using(backoff_jitter="yes"), "backoff_jitter must be true or false"),
        (lambda: with_options(tasks.noop, backoff=1000), "backoff_base 1000 is out of range"),
    ],
)
def test_bad_backoff_task_options_are_refused(make, message):
    with pytest.raises(InvalidTask, match=message):
        make()


@pytest.mark.django_db
def test_a_bad_backend_backoff_is_refused_at_enqueue_and_nothing_is_written(settings):
    settings.TASKS = {"default": {"BACKEND": BACKEND, "OPTIONS": {"backoff": {"base": 500}}}}
    with pytest.raises(InvalidTask, match="backoff_base 500 is out of range"):
        tasks.add.enqueue(1, 2)
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "options",
    [{"backoff": 0}, {"backoff": "x"}, {"backoff": {"bass": 2}}, {"backoff": {"jitter": "on"}}],
)
def test_checks_report_a_bad_backend_backoff(options):
    assert "queue_app.E007" in check_ids({"OPTIONS": options})
    assert check_ids({"OPTIONS": {"backoff": {"base": 3, "max": 60, "jitter": True}}}) == []


# --- the core's other options as task options: unique_for, on_success/on_failure, webhook_url ------


@pytest.mark.django_db
def test_unique_for_dedupes_a_tasks_key_only_within_its_window():
    first = tasks.add.using(idempotency_key="sum:2", unique_for=60).enqueue(1, 2)
    assert (
        tasks.add.using(idempotency_key="sum:2", unique_for=timedelta(minutes=1)).enqueue(1, 2).id == first.id
    )
    Job.objects.filter(id=int(first.id)).update(created_at=timezone.now() - timedelta(seconds=61))
    later = tasks.add.using(idempotency_key="sum:2", unique_for=60).enqueue(1, 2)
    assert later.id != first.id
    assert (job_of(first).idempotency_key, job_of(later).idempotency_key) == (None, "sum:2")


@pytest.mark.django_db
def test_unique_for_without_an_idempotency_key_is_refused_at_enqueue_and_nothing_is_written():
    windowed = tasks.add.using(unique_for=60)  # the key may still come per call
    with pytest.raises(InvalidTask, match="unique_for needs an idempotency_key"):
        windowed.enqueue(1, 2)
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_follow_ups_from_the_decorator_reach_the_row_as_job_templates():
    job = job_of(tasks.double_then_after.enqueue(4))
    assert job.on_success == {
        "kind": "tests.sample_tasks.after",
        "payload": {"args": [], "kwargs": {}},
        "queue_name": "default",
        "priority": 0,
    }
    assert job.on_failure == {
        "kind": "tests.sample_tasks.after",
        "payload": {"args": ["failed"], "kwargs": {}},
    }


@pytest.mark.django_db
def test_a_follow_up_task_takes_its_own_priority_queue_and_options_into_its_template(queues):
    follow = tasks.with_extras.using(
        priority=5, queue_name="emails", backoff={"base": 3, "max": timedelta(minutes=1)}
    )
    job = job_of(tasks.add.using(on_failure=with_options(tasks.noop, on_success=follow)).enqueue(1, 2))
    assert job.on_success is None
    assert job.on_failure == {
        "kind": "tests.sample_tasks.noop",
        "payload": {"args": [], "kwargs": {}},
        "queue_name": "default",
        "priority": 0,
        "on_success": {
            "kind": "tests.sample_tasks.with_extras",
            "payload": {"args": [], "kwargs": {}},
            "queue_name": "emails",
            "priority": 5,
            "max_attempts": 7,
            "timeout": 12.5,
            "backoff_base": 3,
            "backoff_max": 60.0,
        },
    }


@pytest.mark.django_db
def test_a_webhook_url_is_a_task_option(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "WEBHOOK_ALLOWED_HOSTS": ["hooks.example.com"]}
    url = "https://hooks.example.com/jobs"
    assert job_of(tasks.add.using(webhook_url=url).enqueue(1, 2)).webhook_url == url
    assert job_of(with_options(tasks.noop, webhook_url=url).enqueue()).webhook_url == url
    assert job_of(tasks.noop.enqueue()).webhook_url is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"unique_for": -1}, "unique_for must be > 0"),
        ({"unique_for": "an hour"}, "unique_for must be a number of seconds or a timedelta"),
        ({"unique_for": timedelta(days=5000)}, "unique_for .* is more than the limit"),
        ({"on_success": "tests.sample_tasks.after"}, "on_success must be a Task or a job template dict"),
        ({"on_failure": {"payload": {}}}, "on_failure must be a dict with a kind"),
        ({"on_success": {"kind": "no spaces"}}, "on_success: kind 'no spaces' may hold only"),
        ({"on_success": {"kind": "tests.sample_tasks.after", "colour": "red"}}, "on_success: unknown field"),
        (
            {"on_success": {"kind": "tests.sample_tasks.after", "payload": [1]}},
            "on_success.payload must be a dict",
        ),
        ({"on_failure": {"kind": "after", "max_attempts": 0}}, "on_failure: max_attempts 0 is out of range"),
        ({"webhook_url": "ftp://hooks.example.com/x"}, "webhook_url must be http or https"),
        ({"webhook_url": "https://elsewhere.example.org/x"}, "not in the WEBHOOK_ALLOWED_HOSTS setting"),
        ({"webhook_url": 42}, "webhook_url must be a non-empty string"),
    ],
)
def test_bad_core_options_are_refused_as_invalid_tasks(options, message, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "WEBHOOK_ALLOWED_HOSTS": ["hooks.example.com"]}
    with pytest.raises(InvalidTask, match=message):
        tasks.add.using(**options)
    with pytest.raises(InvalidTask, match=message):
        with_options(tasks.noop, **options)
