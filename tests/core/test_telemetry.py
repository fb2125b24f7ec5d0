"""Traces from enqueue to each attempt (OpenTelemetry's SDK, in memory) and the job
fields every log line of an attempt carries."""

import logging

import pytest
from opentelemetry import trace

from queue_app import bulk_enqueue, enqueue
from queue_app.core import telemetry
from queue_app.handlers import registry
from queue_app.models import Job
from queue_app.worker import execution
from tests import sample_tasks as tasks

pytestmark = pytest.mark.django_db


def _run(job_id):
    job = execution.run_one()
    assert job is not None and job.id == job_id
    return job


def _one(spans, name):
    (span,) = [s for s in spans.get_finished_spans() if s.name == name]
    return span


def test_an_attempt_continues_the_trace_its_job_was_enqueued_in(spans):
    with trace.get_tracer("test").start_as_current_span("request") as request:
        job = enqueue("echo", {"x": 1}, queue_name="emails")
    assert Job.objects.get(id=job.id).trace_context["traceparent"].split("-")[1] == format(
        request.get_span_context().trace_id, "032x"
    )
    _run(job.id)
    enqueued, run = _one(spans, "enqueue echo"), _one(spans, "run echo")
    assert enqueued.parent.span_id == request.get_span_context().span_id
    assert run.context.trace_id == request.get_span_context().trace_id
    assert run.parent.span_id == enqueued.context.span_id
    assert enqueued.attributes["queue_app.job_id"] == job.id
    attrs = run.attributes
    assert (attrs["queue_app.kind"], attrs["queue_app.queue"]) == ("echo", "emails")
    assert (attrs["queue_app.job_id"], attrs["queue_app.attempt"]) == (job.id, 1)
    assert attrs["queue_app.outcome"] == "completed"
    assert attrs["queue_app.wait_seconds"] >= 0
    assert run.kind == trace.SpanKind.CONSUMER


def test_a_failed_attempt_records_its_error_and_outcome_on_its_span(spans):
    with trace.get_tracer("test").start_as_current_span("request"):
        job = enqueue("boom", max_attempts=1)
    _run(job.id)
    run = _one(spans, "run boom")
    assert run.attributes["queue_app.outcome"] == "dead_letter"
    assert run.status.status_code == trace.StatusCode.ERROR
    (event,) = run.events
    assert event.name == "exception"
    assert event.attributes["exception.type"].endswith("Boom")


def test_a_task_enqueued_in_a_trace_runs_in_that_trace(spans):
    with trace.get_tracer("test").start_as_current_span("request") as request:
        result = tasks.add.enqueue(2, b=3)
    _run(int(result.id))
    run = _one(spans, "run tests.sample_tasks.add")
    assert run.context.trace_id == request.get_span_context().trace_id
    assert run.attributes["queue_app.outcome"] == "completed"


def test_a_bulk_enqueue_is_one_span_whose_jobs_all_continue_it(spans):
    with trace.get_tracer("test").start_as_current_span("request") as request:
        jobs = bulk_enqueue([{"kind": "echo"}, {"kind": "echo"}])
    (bulk,) = [s for s in spans.get_finished_spans() if s.name == "enqueue echo"]
    assert bulk.attributes["queue_app.count"] == 2
    for job in jobs:
        _run(job.id)
    runs = [s for s in spans.get_finished_spans() if s.name == "run echo"]
    assert {s.context.trace_id for s in runs} == {request.get_span_context().trace_id}
    assert {s.parent.span_id for s in runs} == {bulk.context.span_id}


def test_a_job_enqueued_outside_any_trace_starts_one_at_its_enqueue(spans):
    job = enqueue("echo")
    _run(job.id)
    enqueued, run = _one(spans, "enqueue echo"), _one(spans, "run echo")
    assert enqueued.parent is None
    assert run.parent.span_id == enqueued.context.span_id


def test_jobs_enqueued_in_different_traces_each_run_in_their_own(spans):
    # first, second, then first again: each attempt's parent is its own job's enqueue
    # span, whatever the attempt before it continued (telemetry keeps the last one parsed).
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("first") as first:
        a = enqueue("echo")
    with tracer.start_as_current_span("second") as second:
        b = enqueue("echo")
    with trace.use_span(first):
        c = enqueue("echo")
    for job in (a, b, c):
        _run(job.id)
    enqueues = {
        s.attributes["queue_app.job_id"]: s for s in spans.get_finished_spans() if s.name == "enqueue echo"
    }
    runs = {s.attributes["queue_app.job_id"]: s for s in spans.get_finished_spans() if s.name == "run echo"}
    for job, request in ((a, first), (b, second), (c, first)):
        assert runs[job.id].context.trace_id == request.get_span_context().trace_id
        assert runs[job.id].parent.span_id == enqueues[job.id].context.span_id


