"""A job's crashes (poison-pill quarantine) show in the API's job detail, the CLI's
history --json and the dashboard's job page."""

import json

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from queue_app import enqueue
from queue_app.core import events, transitions
from queue_app.models import KindCrashes
from queue_app.ops import metrics
from queue_app.web import auth as api_auth
from tests.factories import make_staff

pytestmark = pytest.mark.django_db


@pytest.fixture
def crashed():
    job = enqueue("crashy", max_attempts=5)
    [claimed] = transitions.claim("w1")
    error = events.error("WorkerCrashed", "the worker process running the job exited with status 1")
    transitions.fail(job.id, worker_id="w1", attempt=claimed.attempts, error=error, crashed=True)
    return job


def test_the_api_job_detail_says_how_many_times_it_crashed(crashed):
    api = Client(headers={"X-API-Key": api_auth.create("script")[1]})

    body = api.get(f"/api/jobs/{crashed.id}").json()

    assert body["crashes"] == 1


def test_history_json_says_how_many_times_it_crashed(crashed, capsys):
    call_command("history", str(crashed.id), "--json")

    assert json.loads(capsys.readouterr().out)["job"]["crashes"] == 1


def test_the_dashboard_job_page_shows_its_crashes(crashed, client):
    client.force_login(make_staff("viewer", "queue_app.view_job"))

    html = client.get(reverse("queue_app_dashboard:job", args=[crashed.id])).content.decode()

    assert "<dt>Crashes</dt><dd>1 " in html


def crash_until_poisoned(kind="crashy", crashes=3):
    """Crash one job of ``kind`` MAX_CRASHES (3) times: it ends dead-lettered as poison."""
    job = enqueue(kind, max_attempts=10)
    for n in range(crashes):
        [claimed] = transitions.claim("w1", kinds=[kind])
        error = events.error("WorkerCrashed", "the worker process running the job exited with status 1")
        transitions.fail(job.id, worker_id="w1", attempt=claimed.attempts, error=error, crashed=True)
        if n < crashes - 1:
            transitions.retry_now(job.id)  # past its backoff
    return job


def test_crashes_and_poison_pills_per_kind_are_counted_and_exported_by_metrics():
    crash_until_poisoned()
    ordinary = enqueue("boom")
    [claimed] = transitions.claim("w1", kinds=["boom"])
    transitions.fail(ordinary.id, worker_id="w1", attempt=claimed.attempts, error=events.error("Boom", "x"))

    text = metrics.render().decode()

    assert 'jobqueue_job_crashes_total{kind="crashy"} 3.0' in text
    assert 'jobqueue_poison_jobs_total{kind="crashy"} 1.0' in text
    assert 'jobqueue_job_crashes_total{kind="boom"} 0.0' in text  # a failure is no crash
    assert KindCrashes.objects.get(kind="crashy").last_crash_at is not None


def test_the_dashboard_queues_page_shows_crashes_per_kind(client):
    crash_until_poisoned()
    client.force_login(make_staff("viewer", "queue_app.view_job"))

    html = client.get(reverse("queue_app_dashboard:queues")).content.decode()

    assert 'data-crashes="crashy"' in html
    assert '<td class="n bad" data-count="crashes">3</td>' in html
    assert '<td class="n bad" data-count="poisoned">1</td>' in html
