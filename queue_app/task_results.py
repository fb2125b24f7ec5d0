"""django.tasks TaskResults read from our rows, and running a Task job in a worker.

A result's history comes from the job's Event rows: each ``claimed`` event is an
attempt (a ``released`` one gives it back), each ``failed``, ``dead_lettered`` or
``recovered`` event is one failed attempt and becomes one TaskError. The history
spans operator requeues, so ``attempt`` keeps counting after one.
"""
import builtins
import inspect
import logging
from dataclasses import replace

from django.db import router
from django.tasks import TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask
from django.tasks.signals import task_finished, task_started
from django.utils.json import normalize_json

from queue_app import registry, running, validation
from queue_app.exceptions import InvalidJob, UnknownKind
from queue_app.models import Event, EventType, Job, State

log = logging.getLogger("queue_app")

STATUS = {
    State.PENDING: TaskResultStatus.READY,
    State.LEASED: TaskResultStatus.RUNNING,
    State.COMPLETED: TaskResultStatus.SUCCESSFUL,
    State.DEAD_LETTER: TaskResultStatus.FAILED,
    State.CANCELLED: TaskResultStatus.FAILED,
}
ERROR_EVENTS = (EventType.FAILED, EventType.DEAD_LETTERED, EventType.RECOVERED)
HISTORY_EVENTS = (EventType.CLAIMED, EventType.RELEASED, *ERROR_EVENTS)


class LeaseExpired(Exception):
    """The worker running an attempt stopped renewing its lease (it died or hung)."""


def _class_path(type_name):
    """A dotted path TaskError.exception_class can import, from our stored error type."""
    if "." in type_name:
        return type_name
    if isinstance(getattr(builtins, type_name, None), type):
        return f"builtins.{type_name}"
    if type_name == "LeaseExpired":
        return f"{__name__}.LeaseExpired"
    return type_name


def task_error(error):
    """A TaskError from the JSON a failed attempt stored (transitions.error_info)."""
    error = error if isinstance(error, dict) else {"type": "Exception", "message": str(error)}
    type_name = str(error.get("type") or "Exception")
    tb = error.get("traceback") or f"{type_name}: {error.get('message', '')}\n"
    return TaskError(exception_class_path=_class_path(type_name), traceback=tb)


def arguments(job):
    """The (args, kwargs) a Task job's payload holds.

    A follow-up job (chaining.py) also holds its parent's outcome under ``parent``:
    run() hands it to a task that takes a ``parent`` argument.
    """
    payload = job.payload
    if not isinstance(payload, dict) or not set(payload) <= {"args", "kwargs", "parent"}:
        raise TypeError(
            f'job {job.id}: a task payload is {{"args": [...], "kwargs": {{...}}}}, got {payload!r}'
        )
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise TypeError(f"job {job.id}: payload args must be a list and kwargs an object, got {payload!r}")
    return args, kwargs


def _db(job):
    return job._state.db or router.db_for_read(Job)


def _history(job):
    return list(
        Event.objects.using(_db(job)).filter(job_id=job.id, type__in=HISTORY_EVENTS).order_by("id")
    )


def _task_for_job(task, job, alias):
    """The task as this job holds it: the row's priority and queue, read through ``alias``.

    The row's budget and timeout stay on the row (Job.max_attempts, Job.timeout).
    """
    changes = {"backend": alias, "priority": job.priority, "queue_name": job.queue_name}
    for attempt in (changes, {"backend": alias}):
        try:
            return replace(task, **attempt)
        except InvalidTask:
            # Rows an operator edited (a queue this backend does not list) still read.
            continue
    return task


def from_job(job, task, alias, events=None):
    """Build the TaskResult for ``job``, whose kind resolved to ``task``."""
    events = _history(job) if events is None else events
    worker_ids, attempted, errors = [], [], []
    for event in events:
        if event.type == EventType.CLAIMED:
            worker_ids.append(event.worker)
            attempted.append(event.at)
        elif event.type == EventType.RELEASED and worker_ids:
            # Given back before it started: not an attempt.
            worker_ids.pop()
            attempted.pop()
        elif event.type in ERROR_EVENTS:
            errors.append(task_error(event.metadata.get("error")))
    try:
        args, kwargs = arguments(job)
    except TypeError:
        args, kwargs = [], {}  # an edited payload the worker will refuse; still report the job
    status = STATUS[job.state]
    finished = status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)
    result = TaskResult(
        task=_task_for_job(task, job, alias),
        id=str(job.id),
        status=status,
        enqueued_at=job.created_at,
        started_at=attempted[0] if attempted else job.started_at,
        finished_at=job.finished_at if finished else None,
        last_attempted_at=attempted[-1] if attempted else None,
        args=args,
        kwargs=kwargs,
        backend=alias,
        errors=errors,
        worker_ids=worker_ids,
    )
    if job.state == State.COMPLETED:
        object.__setattr__(result, "_return_value", job.result)
    return result


