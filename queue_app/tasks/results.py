"""django.tasks TaskResults read from our rows, and running a Task job in a worker.

A result's history comes from the job's Event rows: each ``claimed`` event is an
attempt (a ``released`` one gives it back), each ``failed``, ``dead_lettered`` or
``recovered`` event is one failed attempt and becomes one TaskError. The history
spans operator requeues, so ``attempt`` keeps counting after one.

A worker does not read that history for a job's first attempt (running()): the claim
that leased it is its only history event, and the row holds the rest.
"""

import builtins
import logging
from dataclasses import fields, replace

from django.core.signals import setting_changed
from django.db import router
from django.tasks import TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask

from queue_app.models import Event, EventType, Job, State

log = logging.getLogger("queue_app")

STATUS = {
    State.WAITING: TaskResultStatus.READY,
    State.PENDING: TaskResultStatus.READY,
    State.LEASED: TaskResultStatus.RUNNING,
    State.COMPLETED: TaskResultStatus.SUCCESSFUL,
    State.DEAD_LETTER: TaskResultStatus.FAILED,
    State.CANCELLED: TaskResultStatus.FAILED,
}
ERROR_EVENTS = (EventType.FAILED, EventType.DEAD_LETTERED, EventType.RECOVERED)
HISTORY_EVENTS = (EventType.CLAIMED, EventType.RELEASED, EventType.SNOOZED, *ERROR_EVENTS)


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
    """A TaskError from the JSON a failed attempt stored (core.events.error_info)."""
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
    return list(Event.objects.using(_db(job)).filter(job_id=job.id, type__in=HISTORY_EVENTS).order_by("id"))


# (task, alias, priority, queue_name, run_after) -> the task as such a job holds it.
# replace() runs the backend's validate_task (inspect.signature among its checks), which
# cost more than the rest of a TaskResult; the answer changes only with the settings.
_JOB_TASKS = {}
_JOB_TASKS_MAX = 1024


def _task_for_job(task, job, alias):
    """The task as this job holds it: the row's priority, queue and run_after, read
    through ``alias``.

    The row's budget and timeout stay on the row (Job.max_attempts, Job.timeout).
    """
    key = (task, alias, job.priority, job.queue_name, job.run_after)
    try:
        return _JOB_TASKS[key]
    except KeyError:
        pass
    except TypeError:  # a task holding a dict (a follow-up template): nothing to key it by
        return _replaced(task, job, alias)
    if len(_JOB_TASKS) >= _JOB_TASKS_MAX:
        _JOB_TASKS.clear()
    found = _JOB_TASKS[key] = _replaced(task, job, alias)
    return found


def _replaced(task, job, alias):
    changes = {
        "backend": alias,
        "priority": job.priority,
        "queue_name": job.queue_name,
        "run_after": job.run_after,
    }
    for attempt in (changes, {"backend": alias}):
        try:
            return replace(task, **attempt)
        except InvalidTask:
            # Rows an operator edited (a queue this backend does not list) still read.
            continue
    return task


def _forget(*, setting, **kwargs):
    if setting in ("TASKS", "JOBQUEUE"):
        _JOB_TASKS.clear()


setting_changed.connect(_forget)


def _returned(event):
    return event.type == EventType.RECOVERED and bool((event.metadata or {}).get("attempt_returned"))


def from_job(job, task, alias, events=None):
    """Build the TaskResult for ``job``, whose kind resolved to ``task``."""
    events = _history(job) if events is None else events
    worker_ids, attempted, errors = [], [], []
    for event in events:
        if event.type == EventType.CLAIMED:
            worker_ids.append(event.worker)
            attempted.append(event.at)
        elif (event.type in (EventType.RELEASED, EventType.SNOOZED) or _returned(event)) and worker_ids:
            # Given back before it started (by its worker, or by recovery), or snoozed by
            # its function: not an attempt.
            worker_ids.pop()
            attempted.pop()
        elif event.type in ERROR_EVENTS:
            errors.append(task_error(event.metadata.get("error")))
    return _result(job, task, alias, STATUS[job.state], attempted, worker_ids, errors)


