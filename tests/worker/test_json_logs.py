"""LOG_FORMAT=json as an operator turns it on: a real worker's lines are JSON objects
with the job's fields, and the worker runs without OpenTelemetry installed."""

import json

import pytest

from queue_app import enqueue
from queue_app.models import Job, State
from tests.worker_support import manage

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_worker_with_json_logs_writes_each_line_as_json_with_the_jobs_fields(tmp_path):
    # A package named opentelemetry that cannot be imported, first on the path: the
    # worker must run (and log) as on a site without the packages.
    (tmp_path / "opentelemetry").mkdir()
    (tmp_path / "opentelemetry" / "__init__.py").write_text("raise ImportError('not installed')\n")
    job = enqueue("flaky", {"path": str(tmp_path / "tries"), "fails": 1}, queue_name="emails", max_attempts=1)
    proc = manage(
        "runworker",
        "--import",
        "tests.worker_support",
        "--poll",
        "50ms",
        "--burst",
        "--name",
        "json-logs",
        extra_env={"LOG_FORMAT": "json", "PYTHONPATH": str(tmp_path)},
    )
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert Job.objects.get(id=job.id).state == State.DEAD_LETTER
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    (failed,) = [line for line in lines if line["message"].startswith("failed id=")]
    assert failed["levelname"] == "INFO" and failed["name"] == "queue_app"
    assert (failed["job_id"], failed["kind"], failed["queue"], failed["attempt"]) == (
        job.id,
        "flaky",
        "emails",
        1,
    )
    assert failed["worker_id"].startswith("json-logs")
    assert failed["trace_id"] is None
    # The worker's own lines (no job) still name it.
    assert all(line["worker_id"] for line in lines if line["name"] == "queue_app")
