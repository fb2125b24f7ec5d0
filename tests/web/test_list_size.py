"""List pages stay small whatever their rows hold: payloads, results and errors arrive as
bounded previews; the whole of them only on the job's own endpoint and page."""

import pytest
from django.contrib.auth.models import User
from django.test import Client

from queue_app.web import auth as api_auth
from tests.factories import DeadLetterFactory, JobFactory

pytestmark = pytest.mark.django_db

BIG = "x" * (1024 * 1024 - 64)  # about 1 MiB of JSON each
ROWS = 20


@pytest.fixture
def big_jobs(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_PAYLOAD_BYTES": 2 * 1024 * 1024}
    jobs = [
        JobFactory(
            payload={"blob": BIG}, last_error={"type": "Boom", "message": "m" * 5000, "traceback": BIG}
        )
        for _ in range(ROWS)
    ]
    for job in jobs[:5]:
        DeadLetterFactory(
            job=job, payload={"blob": BIG}, error={"type": "Boom", "message": "bad", "traceback": BIG}
        )
    return jobs


@pytest.fixture
def api():
    _, raw = api_auth.create("reader", can_write=False)
    return Client(headers={"X-API-Key": raw})


def test_a_page_of_megabyte_jobs_from_the_api_stays_small(api, big_jobs, settings):
    r = api.get("/api/jobs", {"limit": ROWS})

    assert r.status_code == 200
    items = r.json()["items"]
    assert len(items) == ROWS
    assert len(r.content) < 64 * 1024  # not ROWS MiB
    first = items[0]
    assert "payload" not in first and "last_error" not in first
    assert (
        first["payload_preview"] == ('{"blob": "' + BIG)[: settings.JOBQUEUE.get("LIST_PREVIEW_CHARS", 200)]
    )
    assert first["payload_size"] > 1024 * 1024 - 64
    assert first["last_error_message"] == "m" * 200


def test_the_jobs_own_endpoint_still_has_the_whole_payload(api, big_jobs):
    r = api.get(f"/api/jobs/{big_jobs[0].id}")

    assert r.json()["payload"] == {"blob": BIG}


def test_a_page_of_megabyte_dead_letters_stays_small(api, big_jobs):
    r = api.get("/api/dead-letters", {"limit": ROWS})

    assert r.status_code == 200
    assert len(r.json()["items"]) == 5
    assert len(r.content) < 16 * 1024
    assert r.json()["items"][0]["error_type"] == "Boom"


def test_the_dashboards_job_list_of_megabyte_jobs_stays_small(big_jobs):
    client = Client()
    client.force_login(User.objects.create_superuser("root"))

    r = client.get("/dashboard/jobs/")

    assert r.status_code == 200
    assert len(r.content) < 256 * 1024
    assert "m" * 80 not in r.content.decode()  # the message is cut (80 characters shown)
