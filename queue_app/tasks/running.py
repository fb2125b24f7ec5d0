"""Running a Task job in a worker: django.tasks' signals around the function's call, and
the TaskContext it is given. The worker (execution.py, supervisor.py) calls these; the
backend never does.
"""

import contextlib
import inspect
import logging

from django.core.signals import setting_changed
from django.db import InterfaceError, OperationalError, router
from django.tasks import task_backends
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils.json import normalize_json

from queue_app.exceptions import NotStarted, UnknownKind, UnstorableResult
from queue_app.handlers import context as running
from queue_app.handlers import registry
from queue_app.models import Event, EventType, Job, State
from queue_app.tasks import results
from queue_app.tasks.backend import DatabaseBackend
from queue_app.tasks.results import _db, arguments

log = logging.getLogger("queue_app")

# A worker sends task_started and task_finished for every job, to the same few receivers
# (Django's own log lines among them): with its per-sender cache on, Signal.send looks
# them up once, not by a scan of every receiver under a lock per send (a fifth of what
# a @task job costs a worker beyond a native one, task_overhead.py). connect() and
# disconnect() clear that cache, so a receiver added later is heard as before.
for _signal in (task_enqueued, task_started, task_finished):
    _signal.use_caching = True


def _backend_for(task, db):
    """The (alias, backend class) that owns jobs in ``db``; the task's own backend first."""
    key = (task.backend, db)
    found = _BACKENDS.get(key)
    if found is None:
        found = _BACKENDS[key] = _find_backend(task.backend, db)
    return found


# (task's backend alias, database) -> _find_backend's answer, asked for every job run;
# it changes only with the settings.
_BACKENDS = {}


def _find_backend(first, db):
    candidates = [first] + [alias for alias in task_backends.settings if alias != first]
    for alias in candidates:
        try:
            backend = task_backends[alias]
        except Exception:
            continue
        if isinstance(backend, DatabaseBackend) and backend.database == db:
            return alias, type(backend)
    return first, DatabaseBackend


def _forget(*, setting, **kwargs):
    if setting in ("TASKS", "DATABASES", "DATABASE_ROUTERS"):
        _BACKENDS.clear()


setting_changed.connect(_forget)


def run(job, task, *, aside=contextlib.nullcontext):
    """Run a claimed Task job: fire task_started and call its function.

    task_finished is not sent here but by finished() or acknowledged(), once the caller
    has recorded the outcome, so it carries the status the row really has. ``job``
    remembers that its task started, and as what, for them to know. task_started is
    sent inside ``aside()``: the worker keeps what its receivers log (Django's own
    "Task ... state=RUNNING" line) out of the output it stores with the attempt, which
    is the function's.
    """
    args, kwargs = arguments(job)
    if "parent" in job.payload and "parent" not in kwargs and _takes_parent(task):
        kwargs = {**kwargs, "parent": job.payload["parent"]}
    alias, sender = _backend_for(task, _db(job))
    try:
        result = results.running(job, task, alias)
    except (OperationalError, InterfaceError) as exc:
        # The function has not been called: this is no failure of the task (the worker
        # waits for the database and starts it again).
        raise NotStarted(job.id, exc) from exc
    with aside():
        task_started.send(sender=sender, task_result=result)
    job._task_started = (task, alias, sender, result)
    if getattr(task, "chunk", None):
        # A chunked task's job run on its own (execution.execute(), run_one()): a chunk of one.
        value = registry.only(task.call([result]), job)
    elif task.takes_context:
        # Django's TaskContext plus cancelled() / progress() / set_metadata().
        value = task.call(running.JobTaskContext(task_result=result), *args, **kwargs)
    else:
        value = task.call(*args, **kwargs)
    try:
        return normalize_json(value)
    except TypeError as exc:
        # Django's own error for it (as its backends record it); not worth a retry.
        raise UnstorableResult(exc) from exc


