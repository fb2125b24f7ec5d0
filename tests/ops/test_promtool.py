"""/metrics checked by Prometheus' own linter, `promtool check metrics` (Debian package
prometheus); skipped where promtool is not installed."""

import shutil
import subprocess

import pytest

from queue_app import enqueue
from queue_app.models import Worker
from queue_app.worker.execution import run_one
from tests.factories import DeadLetterFactory, JobFactory

PROMTOOL = shutil.which("promtool")

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (apt-get install prometheus)"),
]


def promtool_check(text):
    return subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )


def test_promtool_accepts_the_metrics_of_a_busy_queue(client):
    JobFactory.create_batch(3, kind="echo")
    JobFactory(kind="add", queue_name="mail", leased=True)
    DeadLetterFactory(job__kind="boom")
    enqueue("echo", {"said": "hi"}, queue_name="fast")
    assert run_one(worker_id="w-promtool", queues=["fast"]).state == "completed"
    Worker.objects.create(name="host-1:42", host="host-1", pid=42)
    response = client.get("/metrics")
    assert response.status_code == 200
    checked = promtool_check(response.content.decode())
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout + checked.stderr == ""


def test_promtool_is_a_real_check_that_refuses_broken_exposition():
    checked = promtool_check("# TYPE jobqueue_jobs gauge\njobqueue_jobs{state=pending} 1\n")
    assert checked.returncode != 0
