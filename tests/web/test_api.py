import json

import pytest
from django.test import Client
from openapi_spec_validator import validate

from queue_app.core import transitions
from queue_app.models import Event, Job, Worker
from queue_app.web import auth as api_auth
from tests.factories import DeadLetterFactory, JobFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def key():
    return api_auth.create("script")[1]


@pytest.fixture
def api(key):
    return Client(headers={"X-API-Key": key})


def post(client, url, data=None, **extra):
    body = data if isinstance(data, str) else json.dumps(data)
    return client.post(url, body, content_type="application/json", **extra)


def test_post_jobs_enqueues_with_every_option_and_returns_201(api):
    r = post(
        api,
        "/api/jobs",
        {
            "kind": "echo",
            "payload": {"to": "a@example.com"},
            "queue_name": "mail",
            "priority": 20,
            "run_after": 60,
            "max_attempts": 5,
            "idempotency_key": "k-1",
            "timeout": 30,
        },
    )
    assert r.status_code == 201, r.content
    job = Job.objects.get(id=r.json()["id"])
    assert (job.queue_name, job.priority, job.max_attempts, job.timeout) == ("mail", 20, 5, 30.0)
    assert r.json()["status"] == "scheduled"
    assert Event.objects.filter(job=job, type="enqueued").count() == 1