def run_chunk(jobs, task, *, aside=contextlib.nullcontext):
    """Run a chunked Task's claimed jobs in one call: task_started for each, then its
    function with their TaskResults (RUNNING, in order); return what it returned.

    Every TaskResult is read before any signal goes out, so a NotStarted (the database
    away) leaves nothing half-started. task_finished goes out per job, as for run()."""
    started = []
    for job in jobs:
        alias, sender = _backend_for(task, _db(job))
        try:
            started.append((job, alias, sender, results.running(job, task, alias)))
        except (OperationalError, InterfaceError) as exc:
            raise NotStarted(job.id, exc) from exc
    for job, alias, sender, result in started:
        with aside():
            task_started.send(sender=sender, task_result=result)
        job._task_started = (task, alias, sender, result)
    return task.call([result for *_, result in started])


def stored(value):
    """A Task's return value as JSON stores it; UnstorableResult if it cannot be."""
    try:
        return normalize_json(value)
    except TypeError as exc:
        raise UnstorableResult(exc) from exc


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
    ``state`` None: this worker's write found the lease lost (see _send_finished).
    """
    started = job.__dict__.pop("_task_started", None)
    if started is not None:
        task, alias, sender, _ = started
        _send_finished(job.id, task, alias, sender, state=state, lost=state is None, using=using or _db(job))


def acknowledged(done, completed, finished_at, *, worker_id=None, using=None):
    """Send task_finished, in order, for the Task jobs of a batched acknowledgement
    that has committed. ``done`` is [(job, result)], ``completed`` the ids the
    acknowledgement completed (at ``finished_at``); the others' leases were lost, or
    (``worker_id`` given) an earlier try of the same acknowledgement committed and only
    its answer was lost with the connection: then the row says so (_send_finished).

    A completed job's TaskResult is its running one (run()) plus the outcome: no query.
    Any error here is logged, never raised: the acknowledgement has committed, and the
    caller's claim must not be taken for failed."""
    for job, value in done:
        started = job.__dict__.pop("_task_started", None)
        if started is None:
            continue
        task, alias, sender, result = started
        try:
            if job.id in completed:
                _send(sender, job.id, results.succeeded(result, finished_at, value))
            else:
                _send_finished(
                    job.id,
                    task,
                    alias,
                    sender,
                    lost=True,
                    settled_by=(worker_id, job.attempts) if worker_id else None,
                    using=using or _db(job),
                )
        except Exception:
            log.exception("task_finished failed for job %s", job.id)


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


def _send_finished(job_id, task, alias, sender, *, state=None, lost=False, settled_by=None, using):
    job = Job.objects.using(using).filter(id=job_id).first()
    if job is None:  # pruned meanwhile: nothing to report
        return
    if (
        lost
        and job.state == State.COMPLETED
        and settled_by
        and _completed_by(job_id, *settled_by, using=using)
    ):
        lost = False  # this attempt's own completion, whose answer the connection lost
    if state is not None:
        # The state this attempt's outcome wrote: a retry may already have been claimed
        # by another thread, and its RUNNING must not stand in for this attempt's READY.
        job.state = state
    elif lost and job.state not in LOST_REPORTS:
        # This worker's write found the lease lost: the attempt did not succeed, and a
        # row now leased or completed is another attempt's, which reports itself.
        return
    _send(sender, job_id, results.from_job(job, task, alias))


def _completed_by(job_id, worker_id, attempt, *, using):
    return (
        Event.objects.using(using)
        .filter(job_id=job_id, type=EventType.COMPLETED, attempt=attempt, worker=worker_id)
        .exists()
    )


# What a row may say to be reported for an attempt whose lease was lost: the verdict of
# whatever took it back (recovery: a LeaseExpired failure, retried or dead-lettered).
LOST_REPORTS = (State.PENDING, State.DEAD_LETTER, State.CANCELLED)


def _send(sender, job_id, result):
    # The outcome is already recorded; a receiver's error must not look like the task's.
    for receiver, response in task_finished.send_robust(sender=sender, task_result=result):
        if isinstance(response, Exception):
            log.error("task_finished receiver %r failed for job %s", receiver, job_id, exc_info=response)
