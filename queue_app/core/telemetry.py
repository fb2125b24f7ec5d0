"""What a job's log lines and traces say about it: the fields every log record of an
attempt carries, and OpenTelemetry spans from enqueue to each attempt.

Log fields. ``JobFields`` is a logging filter: put it on a handler and every record that
handler sees gets ``job_id``, ``kind``, ``queue``, ``attempt``, ``worker_id`` and
``trace_id`` attributes (None where there is none), taken from the attempt this thread is
running (``attempt()`` sets them around it) or given with ``extra=``. A JSON formatter
(python-json-logger) then writes them as fields; the plain format ignores them.

Traces, optional. Only ``opentelemetry-api`` is imported, and only if installed: without
it, or before the site sets a tracer provider, every function here is a no-op. With it (and the site's SDK and exporter), enqueue
opens a span in the caller's trace and stores its W3C trace context (``traceparent``,
``tracestate``) on the job (Job.trace_context); each attempt's span is a child of that
enqueue span, so a request that enqueued and the worker that ran the job, in another
process or host, share one trace.
"""

import contextvars
import logging
import time
from contextlib import contextmanager

from django.utils import timezone

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # tracing is the site's choice: the queue runs without it
    trace = None

FIELDS = ("job_id", "kind", "queue", "attempt", "worker_id", "trace_id")

_fields = contextvars.ContextVar("queue_app_log_fields", default=None)
# The process's worker id, for the lines of its threads that run no job (claims, waits):
# a thread starts with an empty context, so a ContextVar set in run() would not reach them.
_worker_id = None


def bind_worker(worker_id):
    """Name the worker this process is, for log lines outside an attempt."""
    global _worker_id
    _worker_id = worker_id


class JobFields(logging.Filter):
    """Add the running attempt's fields (FIELDS) to each record; what ``extra=`` gave wins."""

    def filter(self, record):
        fields = _fields.get() or {}
        for name in FIELDS:
            if not hasattr(record, name):
                setattr(record, name, fields.get(name))
        if record.worker_id is None:
            record.worker_id = _worker_id
        return True


def job_fields(job, **more):
    """``extra=`` for a log line about ``job`` outside an attempt (a transition's)."""
    return {
        "job_id": job.id,
        "kind": job.kind,
        "queue": job.queue_name,
        "attempt": job.attempts,
        **more,
    }


# A proxy until the site sets its provider, then that provider's tracer: fetched once,
# as a tracer per call costs a few microseconds an attempt.
_tracer = trace.get_tracer("queue_app") if trace is not None else None


# The providers the API has before a site sets its SDK's: every span they make is a no-op,
# and making them anyway cost the drain 10% at batch 10 on SQLite (worker_throughput.py).
_NO_PROVIDER = (trace.ProxyTracerProvider, trace.NoOpTracerProvider) if trace is not None else ()


def tracing():
    """Whether spans would go anywhere: the API is installed and a provider is set."""
    return trace is not None and not isinstance(trace.get_tracer_provider(), _NO_PROVIDER)


def _trace_id(span):
    ctx = span.get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None


# --- enqueue -----------------------------------------------------------------------


@contextmanager
def enqueuing(kind, queue_name, count=1):
    """A span around an enqueue, in the caller's trace; yields a callable that sets the
    job's id on it (``done(job, created)``)."""
    if not tracing():
        yield _nothing
        return
    attributes = {"queue_app.kind": kind, "queue_app.queue": queue_name}
    if count != 1:
        attributes["queue_app.count"] = count
    with _tracer.start_as_current_span(
        f"enqueue {kind}", kind=SpanKind.PRODUCER, attributes=attributes
    ) as span:
        yield lambda job, created=True: _enqueued(span, job, created)


def _nothing(*args, **kwargs):
    pass


def _enqueued(span, job, created):
    span.set_attribute("queue_app.job_id", job.id)
    span.set_attribute("queue_app.created", created)


def carrier():
    """The current trace context as W3C headers, to store with a new job (None: no trace)."""
    if not tracing() or not trace.get_current_span().get_span_context().is_valid:
        return None
    headers = {}
    propagate.inject(headers)
    return headers or None


# --- attempts ----------------------------------------------------------------------


class Attempt:
    """One attempt's span and log fields, as attempt() yields it."""

    def __init__(self, span):
        self.span = span

    def failed(self, exc):
        """Record the handler's error on the span (call it in the except block)."""
        if self.span is not None:
            self.span.record_exception(exc)
            self.span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))

    def settled(self, outcome):
        """Set the attempt's outcome: the job's new state, or "lost" if the lease was."""
        if self.span is not None:
            self.span.set_attribute("queue_app.outcome", outcome or "lost")


@contextmanager
def attempt(job, worker_id):
    """Around one attempt of ``job``: its log fields, and (with OpenTelemetry) a span that
    continues the trace the job was enqueued in."""
    fields = {**job_fields(job), "worker_id": worker_id}
    if not tracing():
        token = _fields.set(fields)
        try:
            yield Attempt(None)
        finally:
            _fields.reset(token)
        return
    parent = propagate.extract(job.trace_context) if job.trace_context else otel_context.Context()
    claimed_at = getattr(job, "claimed_at", None) or timezone.now()
    attributes = {
        "queue_app.kind": job.kind,
        "queue_app.queue": job.queue_name,
        "queue_app.job_id": job.id,
        "queue_app.attempt": job.attempts,
        "queue_app.worker_id": worker_id,
        # ready (run_at) to claimed: how long it waited for a worker
        "queue_app.wait_seconds": max(0.0, (claimed_at - job.run_at).total_seconds()),
    }
    started = time.monotonic()
    # The handler's error is caught before it leaves the attempt (Attempt.failed records
    # it); one of the worker's own that escapes is recorded by the span itself.
    with _tracer.start_as_current_span(
        f"run {job.kind}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
    ) as span:
        token = _fields.set({**fields, "trace_id": _trace_id(span)})
        try:
            yield Attempt(span)
        finally:
            _fields.reset(token)
            span.set_attribute("queue_app.run_seconds", time.monotonic() - started)
