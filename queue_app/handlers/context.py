"""What a running handler can ask of its job: was it asked to stop, and where to report
progress and metadata.

    from queue_app import current_job

    def export(payload):
        job = current_job()
        for i, chunk in enumerate(chunks):
            if job.cancelled():
                return                  # the worker records the job as cancelled
            write(chunk)
            job.progress(100 * (i + 1) / len(chunks), f"chunk {i + 1} of {len(chunks)}")
        job.set_metadata(rows=total)

The same object serves plain handlers, handlers that take ``job``, async handlers (it
lives in a ContextVar, which asyncio copies into the handler's task) and django.tasks
functions, whose ``takes_context`` context also has these methods (JobTaskContext).
Threads a handler starts itself do not inherit it: pass the object along.

Progress is not a transition: no Event, just the last value on the row, written at
most once per PROGRESS_INTERVAL (a held-back value by a timer when the interval is up,
and at once when the handler ends), and only while this worker holds the lease.
"""

import contextvars
import logging
import math
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from numbers import Real

from django.db import connection, router
from django.tasks import TaskContext

from queue_app.conf import settings
from queue_app.core import validation
from queue_app.exceptions import InvalidJob
from queue_app.models import Job, State

log = logging.getLogger("queue_app")

PROGRESS_MESSAGE_MAX_LENGTH = Job._meta.get_field("progress_message").max_length

_current = contextvars.ContextVar("queue_app_current_job", default=None)


class Aborted(Exception):
    """The handler ended after its job's abort was requested: the job is cancelled,
    whatever it returned or raised."""

    def __init__(self, job_id, how, error=None):
        super().__init__(f"job {job_id} was aborted: its handler {how}")
        self.job_id = job_id
        self.how = how
        self.error = error


class JobContext:
    """The running job as its handler sees it (see the module docstring)."""

    def __init__(self, job, *, worker_id, abort_probe=None):
        self.job_id = job.id
        self.attempt = job.attempts
        self.worker_id = worker_id
        self._db = job._state.db or router.db_for_write(Job)
        # With a supervisor the probe reads shared memory (free); without one, the row.
        self._probe = abort_probe
        self._requested = job.cancel_requested_at is not None
        self._lost = False
        self._checked_at = -math.inf
        self._progress = job.progress
        self._message = job.progress_message
        self._metadata = dict(job.metadata or {})
        self._dirty = False
        self._written_at = -math.inf
        # A held-back update is written by a timer when its interval is up, so a handler
        # that reports and then blocks for an hour still shows what it reported.
        self._lock = threading.Lock()
        self._timer = None
        self._closed = False

    # --- abort -----------------------------------------------------------------------------

    def cancelled(self):
        """True once this job was asked to stop (or its lease was lost): wind down and return."""
        if not (self._requested or self._lost):
            self._requested = bool(self._probe()) if self._probe else self._ask_database()
        return self._requested or self._lost

    def _ask_database(self):
        # No supervisor watching (run_once, run_one): read the row, at most once per interval.
        now = time.monotonic()
        if now - self._checked_at < float(settings.ABORT_CHECK_INTERVAL):
            return False
        self._checked_at = now
        return Job.objects.using(self._db).filter(id=self.job_id, cancel_requested_at__isnull=False).exists()

    def abort_seen(self):
        """Whether the worker should settle this job as aborted now that its handler ended."""
        if self._probe and not self._requested:
            self._requested = bool(self._probe())
        return self._requested

    # --- progress and metadata ------------------------------------------------------------

    def progress(self, percent, message=None):
        """Report how far the job is, 0 to 100, with an optional message."""
        if not isinstance(percent, Real) or isinstance(percent, bool) or not math.isfinite(percent):
            raise InvalidJob(f"progress must be a number from 0 to 100, got {percent!r}", "progress")
        if not 0 <= percent <= 100:
            raise InvalidJob(f"progress must be from 0 to 100, got {percent!r}", "progress")
        if message is not None:
            message = str(message).replace("\x00", "")[:PROGRESS_MESSAGE_MAX_LENGTH]
        self._progress, self._message = float(percent), message
        self._changed()

    def set_metadata(self, values=None, /, **more):
        """Merge keys into the job's metadata (JSON); a key set to None stays, as null."""
        if values is not None and not isinstance(values, dict):
            raise InvalidJob(f"metadata must be a JSON object, got {type(values).__name__}", "metadata")
        merged = validation.payload({**self._metadata, **(values or {}), **more}, "metadata")
        self._metadata = merged
        self._changed()

    @property
    def metadata(self):
        return dict(self._metadata)

    def close(self):
        """Write what the throttle held back; called when the handler ends."""
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._dirty:
                self._write()

    def _changed(self):
        with self._lock:
            self._dirty = True
            wait = self._written_at + float(settings.PROGRESS_INTERVAL) - time.monotonic()
            if wait <= 0:
                self._write()
            elif self._timer is None:
                self._timer = threading.Timer(wait, self._write_later)
                self._timer.daemon = True
                self._timer.start()

    def _write_later(self):
        try:
            with self._lock:
                self._timer = None
                if self._dirty and not self._closed:
                    self._write()
        except Exception:
            log.exception("could not write progress id=%s", self.job_id)
        finally:
            connection.close()  # this timer thread's own connection

    def _write(self):
        # Only while this worker holds this attempt: a stale worker cannot overwrite the row.
        changed = (
            Job.objects.using(self._db)
            .filter(id=self.job_id, state=State.LEASED, lease_owner=self.worker_id, attempts=self.attempt)
            .update(progress=self._progress, progress_message=self._message, metadata=self._metadata or None)
        )
        self._dirty = False
        self._written_at = time.monotonic()
        if not changed and not self._lost:
            self._lost = True
            log.warning(
                "progress not written id=%s worker=%s: the lease is gone", self.job_id, self.worker_id
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class JobTaskContext(TaskContext):
    """django.tasks' TaskContext (``takes_context=True``) with the running job's methods."""

    def cancelled(self):
        return current_job().cancelled()

    def progress(self, percent, message=None):
        current_job().progress(percent, message)

    def set_metadata(self, values=None, /, **more):
        current_job().set_metadata(values, **more)


def current_job():
    """Return the JobContext of the job this code runs in; LookupError outside a handler."""
    ctx = _current.get()
    if ctx is None:
        raise LookupError("current_job() is only available while a queue worker runs a job's handler")
    return ctx


@contextmanager
def activate(job, *, worker_id, abort_probe=None):
    """Make ``job`` the current job for the handler called inside the block."""
    ctx = JobContext(job, worker_id=worker_id, abort_probe=abort_probe)
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)


def settle(ctx, error=None):
    """After the handler ended: write held-back progress, and raise Aborted if the job's
    abort was requested (``error`` is what it raised, if anything)."""
    try:
        ctx.close()
    except Exception:
        # Progress is advisory; losing the last update must not lose the outcome.
        log.exception("could not write the last progress id=%s", ctx.job_id)
    if ctx.abort_seen():
        raise Aborted(ctx.job_id, "raised" if error is not None else "returned", error)
