"""A trace across processes: a job enqueued inside a span here runs in a real worker
(its SDK set up by OTEL_SETUP) whose attempt span is in the same trace."""

import json

import pytest
from opentelemetry import trace

from queue_app import enqueue
from queue_app.models import Job, State
from tests import sample_tasks as tasks
from tests.worker_support import manage

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_real_workers_attempt_spans_continue_the_enqueuing_trace(spans, tmp_path):
    exported = tmp_path / "spans.jsonl"
    with trace.get_tracer("test").start_as_current_span("request") as request:
        native = enqueue("boom", queue_name="emails", max_attempts=1)
        task = tasks.add.enqueue(2, b=3)
    proc = manage(
        "runworker",
        "--import",
        "tests.worker_support",
        "--poll",
        "50ms",
        "--burst",
        "--batch",
        "10",
        extra_env={
            "OTEL_SETUP": "tests.otel_setup.configure",
            "OTEL_SPANS_FILE": str(exported),
            "JOBQUEUE_TASK_MODULES": "tests",
        },
    )
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert Job.objects.get(id=native.id).state == State.DEAD_LETTER
    runs = {
        s["attributes"]["queue_app.job_id"]: s for s in map(json.loads, exported.read_text().splitlines())
    }
    trace_id = f"0x{request.get_span_context().trace_id:032x}"
    failed, done = runs[native.id], runs[int(task.id)]
    assert failed["context"]["trace_id"] == done["context"]["trace_id"] == trace_id
    assert failed["name"] == "run boom" and failed["attributes"]["queue_app.queue"] == "emails"
    assert failed["attributes"]["queue_app.outcome"] == "dead_letter"
    assert failed["status"]["status_code"] == "ERROR"
    assert [e["name"] for e in failed["events"]] == ["exception"]
    assert done["attributes"]["queue_app.outcome"] == "completed", Job.objects.get(id=int(task.id)).last_error
    assert done["attributes"]["queue_app.attempt"] == 1
