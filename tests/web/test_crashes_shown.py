"""A job's crashes (poison-pill quarantine) show in the API's job detail, the CLI's
history --json and the dashboard's job page."""

import json

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from queue_app import enqueue
from queue_app.core import events, transitions
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