def _result(job, task, alias, status, attempted, worker_ids, errors):
    try:
        args, kwargs = arguments(job)
    except TypeError:
        args, kwargs = [], {}  # an edited payload the worker will refuse; still report the job
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


def running(job, task, alias):
    """The TaskResult of a Task job this worker has just claimed, as get_result() reads it.

    A claim that set the row's started_at is the job's first ever (claimed_at: when the
    worker's claim leased it, execution.claimed()): every claim sets started_at if it is
    empty, a failure or recovery needs a claim before it, and release and requeue never
    clear it. With attempts at 1 as well, that claim is the whole history, so the result
    comes off the row with no query. Any other job reads its Event rows: it was retried,
    recovered, released or requeued, so it has paid a failure or an operator's action
    already. Storing earlier errors on the row instead (a list appended by fail and
    recover) would be a second copy of the event log for every write path to keep in
    step, and still not hold the earlier attempts' workers and times (worker_ids,
    started_at).
    """
    claimed_at = getattr(job, "claimed_at", None)
    if claimed_at is not None and job.attempts == 1 and job.started_at == claimed_at:
        return _result(job, task, alias, TaskResultStatus.RUNNING, [job.started_at], [job.lease_owner], [])
    return from_job(job, task, alias)


def succeeded(result, finished_at, value):
    """``result`` (a running attempt's, from running()) once the attempt completed at
    ``finished_at`` with ``value``: what get_result() reads after the commit.

    Exact because the completion was fenced by owner and attempt: nothing else was
    written to the job's history between the claim and it."""
    # A copy of the running result, field by field: TaskResult() would check and copy
    # args and kwargs again (its __post_init__), which the running one has done, and
    # dataclasses.replace() costs twice as much as that. Two microseconds a job.
    done = _new_result(TaskResult)
    for name in _RESULT_FIELDS:
        _set(done, name, getattr(result, name))
    _set(done, "status", TaskResultStatus.SUCCESSFUL)
    _set(done, "finished_at", finished_at)
    _set(done, "errors", list(result.errors))
    _set(done, "worker_ids", list(result.worker_ids))
    _set(done, "_return_value", value)
    return done


_RESULT_FIELDS = tuple(f.name for f in fields(TaskResult))
_new_result = object.__new__
_set = object.__setattr__


def pending(job, task, alias):
    """The TaskResult of a job just enqueued: ready, no history yet."""
    args, kwargs = arguments(job)
    # Built field by field: TaskResult()'s __post_init__ would copy args and kwargs
    # through normalize_json again, which the backend's enqueue has just done (the
    # payload holds what it made), and its frozen __init__ costs as much.
    result = _new_result(TaskResult)
    (
        task_,
        id_,
        status,
        enqueued_at,
        started_at,
        finished_at,
        last_at,
        args_,
        kwargs_,
        backend,
        errors,
        workers,
        value,
    ) = _PENDING_SETTERS
    task_(result, task)
    id_(result, str(job.id))
    status(result, _READY)
    enqueued_at(result, job.created_at)
    started_at(result, None)
    finished_at(result, None)
    last_at(result, None)
    args_(result, args)
    kwargs_(result, kwargs)
    backend(result, alias)
    errors(result, [])
    workers(result, [])
    value(result, None)
    return result


_READY = TaskResultStatus.READY
# The slots' own setters: object.__setattr__ checks the type's setattr against its bases
# at every call, a third of building a result.
_PENDING_FIELDS = (
    "task",
    "id",
    "status",
    "enqueued_at",
    "started_at",
    "finished_at",
    "last_attempted_at",
    "args",
    "kwargs",
    "backend",
    "errors",
    "worker_ids",
    "_return_value",
)
_PENDING_SETTERS = tuple(TaskResult.__dict__[name].__set__ for name in _PENDING_FIELDS)
