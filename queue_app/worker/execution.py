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
from typing import NamedTuple

from django.utils import timezone

from queue_app.conf import settings
from queue_app.core import encryption, events, telemetry, transitions, validation
from queue_app.exceptions import (
    NotStarted,
    Snooze,
    TooManySnoozes,
    UndecryptablePayload,
    UnknownKind,
    UnstorableResult,
)
from queue_app.handlers import context as running
from queue_app.handlers import registry
from queue_app.tasks import running as task_running
from queue_app.worker import capture

log = logging.getLogger("queue_app")

# A dead letter's reason when no key in ENCRYPTION_KEYS opens the job's payload.
UNDECRYPTABLE = "undecryptable payload"


def default_worker_id():
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def call_handler(job, *, worker_id=None, abort_probe=None):
    """Run the job's handler and return its value (awaiting it if it is a coroutine).

    The handler sees the job as ``current_job()`` (running.py). Raise running.Aborted,
    whatever it returned or raised, if the job's abort was requested by the time it ended.
    """
    func = registry.get(job.kind)
    if encryption.holds_tokens(job.payload):
        # Only here and for callers allowed to see it is an encrypted payload opened.
        job.payload = encryption.unseal(job.payload)
    with running.activate(job, worker_id=worker_id or job.lease_owner, abort_probe=abort_probe) as ctx:
        try:
            result = _call(func, job)
        except HANDLER_ERRORS as exc:
            running.settle(ctx, exc)
            raise
        running.settle(ctx)
    return result


# What a handler may raise and its attempt fails with. SystemExit and KeyboardInterrupt
# too: left to rise, sys.exit() in a handler would end the worker thread (and its process)
# with the job in hand; they are recorded as themselves (builtins.SystemExit), as Django's
# backends record them. (Children ignore SIGINT: a real Ctrl-C is not this.)
HANDLER_ERRORS = (Exception, SystemExit, KeyboardInterrupt)


def _call(func, job):
    if registry.is_task(func):
        # A django.tasks function: args/kwargs, TaskContext and Django's task signals;
        # what task_started's receivers log goes to a capture of its own, not the job's.
        return task_running.run(job, func, aside=capture.Discard)
    result = func(job.payload, job=job) if registry.wants_job(func) else func(job.payload)
    if inspect.isawaitable(result):
        result = asyncio.run(_await(result))
    return result


async def _await(awaitable):
    return await awaitable


def attempt(job, worker_id, output, *, abort_probe=None):
    """Run the job's handler with its output captured; return the result as it will be
    stored. Raise running.Aborted, or the handler's error (see failure())."""
    with output:
        value = call_handler(job, worker_id=worker_id, abort_probe=abort_probe)
    try:
        return validation.payload(value, "result")
    except ValueError as exc:
        raise UnstorableResult(exc) from exc


class Failure(NamedTuple):
    """How a failed attempt is recorded."""

    error: dict
    retry: bool
    # Why it may not retry, for the dead letter (None: the default, "not_retryable").
    reason: str | None = None
    # Seconds before the retry from the kind's backoff function (None: the job's backoff).
    delay: float | None = None


def failure(job, exc):
    """How a failed attempt is recorded (a Failure). The one rule, for execute() and the
    worker's batched path alike; call it in the except block."""
    log.info("failed id=%s kind=%s attempt=%s: %r", job.id, job.kind, job.attempts, exc)
    if isinstance(exc, UnstorableResult):
        # Running it again returns the same value: dead-letter at once.
        return Failure(events.error_info(exc.error, "".join(traceback.format_exception(exc.error))), False)
    if isinstance(exc, UnknownKind):
        # Retrying cannot help until someone deploys a handler: dead-letter at once.
        return Failure(events.error_info(exc), False)
    if isinstance(exc, UndecryptablePayload):
        # No key opens it, and none will by retrying: dead-letter at once, saying why.
        return Failure(events.error_info(exc), False, UNDECRYPTABLE)
    error = events.error_info(exc, traceback.format_exc())
    # The kind's retry_on / discard_on / backoff (its @handler or @task).
    policy = registry.policy(job.kind)
    retry, reason = policy.decide(exc)
    if not retry:
        log.info("not retrying id=%s kind=%s: %s", job.id, job.kind, reason)
        return Failure(error, False, reason)
    return Failure(error, True, delay=policy.delay(job.attempts, exc))


