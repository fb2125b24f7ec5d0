"""List pages stay small whatever their rows hold: payloads, results and errors arrive as
bounded previews; the whole of them only on the job's own endpoint and page."""

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.test import Client, override_settings

from queue_app.models import Job
from queue_app.web import auth as api_auth
from tests.factories import DeadLetterFactory, JobFactory
from tests.support import shared_rows

pytestmark = pytest.mark.django_db

BIG = "x" * (1024 * 1024 - 64)  # about 1 MiB of JSON each
ROWS = 20


def _holding(row, **big_fields):
    """``row`` (a factory's unsaved build) with ``big_fields`` set: given to the factory
    instead, each MiB-sized value would cost a tenth of a second of factory_boy's own
    bookkeeping (it formats the values it resolves) per row."""
    for name, value in big_fields.items():
        setattr(row, name, value)
    return row


@pytest.fixture(scope="class")
def _big_rows(django_db_setup, django_db_blocker):
    # Written once for the class (40 MiB of rows, seconds on a loaded machine): its tests only read.
    with (
        shared_rows(django_db_blocker),
        override_settings(JOBQUEUE={**django_settings.JOBQUEUE, "MAX_PAYLOAD_BYTES": 2 * 1024 * 1024}),
    ):
        jobs = [
            _holding(
                JobFactory.build(),
                payload={"blob": BIG},
                last_error={"type": "Boom", "message": "m" * 5000, "traceback": BIG},
            )
            for _ in range(ROWS)
        ]
        for job in jobs:
            job.save()
        for job in jobs[:5]:
            _holding(
                DeadLetterFactory.build(job=job),
                payload={"blob": BIG},
                error={"type": "Boom", "message": "bad", "traceback": BIG},
            ).save()
        yield jobs


@pytest.fixture
def big_jobs(settings, _big_rows):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_PAYLOAD_BYTES": 2 * 1024 * 1024}
    return _big_rows


@pytest.fixture
def api():
    _, raw = api_auth.create("reader", scopes=["read"])
    return Client(headers={"X-API-Key": raw})


class TestAPageOfMegabyteRows:
    """Twenty jobs of about 1 MiB each (five of them dead letters), written once for the class."""

    def test_a_page_of_megabyte_jobs_from_the_api_stays_small(self, api, big_jobs, settings):
        r = api.get("/api/jobs", {"limit": ROWS})

        assert r.status_code == 200
        items = r.json()["items"]
        assert len(items) == ROWS
        assert len(r.content) < 64 * 1024  # not ROWS MiB
        first = items[0]
        assert "payload" not in first and "last_error" not in first
        assert (
            first["payload_preview"]
            == ('{"blob": "' + BIG)[: settings.JOBQUEUE.get("LIST_PREVIEW_CHARS", 200)]
        )
        assert first["payload_size"] > 1024 * 1024 - 64
        assert first["last_error_message"] == "m" * 200

    def test_the_jobs_own_endpoint_still_has_the_whole_payload(self, api, big_jobs):
        r = api.get(f"/api/jobs/{big_jobs[0].id}")

        assert r.json()["payload"] == {"blob": BIG}

    def test_a_page_of_megabyte_dead_letters_stays_small(self, api, big_jobs):
        r = api.get("/api/dead-letters", {"limit": ROWS})

        assert r.status_code == 200
        assert len(r.json()["items"]) == 5
        assert len(r.content) < 16 * 1024
        assert r.json()["items"][0]["error_type"] == "Boom"

    def test_the_dashboards_job_list_of_megabyte_jobs_stays_small(self, big_jobs):
        client = Client()
        client.force_login(User.objects.create_superuser("root"))

        r = client.get("/dashboard/jobs/")

        assert r.status_code == 200
        assert len(r.content) < 256 * 1024
        assert "m" * 80 not in r.content.decode()  # the message is cut (80 characters shown)


def _queries(call):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        response = call()
    assert response.status_code in (200, 201), response.content[:200]
    return len(captured)


@pytest.mark.parametrize("path", ["/api/jobs", "/api/dead-letters"])
def test_a_list_asks_the_database_the_same_number_of_times_whatever_its_length(api, path):
    JobFactory.create_batch(2)
    DeadLetterFactory.create_batch(2)
    api.get(path)  # the key's first use records it (one UPDATE a minute)
    few = _queries(lambda: api.get(path))
    JobFactory.create_batch(30)
    DeadLetterFactory.create_batch(30)

    many = _queries(lambda: api.get(path))

    assert many == few


def test_a_bulk_enqueue_asks_the_pause_table_once_not_once_per_job(settings):
    import json

    _, raw = api_auth.create("writer")
    client = Client(headers={"X-API-Key": raw})

    def bulk(n):
        body = json.dumps({"jobs": [{"kind": "echo"} for _ in range(n)]})
        return lambda: client.post("/api/jobs/bulk", body, content_type="application/json")

    bulk(1)()  # the key's first use records it (one UPDATE a minute)
    few, many = _queries(bulk(2)), _queries(bulk(40))

    assert many == few


@pytest.mark.slow
def test_the_issues_figure_150_jobs_of_one_mib_make_a_small_page(api, settings):
    # The finding: 150 jobs of 1 MiB made a 150 MiB response. Rows in batches of 5 so no
    # statement passes MariaDB's 16 MiB max_allowed_packet.
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_PAYLOAD_BYTES": 2 * 1024 * 1024}
    Job.objects.bulk_create(
        [_holding(JobFactory.build(), payload={"blob": BIG}) for _ in range(150)], batch_size=5
    )
    r = api.get("/api/jobs", {"limit": 150})

    assert r.status_code == 200
    assert len(r.json()["items"]) == 150
    assert len(r.content) < 128 * 1024  # not 150 MiB
