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
        if record.trace_id is None and "span" in fields:
            # Formatted here, for the few attempts that log, not for every attempt.
            record.trace_id = _trace_id(fields["span"])
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


# The providers the API has before a site sets its SDK's: every span they make is a no-op,
# and making them anyway cost the drain 10% at batch 10 on SQLite (worker_throughput.py).
_NO_PROVIDER = (trace.ProxyTracerProvider, trace.NoOpTracerProvider) if trace is not None else ()

# The site's provider's own tracer, once it has set one (the API lets a process set it
# once, so it stays): fetched once, as a tracer per call costs a few microseconds, and
# the provider's own rather than the API's proxy, one indirection less per span.
_tracer = None


def _sdk_tracer():
    """The tracer spans go to, or None while no provider is set (or without the API)."""
    global _tracer
    if _tracer is None and trace is not None and not isinstance(trace.get_tracer_provider(), _NO_PROVIDER):
        _tracer = trace.get_tracer("queue_app")
    return _tracer


def tracing():
    """Whether spans would go anywhere: the API is installed and a provider is set."""
    return _sdk_tracer() is not None


def flush(timeout_millis=5000):
    """Hand the spans a batching processor still holds to its exporter: before a forked
    worker child ends with os._exit, which skips the SDK's own flush at exit."""
    force_flush = getattr(trace.get_tracer_provider(), "force_flush", None) if tracing() else None
    if force_flush is not None:  # the SDK's provider has it; the API's contract does not
        force_flush(timeout_millis)


def _trace_id(span):
    ctx = span.get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None


def _record(span, exc):
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


# --- enqueue -----------------------------------------------------------------------


class _Enqueuing:
    """enqueuing()'s span, current while the enqueue runs; calling it records the job."""

    __slots__ = ("_token", "span")

    def __init__(self, span):
        self.span = span

    def __enter__(self):
        if self.span is not None:
            self._token = otel_context.attach(trace.set_span_in_context(self.span))
        return self

    def __exit__(self, exc_type, exc, tb):
        if self.span is not None:
            otel_context.detach(self._token)
            if isinstance(exc, Exception):  # as the SDK's own span context manager records
                _record(self.span, exc)
            self.span.end()
        return False

    def __call__(self, job, created=True):
        if self.span is not None:
            self.span.set_attributes({"queue_app.job_id": job.id, "queue_app.created": created})


def enqueuing(kind, queue_name, count=1):
    """A span around an enqueue, in the caller's trace: ``with enqueuing(...) as done``,
    then ``done(job, created)`` sets the job's id on it."""
    tracer = _sdk_tracer()
    if tracer is None:
        return _Enqueuing(None)
    attributes = {"queue_app.kind": kind, "queue_app.queue": queue_name}
    if count != 1:
        attributes["queue_app.count"] = count
    return _Enqueuing(tracer.start_span(f"enqueue {kind}", kind=SpanKind.PRODUCER, attributes=attributes))


def carrier():
    """The current trace context as W3C headers, to store with a new job (None: no trace)."""
    # The span first: without a provider tracing() costs several times as much (the API
    # looks its environment variable up), and outside a trace there is nothing to store.
    if trace is None or not trace.get_current_span().get_span_context().is_valid or not tracing():
        return None
    headers = {}
    propagate.inject(headers)
    return headers or None


# --- attempts ----------------------------------------------------------------------

# The parent context of the last carrier extracted, by its headers: the jobs of one
# bulk_enqueue share a carrier and a worker claims them together, and parsing the same
# traceparent again (propagate.extract, about 4 us) cost an attempt more than the rest of
# our part of its span. One entry, replaced whole (a tuple), so threads need no lock.
_last_parent = (None, None)


def _parent(carrier):
    """The context an attempt's span starts in: the job's enqueuing trace, or a new one."""
    global _last_parent
    if not carrier:
        return otel_context.Context()
    key = tuple(carrier.items())
    seen, parent = _last_parent
    if seen != key:
        # From an empty context, not the worker thread's: the job's trace, nothing else.
        parent = propagate.extract(carrier, context=otel_context.Context())
        _last_parent = (key, parent)
    return parent


# An Attempt's _outcome while its span waits for the write that settles its job (defer()),
# and once its span has ended.
_DEFERRED = object()
_FINISHED = object()


