"""Running a Task job in a worker: django.tasks' signals around the function's call, and
the TaskContext it is given. The worker (execution.py, supervisor.py) calls these; the
backend never does.
"""

import inspect
import logging

from django.db import router
from django.tasks import task_backends
from django.tasks.signals import task_finished, task_started
from django.utils.json import normalize_json

from queue_app.exceptions import UnknownKind, UnstorableResult
from queue_app.handlers import context as running
from queue_app.handlers import registry
from queue_app.models import Job
from queue_app.tasks.backend import DatabaseBackend
from queue_app.tasks.results import _db, arguments, from_job

log = logging.getLogger("queue_app")


def _backend_for(task, db):
    """The (alias, backend class) that owns jobs in ``db``; the task's own backend first."""
    candidates = [task.backend] + [alias for alias in task_backends.settings if alias != task.backend]
    for alias in candidates:
        try:
            backend = task_backends[alias]
        except Exception:
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
        return normalize_json(value)
    except TypeError as exc:
        # Django's own error for it (as its backends record it); not worth a retry.
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
    for receiver, response in task_finished.send_robust(
        sender=sender, task_result=from_job(job, task, alias)
    ):
        if isinstance(response, Exception):
            log.error("task_finished receiver %r failed for job %s", receiver, job_id, exc_info=response)