def execute(job, worker_id, *, abort_probe=None, using=None):
    """Run a claimed job and record the outcome; return the new state (None if the lease was lost)."""
    with telemetry.attempt(job, worker_id) as traced:
        output = capture.Capture()  # what the handler prints goes with the attempt's event
        try:
            result = attempt(job, worker_id, output, abort_probe=abort_probe)
        except NotStarted:
            raise  # not the job's failure: its handler was never called
        except HANDLER_ERRORS as exc:
            traced.failed(exc)
            state = settle_failure(job, worker_id, exc, output, using=using)
        else:
            done = transitions.complete(
                job.id,
                worker_id=worker_id,
                attempt=job.attempts,
                result=result,
                output=output.value(),
                using=using,
            )
            state = _settled(job, "completed" if done else None, using)
        traced.settled(state)
        return state


def settle_failure(job, worker_id, exc, output, *, using=None):
    """Record an attempt that raised ``exc`` (or was aborted); return the new state
    (None if the lease was lost). Call it in the except block: task_finished goes out
    here for a django.tasks job, and Django's logger wants exc_info."""
    if isinstance(exc, running.Aborted):
        return _settled(job, aborted(job, worker_id, exc, output=output.value(), using=using), using)
    if isinstance(exc, Snooze):
        snoozes = transitions.snooze(
            job.id,
            worker_id=worker_id,
            attempt=job.attempts,
            seconds=exc.seconds,
            output=output.value(),
            using=using,
        )
        if snoozes != 0:  # 0: past MAX_SNOOZES, and the attempt fails
            return _settled(job, "pending" if snoozes else None, using)
        exc = TooManySnoozes(settings.MAX_SNOOZES)
    failed = failure(job, exc)
    state = transitions.fail(
        job.id,
        worker_id=worker_id,
        attempt=job.attempts,
        error=failed.error,
        retry=failed.retry,
        retry_delay=failed.delay,
        reason=failed.reason,
        output=output.value(),
        using=using,
    )
    return _settled(job, state, using)


def _settled(job, state, using):
    """Return ``state`` once Django's task_finished went out for a django.tasks job: after
    the outcome is recorded, and inside the caller's exception handler if it failed."""
    task_running.finished(job, state=state, using=using)
    return state


def acknowledged(done, completed, finished_at, *, worker_id=None):
    """After a batched acknowledgement committed (complete_many at ``finished_at``,
    ``completed`` the ids it completed): task_finished for the django.tasks jobs of
    ``done`` [(job, result)], in order."""
    task_running.acknowledged(done, completed, finished_at, worker_id=worker_id)


def claimed(jobs, now):
    """Note on each of ``jobs`` that a claim at ``now`` leased it (Job.claimed_at, the
    time of its claimed event): a django.tasks job's first attempt then reads its
    TaskResult off the row (tasks.results.running). Return ``jobs``."""
    for job in jobs:
        job.claimed_at = now
    return jobs


def aborted(job, worker_id, exc, *, output=None, using=None):
    """Settle a job whose handler ended after its abort was requested: it is cancelled,
    with what the attempt printed on its event as every other ending keeps it."""
    log.info("aborted id=%s kind=%s attempt=%s: the handler %s", job.id, job.kind, job.attempts, exc.how)
    error = events.error_info(exc.error) if exc.error is not None else None
    done = transitions.abort(
        job.id,
        worker_id=worker_id,
        attempt=job.attempts,
        how=f"the handler {exc.how} after the abort request",
        error=error,
        output=output,
        using=using,
    )
    return "cancelled" if done else None


def run_one(*, worker_id=None, queues=None, kinds=None, using=None, **claim_options):
    """Claim, run and settle one ready job; return it refreshed, or None if none was ready."""
    worker_id = worker_id or default_worker_id()
    now = claim_options.pop("now", None) or timezone.now()
    jobs = transitions.claim(
        worker_id, limit=1, queues=queues, kinds=kinds, now=now, using=using, **claim_options
    )
    claimed(jobs, now)
    if not jobs:
        return None
    job = jobs[0]
    execute(job, worker_id, using=using)
    job.refresh_from_db()
    return job


# --- chunks: one handler call for several jobs of a chunked kind (registry.chunking) ------


def execute_chunk(jobs, worker_id, *, abort_probes=None, retrying=None, using=None):
    """Run claimed jobs of one chunked kind in one handler call and record each job's
    outcome; return [(job, new state)] in order (state None: its lease was lost). Each
    job's attempt has its span, as execute() gives one (telemetry.chunk)."""
    output = capture.Capture()
    with telemetry.chunk(jobs, worker_id) as traced:
        outcomes = attempt_chunk(jobs, worker_id, output, abort_probes=abort_probes)
        for n, value in enumerate(outcomes):
            if isinstance(value, BaseException):
                traced[n].failed(value)
        # The call's time is each span's run time; each span ends with what settling its
        # job recorded, as settle_chunk() learns it (one write failing leaves the rest known).
        traced.defer()
        return settle_chunk(jobs, outcomes, worker_id, output, retrying=retrying, using=using, traced=traced)