def test_post_jobs_returns_200_and_the_same_job_on_an_idempotency_match(api):
    first = post(api, "/api/jobs", {"kind": "echo", "idempotency_key": "same"})
    again = post(api, "/api/jobs", {"kind": "echo", "idempotency_key": "same"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert Job.objects.count() == 1


@pytest.mark.parametrize(
    "body, field",
    [
        ({"kind": "echo", "priority": 500}, "priority"),
        ({"kind": "echo", "priority": "high"}, "priority"),
        ({"kind": "bad kind!"}, "kind"),
        ({"payload": {}}, "kind"),
        ({"kind": "echo", "colour": "red"}, "colour"),
        ({"kind": "echo", "run_at": "2030-01-01T00:00:00"}, "run_at"),
        ({"kind": "echo", "run_at": "2030-01-01T00:00:00Z", "run_after": 5}, "run_at"),
        ({"kind": "echo", "max_attempts": 0}, "max_attempts"),
        ({"kind": "echo", "timeout": -1}, "timeout"),
        ({"kind": "echo", "payload": {"a": "nul\u0000"}}, "payload"),
        ({"kind": "echo", "idempotency_key": ""}, "idempotency_key"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_writes_nothing(api, body, field):
    r = post(api, "/api/jobs", body)
    assert r.status_code == 400, r.content
    assert r.json()["field"] == field
    assert Job.objects.count() == 0


@pytest.mark.parametrize("raw", ["not json", "[1, 2]", '{"kind": "echo", "payload": NaN}', '"\\ud800"', ""])
def test_unparseable_bodies_are_400_not_500(api, raw):
    r = post(api, "/api/jobs", raw)
    assert r.status_code == 400, r.content
    assert "error" in r.json()


def test_a_body_over_the_limit_is_413(api, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "API_MAX_BODY_BYTES": 100}
    r = post(api, "/api/jobs", {"kind": "echo", "payload": {"x": "y" * 200}})
    assert r.status_code == 413
    assert Job.objects.count() == 0


def test_bulk_enqueues_all_or_nothing(api):
    ok = post(
        api, "/api/jobs/bulk", {"jobs": [{"kind": "echo"}, {"kind": "add", "payload": {"a": 1, "b": 2}}]}
    )
    assert ok.status_code == 201
    assert [j["kind"] for j in ok.json()] == ["echo", "add"]
    bad = post(api, "/api/jobs/bulk", {"jobs": [{"kind": "echo"}, {"kind": "echo", "priority": 999}]})
    assert bad.status_code == 400
    assert bad.json()["field"] == "priority" and "job 1" in bad.json()["error"]
    assert post(api, "/api/jobs/bulk", {"jobs": []}).json()["field"] == "jobs"
    assert Job.objects.count() == 2


def test_list_filters_and_pages_newest_first(api):
    old = JobFactory(kind="echo")
    JobFactory(kind="add", queue_name="mail")
    newer = JobFactory(kind="echo")
    JobFactory(kind="echo", leased=True)
    page = api.get("/api/jobs", {"state": "pending", "kind": "echo", "limit": 1}).json()
    assert [j["id"] for j in page["items"]] == [newer.id]
    page2 = api.get(
        "/api/jobs", {"state": "pending", "kind": "echo", "limit": 1, "before": page["next_before"]}
    ).json()
    assert [j["id"] for j in page2["items"]] == [old.id] and page2["next_before"] is None
    assert [j["queue_name"] for j in api.get("/api/jobs", {"queue": "mail"}).json()["items"]] == ["mail"]


@pytest.mark.parametrize(
    "query", ["state=bogus", "limit=0", "before=-1", "kind=%00", "before=99999999999999999999"]
)
def test_bad_filters_are_400(api, query):
    r = api.get(f"/api/jobs?{query}")
    assert r.status_code == 400, r.content


def test_get_job_includes_its_events(api):
    job = transitions.cancel(post(api, "/api/jobs", {"kind": "echo"}).json()["id"])
    body = api.get(f"/api/jobs/{job.id}").json()
    assert [e["type"] for e in body["events"]] == ["enqueued", "cancelled"]


def test_unknown_job_is_404_and_huge_ids_are_refused_cleanly(api):
    assert api.get("/api/jobs/987654").status_code == 404
    assert api.get("/api/jobs/987654").json()["error"] == "job 987654 does not exist"
    assert api.get("/api/jobs/99999999999999999999").status_code == 400
    assert api.delete("/api/jobs/987654").status_code == 404


def test_delete_cancels_a_pending_job_and_is_409_once_finished(api):
    job = JobFactory()
    r = api.delete(f"/api/jobs/{job.id}")
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert Event.objects.get(job=job, type="cancelled").worker == "api-key:script"
    again = api.delete(f"/api/jobs/{job.id}")
    assert again.status_code == 409 and again.json()["state"] == "cancelled"


def test_wrong_method_is_405(api):
    assert api.put("/api/jobs").status_code == 405
    r = api.get("/api/jobs/bulk")  # the bulk endpoint takes POST only
    assert r.status_code == 405 and "allowed: POST" in r.json()["error"]


def test_requeue_brings_a_dead_job_back_and_is_409_for_a_pending_one(api):
    letter = DeadLetterFactory()
    r = post(api, f"/api/jobs/{letter.job_id}/requeue", {"max_attempts": 7})
    assert r.status_code == 200, r.content
    assert (r.json()["state"], r.json()["max_attempts"]) == ("pending", 7)
    assert post(api, f"/api/jobs/{letter.job_id}/requeue").status_code == 409
    assert post(api, f"/api/jobs/{letter.job_id}/requeue", {"max_attempts": 0}).status_code == 400


def test_dead_letters_list_and_replay(api):
    letter = DeadLetterFactory()
    listed = api.get("/api/dead-letters").json()["items"]
    assert [d["id"] for d in listed] == [letter.id]
    r = post(api, f"/api/dead-letters/{letter.id}/replay")
    assert r.status_code == 200 and r.json()["state"] == "pending"
    assert api.get("/api/dead-letters").json()["items"] == []
    assert [d["id"] for d in api.get("/api/dead-letters?resolved=true").json()["items"]] == [letter.id]
    assert post(api, f"/api/dead-letters/{letter.id}/replay").status_code == 409
    assert post(api, "/api/dead-letters/987654/replay").status_code == 404


def test_stats_counts_jobs_and_events(api):
    post(api, "/api/jobs", {"kind": "echo"})
    JobFactory(dead=True)
    body = api.get("/api/stats").json()
    assert body["jobs"]["pending"] == 1 and body["jobs"]["dead_letter"] == 1
    assert body["jobs_by_kind"]["echo"]["pending"] == 1
    assert body["events"]["enqueued"] == 1


def test_workers_lists_registered_workers(api):
    Worker.objects.create(name="host-1:42", host="host-1", pid=42)
    assert [w["name"] for w in api.get("/api/workers").json()] == ["host-1:42"]


def test_quiet_and_stop_over_the_api_ask_a_running_worker_once_and_refuse_a_second_time(api):
    worker = Worker.objects.create(name="host-1:42", host="host-1", pid=42)
    quiet = api.post(f"/api/workers/{worker.id}/quiet")
    assert quiet.status_code == 200 and quiet.json()["quiet_requested_at"] is not None
    again = api.post(f"/api/workers/{worker.id}/quiet")
    assert again.status_code == 409 and "already told" in again.json()["error"]
    stop = api.post(f"/api/workers/{worker.id}/stop")
    assert stop.status_code == 200 and stop.json()["stop_requested_at"] is not None
    assert api.post(f"/api/workers/{worker.id}/stop").status_code == 409
    assert api.post("/api/workers/999999/quiet").status_code == 404


def test_openapi_schema_lists_every_endpoint_and_the_docs_page_renders(api):
    schema = api.get("/api/openapi.json").json()
    assert schema["openapi"].startswith("3.")
    # Valid against the OpenAPI specification itself (raises with the offending path).
    validate(schema)
    assert {
        "/api/jobs",
        "/api/jobs/bulk",
        "/api/jobs/{job_id}",
        "/api/jobs/{job_id}/requeue",
        "/api/stats",
        "/api/dead-letters",
        "/api/dead-letters/{letter_id}/replay",
        "/api/workers",
    } <= set(schema["paths"])
    assert set(schema["paths"]["/api/jobs/{job_id}"]) == {"get", "delete"}
    assert api.get("/api/docs").status_code == 200