def test_a_job_its_handler_enqueues_joins_the_attempts_trace(spans):
    registry.register("spawn", lambda payload: enqueue("echo").id)
    job = enqueue("spawn")
    _run(job.id)
    run, spawned = _one(spans, "run spawn"), _one(spans, "enqueue echo")
    assert spawned.parent.span_id == run.context.span_id
    assert spawned.context.trace_id == run.context.trace_id


def test_an_error_of_the_workers_own_that_leaves_an_attempt_is_recorded_on_its_span(spans):
    job = Job.objects.get(id=enqueue("echo").id)
    with pytest.raises(RuntimeError), telemetry.attempt(job, "w-1"):
        raise RuntimeError("the database went away")
    run = _one(spans, "run echo")
    assert run.status.status_code == trace.StatusCode.ERROR
    assert run.status.description == "RuntimeError: the database went away"
    assert [e.name for e in run.events] == ["exception"]
    assert "queue_app.outcome" not in run.attributes and run.attributes["queue_app.run_seconds"] >= 0
    assert run.end_time is not None


class _Keep(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []
        self.addFilter(telemetry.JobFields())

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def records():
    keep = _Keep()
    logger = logging.getLogger("queue_app")
    logger.addHandler(keep)
    yield keep.records
    logger.removeHandler(keep)


def test_log_lines_of_an_attempt_carry_its_job_worker_and_trace(spans, records):
    with trace.get_tracer("test").start_as_current_span("request") as request:
        job = enqueue("boom", queue_name="emails", max_attempts=1)
    execution.run_one(worker_id="w-logs")
    (failed,) = [r for r in records if r.getMessage().startswith("failed id=")]
    assert (failed.job_id, failed.kind, failed.queue, failed.attempt) == (job.id, "boom", "emails", 1)
    assert failed.worker_id == "w-logs"
    assert failed.trace_id == format(request.get_span_context().trace_id, "032x")


def test_a_transitions_log_line_outside_an_attempt_names_its_job(records, settings):
    logging.getLogger("queue_app").setLevel(logging.DEBUG)
    try:
        job = enqueue("echo", queue_name="emails")
    finally:
        logging.getLogger("queue_app").setLevel(logging.NOTSET)
    (line,) = [r for r in records if r.getMessage().startswith("enqueued id=")]
    assert (line.job_id, line.kind, line.queue, line.attempt) == (job.id, "echo", "emails", 0)
    assert line.trace_id is None


def test_each_job_of_a_chunk_has_its_attempt_span_in_its_own_trace(spans, records):
    from queue_app.worker import loop

    class Bounced(Exception):
        pass

    def handle(payloads):
        logging.getLogger("queue_app").warning("sending %s", len(payloads))
        return [Bounced("no") if p["n"] == 2 else p["n"] for p in payloads]

    registry.register("mail", handle, chunk=3)
    traces = {}
    for n in (1, 2, 3):
        with trace.get_tracer("test").start_as_current_span(f"request {n}") as request:
            job = enqueue("mail", {"n": n}, max_attempts=1)
        traces[job.id] = request.get_span_context().trace_id

    outcomes = dict(loop.run_once(loop.Options(batch=3), worker_id="w-chunk"))

    runs = [s for s in spans.get_finished_spans() if s.name == "run mail"]
    assert sorted(s.attributes["queue_app.job_id"] for s in runs) == sorted(traces)
    for span in runs:
        job_id = span.attributes["queue_app.job_id"]
        assert span.context.trace_id == traces[job_id]  # the trace it was enqueued in
        assert span.attributes["queue_app.outcome"] == outcomes[job_id]
        failed = span.status.status_code == trace.StatusCode.ERROR
        assert failed == (outcomes[job_id] == "dead_letter"), (job_id, outcomes)
    assert sorted(outcomes.values()) == ["completed", "completed", "dead_letter"]
    # The call's log line names the chunk's kind, queue and worker, and no one job.
    (line,) = [r for r in records if r.getMessage() == "sending 3"]
    assert (line.job_id, line.kind, line.queue, line.worker_id) == (None, "mail", "default", "w-chunk")