def attempt_chunk(jobs, worker_id, output, *, abort_probes=None):
    """Call the chunk handler of ``jobs`` (one kind) once with its output captured; return
    each job's outcome in order: its result as it will be stored, or the exception its
    attempt fails with (running.Aborted if its abort was requested meanwhile, whatever
    the handler said of it). Raise NotStarted if the handler was never called.

    A handler that raises fails every job with that error. No job is current_job()
    inside the call: each has its own progress and abort, and the call is one."""
    outcomes = [None] * len(jobs)
    live = []
    for n, job in enumerate(jobs):
        if encryption.holds_tokens(job.payload):
            try:
                job.payload = encryption.unseal(job.payload)
            except UndecryptablePayload as exc:
                outcomes[n] = exc  # only this job: the others' payloads opened
                continue
        live.append(n)
    members = [jobs[n] for n in live]
    contexts = [
        running.JobContext(
            jobs[n], worker_id=worker_id, abort_probe=abort_probes[n] if abort_probes else None
        )
        for n in live
    ]
    task = False
    try:
        func = registry.chunk_handler(jobs[0].kind)
        task = registry.is_task(func)
        with output:
            values = registry.chunk_outcomes(_call_chunk(func, members, task), members)
    except NotStarted:
        raise
    except HANDLER_ERRORS as exc:
        values = [exc] * len(members)
    for n, ctx, value in zip(live, contexts, values, strict=True):
        error = value if isinstance(value, BaseException) else None
        try:
            running.settle(ctx, error)
        except running.Aborted as exc:
            outcomes[n] = exc
            continue
        outcomes[n] = error if error is not None else _storable(value, task)
    return outcomes


def _call_chunk(func, jobs, task):
    if task:
        return task_running.run_chunk(jobs, func, aside=capture.Discard)
    payloads = [job.payload for job in jobs]
    value = func(payloads, jobs=jobs) if registry.wants_jobs(func) else func(payloads)
    if inspect.isawaitable(value):
        value = asyncio.run(_await(value))
    return value


def _storable(value, task):
    """``value`` as the job's stored result, or the UnstorableResult its job fails with."""
    try:
        if task:
            value = task_running.stored(value)
        return validation.payload(value, "result")
    except UnstorableResult as exc:
        return exc
    except ValueError as exc:
        return UnstorableResult(exc)


def settle_chunk(jobs, outcomes, worker_id, output, *, retrying=None, using=None, traced=None):
    """Record each outcome of a chunk (attempt_chunk()): the successes in one transaction
    (complete_many), each failure on its own through settle_failure(), so it follows its
    kind's retry policy; return [(job, new state)] in order. ``retrying(func, *args,
    **kwargs)`` makes each write (the worker waits out a database outage with it).
    ``traced``: the chunk's deferred spans (telemetry.Chunk), each finished with its
    job's new state once that is recorded."""
    call = retrying or (lambda func, *args, **kwargs: func(*args, **kwargs))
    states = {}
    done = [(job, value) for job, value in zip(jobs, outcomes) if not isinstance(value, BaseException)]
    if done:
        now = timezone.now()
        text = output.value()
        completed = call(
            transitions.complete_many,
            [(job.id, job.attempts, value, text) for job, value in done],
            worker_id=worker_id,
            now=now,
            using=using,
        )
        for job, _ in done:
            states[job.id] = "completed" if job.id in completed else None
        if traced is not None:
            for each, job in zip(traced, jobs, strict=True):
                if job.id in states:
                    each.finish(states[job.id])
        acknowledged(done, completed, now, worker_id=worker_id)
    # One exception may fail many jobs (a handler that raised): each is raised from the
    # traceback it came with, so the one recorded does not grow a frame per job.
    tracebacks = {}
    for n, (job, exc) in enumerate(zip(jobs, outcomes)):
        if not isinstance(exc, BaseException):
            continue
        tb = tracebacks.setdefault(id(exc), exc.__traceback__)
        try:
            raise exc.with_traceback(tb)
        except BaseException as raised:  # what the handler said: recorded as its failure
            states[job.id] = call(settle_failure, job, worker_id, raised, output, using=using)
        if traced is not None:
            traced[n].finish(states[job.id])
    return [(job, states[job.id]) for job in jobs]


def chunk_timeout(jobs, default):
    """The one deadline of a chunk's call: the longest of its jobs' timeouts (``default``
    for a job with none); None, no deadline, if any job has none."""
    timeouts = [job.timeout if job.timeout is not None else default for job in jobs]
    return None if any(not t for t in timeouts) else max(timeouts)