class Attempt:
    """One attempt's log fields and (with OpenTelemetry) its span, current while the
    attempt runs: ``with attempt(job, worker_id) as traced``, then ``traced.failed(exc)``
    and ``traced.settled(outcome)``. A class with start_span and attach, not generator
    context managers (ours, the SDK's start_as_current_span and its use_span): each of
    those cost about a microsecond a job, and the span path runs once per job.

    Its outcome (``queue_app.outcome``) is what settling the job recorded: its new state,
    or "lost" if the fence refused the write (the lease was recovered, cancelled or
    re-claimed); none if that write itself failed (its error is recorded): it may have
    committed with only its answer lost, or not, and the lease lapses to recovery. A job
    settled after the attempt ends (a batched acknowledgement, a chunk's) calls
    ``traced.defer()`` in it instead: the span stays open past it, its run time the
    handler's, until ``finish()`` gives the write's outcome (acknowledged(),
    unacknowledged())."""

    __slots__ = (
        "_context_token",
        "_current",
        "_job",
        "_outcome",
        "_run_seconds",
        "_started",
        "_token",
        "_worker_id",
        "span",
    )

    def __init__(self, job, worker_id, *, current=True):
        self._job = job
        self._worker_id = worker_id
        # Whether its span and log fields are the thread's while it runs (a chunk's are not).
        self._current = current
        self.span = None
        self._outcome = None

    def __enter__(self):
        job = self._job
        fields = {
            "job_id": job.id,
            "kind": job.kind,
            "queue": job.queue_name,
            "attempt": job.attempts,
            "worker_id": self._worker_id,
        }
        tracer = _sdk_tracer()
        if tracer is not None:
            claimed_at = getattr(job, "claimed_at", None) or timezone.now()
            self.span = tracer.start_span(
                f"run {job.kind}",
                context=_parent(job.trace_context),
                kind=SpanKind.CONSUMER,
                attributes={
                    "queue_app.kind": job.kind,
                    "queue_app.queue": job.queue_name,
                    "queue_app.job_id": job.id,
                    "queue_app.attempt": job.attempts,
                    "queue_app.worker_id": self._worker_id,
                    # ready (run_at) to claimed: how long it waited for a worker
                    "queue_app.wait_seconds": max(0.0, (claimed_at - job.run_at).total_seconds()),
                },
            )
            fields["span"] = self.span  # its trace id, for log lines (JobFields)
            if self._current:
                # Current while the handler runs: what it enqueues or calls joins this trace.
                self._context_token = otel_context.attach(trace.set_span_in_context(self.span))
            self._started = time.monotonic()
        if self._current:
            self._token = _fields.set(fields)
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._current:
            _fields.reset(self._token)
        span = self.span
        if span is None:
            return False
        if self._current:
            otel_context.detach(self._context_token)
        outcome = self._outcome
        if outcome is _DEFERRED:
            if exc is None:
                return False  # finish() ends it
            outcome = None  # ends now, the job unsettled: a finish() after is too late
            run_seconds = self._run_seconds
        elif outcome is _FINISHED:
            return False
        else:
            run_seconds = time.monotonic() - self._started
        self._outcome = _FINISHED
        # The handler's error is caught before it leaves the attempt (failed() records
        # it); one of the worker's own that escapes is recorded here, as the SDK would.
        if isinstance(exc, Exception):
            _record(span, exc)
        attributes = {"queue_app.run_seconds": run_seconds}
        if outcome is not None:
            attributes["queue_app.outcome"] = outcome
        span.set_attributes(attributes)  # one call, one lock: not one per attribute
        span.end()
        return False

    def failed(self, exc):
        """Record the handler's error on the span (call it in the except block)."""
        if self.span is not None:
            _record(self.span, exc)

    def settled(self, outcome):
        """Set the attempt's outcome: the job's new state, or "lost" if the lease was."""
        self._outcome = outcome or "lost"

    def defer(self):
        """The handler is done, its job is settled later: the span's run time ends now,
        the span itself at finish(), which may come after the attempt. Return self, or
        None if there is no span (nothing to finish)."""
        if self.span is None:
            return None
        self._run_seconds = time.monotonic() - self._started
        self._outcome = _DEFERRED
        return self

    def finish(self, outcome, exc=None):
        """End a deferred span once its job's settling write is done: with ``outcome``
        (as settled()), or with none and ``exc`` recorded, the error that write failed with."""
        if self._outcome is not _DEFERRED:
            return
        self._outcome = _FINISHED
        span = self.span
        attributes = {"queue_app.run_seconds": self._run_seconds}
        if exc is None:
            attributes["queue_app.outcome"] = outcome or "lost"
        else:
            _record(span, exc)
        span.set_attributes(attributes)
        span.end()


def acknowledged(attempts, completed):
    """End the deferred spans of ``attempts`` once their batched acknowledgement
    committed: "completed" if its job's id is in ``completed``, else "lost" (fenced out)."""
    for each in attempts:
        each.finish("completed" if each._job.id in completed else None)


def unacknowledged(attempts, exc):
    """End the deferred spans of ``attempts`` whose acknowledgement failed with ``exc``."""
    for each in attempts:
        each.finish(None, exc)


def attempt(job, worker_id):
    """Around one attempt of ``job``: its log fields, and (with OpenTelemetry) a span that
    continues the trace the job was enqueued in."""
    return Attempt(job, worker_id)


class Chunk:
    """Around a chunk's call (registry.chunking): an attempt span per job, each in its own
    enqueuing trace as attempt() makes it but none current (the one call serves them
    all), and the log fields of the call: its kind, queue and worker, no job id.
    ``traced[n]`` is job n's Attempt, for its failed() and settled(), or its finish()
    after ``traced.defer()``: the jobs settle after the call."""

    __slots__ = ("_attempts", "_token", "_worker_id", "jobs")

    def __init__(self, jobs, worker_id):
        self.jobs = jobs
        self._worker_id = worker_id
        self._attempts = [Attempt(job, worker_id, current=False) for job in jobs]

    def __getitem__(self, n):
        return self._attempts[n]

    def __iter__(self):
        return iter(self._attempts)

    def __enter__(self):
        for each in self._attempts:
            each.__enter__()
        first = self.jobs[0]
        fields = {"job_id": None, "kind": first.kind, "queue": first.queue_name, "attempt": None}
        self._token = _fields.set({**fields, "worker_id": self._worker_id})
        return self

    def __exit__(self, exc_type, exc, tb):
        _fields.reset(self._token)
        for each in self._attempts:
            each.__exit__(exc_type, exc, tb)
        return False

    def defer(self):
        """Attempt.defer() for each job: their spans stay open past the call."""
        for each in self._attempts:
            each.defer()


def chunk(jobs, worker_id):
    """Around one chunk's call of ``jobs`` (one kind): Chunk."""
    return Chunk(jobs, worker_id)