def pending(job, task, alias):
    """The TaskResult of a job just enqueued: ready, no history yet."""
    args, kwargs = arguments(job)
    return TaskResult(
        task=task,
        id=str(job.id),
        status=TaskResultStatus.READY,
        enqueued_at=job.created_at,
        started_at=None,
        finished_at=None,
        last_attempted_at=None,
        args=args,
        kwargs=kwargs,
        backend=alias,
        errors=[],
        worker_ids=[],
    )


# --- running a Task job in a worker --------------------------------------------------------


def _backend_for(task, db):
    """The (alias, backend class) that owns jobs in ``db``; the task's own backend first."""
    from django.tasks import task_backends

    from queue_app.backends import DatabaseBackend

    candidates = [task.backend] + [alias for alias in task_backends.settings if alias != task.backend]
    for alias in candidates:
        try:
            backend = task_backends[alias]
        except Exception:  # noqa: BLE001  a misconfigured alias must not stop the job
            continue
        if isinstance(backend, DatabaseBackend) and backend.database == db:
            return alias, type(backend)
    return task.backend, DatabaseBackend


def run(job, task):
    """Run a claimed Task job: fire task_started and call its function.

    task_finished is not sent here but by finished(), once the caller has recorded the
    outcome, so it carries the status the row really has. ``job`` remembers that its
    task started, for finished() to know.
    """
    args, kwargs = arguments(job)
    if "parent" in job.payload and "parent" not in kwargs and _takes_parent(task):
        kwargs = {**kwargs, "parent": job.payload["parent"]}
    alias, sender = _backend_for(task, _db(job))
    result = from_job(job, task, alias)
    task_started.send(sender=sender, task_result=result)
    job._task_started = (task, alias, sender)
    if task.takes_context:
        # Django's TaskContext plus cancelled() / progress() / set_metadata().
        value = task.call(running.JobTaskContext(task_result=result), *args, **kwargs)
    else:
        value = task.call(*args, **kwargs)
    try:
        return validation.payload(normalize_json(value), "the task's return value")
    except (TypeError, ValueError, InvalidJob):
        # Handed back as it is: recording it fails, and execute() dead-letters the job.
        return value


def _takes_parent(task):
    try:
        return "parent" in inspect.signature(task.func).parameters
    except (TypeError, ValueError):  # no signature to read
        return False


def finished(job, *, state=None, using=None):
    """Send task_finished for a Task job whose attempt run() started in this process,
    after its outcome was recorded: the TaskResult is read back from the row.

    Call it inside the exception handler when the attempt raised, so receivers (and
    Django's logger) see exc_info. Nothing is sent for a job run() did not start.
    """
    started = job.__dict__.pop("_task_started", None)
    if started is not None:
        _send_finished(job.id, *started, state=state, using=using or _db(job))


def finished_elsewhere(job_id, *, using=None):
    """Send task_finished for a Task job whose process died running it (the supervisor
    failed it after a timeout kill or a crash). Return whether it was a Task job."""
    db = using or router.db_for_write(Job)
    kind = Job.objects.using(db).filter(id=job_id).values_list("kind", flat=True).first()
    if kind is None:
        return False
    try:
        task = registry.get(kind)
    except UnknownKind:
        return False
    if not registry.is_task(task):
        return False
    _send_finished(job_id, task, *_backend_for(task, db), using=db)
    return True


def _send_finished(job_id, task, alias, sender, *, state=None, using):
    job = Job.objects.using(using).filter(id=job_id).first()
    if job is None:  # pruned meanwhile: nothing to report
        return
    if state is not None:
        # The state this attempt's outcome wrote: a retry may already have been claimed
        # by another thread, and its RUNNING must not stand in for this attempt's READY.
        job.state = state
    # The outcome is already recorded; a receiver's error must not look like the task's.
    for receiver, response in task_finished.send_robust(sender=sender, task_result=from_job(job, task, alias)):
        if isinstance(response, Exception):
            log.error("task_finished receiver %r failed for job %s", receiver, job_id, exc_info=response)
