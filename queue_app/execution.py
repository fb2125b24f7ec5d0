"""Running one job's handler and reporting the outcome through transitions.

The worker (issue: runworker) builds on ``execute``; ``run_one`` is the smallest
complete loop: claim one job, run it, complete or fail it.
"""
import asyncio
import inspect
import logging
import os
import socket
import traceback
import uuid

from queue_app import capture, registry, task_results, transitions
from queue_app.exceptions import UnknownKind

log = logging.getLogger("queue_app")


def default_worker_id():
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def call_handler(job):
    """Run the job's handler and return its value (awaiting it if it is a coroutine)."""
    func = registry.get(job.kind)
    if registry.is_task(func):
        # A django.tasks function: args/kwargs, TaskContext and Django's task signals.
        return task_results.run(job, func)
    result = func(job.payload, job=job) if registry.wants_job(func) else func(job.payload)
    if inspect.isawaitable(result):
        result = asyncio.run(_await(result))
    return result


async def _await(awaitable):
    return await awaitable


def execute(job, worker_id, *, using=None):
    """Run a claimed job and record the outcome; return the new state (None if the lease was lost)."""
    output = capture.Capture()  # what the handler prints goes with the attempt's event
    try:
        with output:
            result = call_handler(job)
    except UnknownKind as exc:
        # Retrying cannot help until someone deploys a handler: dead-letter at once.
        return transitions.fail(
            job.id, worker_id=worker_id, attempt=job.attempts,
            error=transitions.error_info(exc), retry=False, output=output.value(), using=using,
        )
    except Exception as exc:
        log.info("failed id=%s kind=%s attempt=%s: %r", job.id, job.kind, job.attempts, exc)
        return transitions.fail(
            job.id, worker_id=worker_id, attempt=job.attempts,
            error=transitions.error_info(exc, traceback.format_exc()), output=output.value(), using=using,
        )
    try:
        done = transitions.complete(
            job.id, worker_id=worker_id, attempt=job.attempts, result=result, output=output.value(), using=using
        )
    except ValueError as exc:  # the handler returned something JSON cannot hold
        return transitions.fail(
            job.id, worker_id=worker_id, attempt=job.attempts,
            error=transitions.error_info(exc), retry=False, output=output.value(), using=using,
        )
    return "completed" if done else None


def run_one(*, worker_id=None, queues=None, kinds=None, using=None, **claim_options):
    """Claim, run and settle one ready job; return it refreshed, or None if none was ready."""
    worker_id = worker_id or default_worker_id()
    jobs = transitions.claim(worker_id, limit=1, queues=queues, kinds=kinds, using=using, **claim_options)
    if not jobs:
        return None
    job = jobs[0]
    execute(job, worker_id, using=using)
    job.refresh_from_db()
    return job
