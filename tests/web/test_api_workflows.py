"""The API's workflow endpoints: groups (POST, GET /api/groups/{id}) and depends_on."""

import json

import pytest
from django.test import Client

from queue_app.models import Job, JobGroup, State
from queue_app.web import auth as api_auth
from queue_app.worker.execution import run_one

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    return Client(headers={"X-API-Key": api_auth.create("script")[1]})


def post(client, url, data):
    return client.post(url, json.dumps(data), content_type="application/json")


def test_post_a_group_and_read_its_progress_as_members_end(api):
    r = post(
        api,
        "/api/groups",
        {
            "jobs": [{"kind": "echo"}, {"kind": "echo", "priority": 5}],
            "callback": {"kind": "echo"},
            "name": "batch",
        },
    )
    assert r.status_code == 201, r.content
    body = r.json()
    assert (body["status"], body["total"], body["ended"], body["name"]) == ("open", 2, 0, "batch")
    assert [m["status"] for m in body["members"]] == ["ready", "ready"]
    run_one()
    body = api.get(f"/api/groups/{body['id']}").json()
    assert (body["ended"], body["completed"], body["callback_job"]) == (1, 1, None)
    run_one()
    body = api.get(f"/api/groups/{body['id']}").json()
    assert body["status"] == "succeeded" and body["callback_job"] is not None


def test_a_bad_group_is_a_400_and_writes_nothing_and_an_unknown_group_is_404(api):
    r = post(api, "/api/groups", {"jobs": [{"kind": "echo"}], "policy": "never"})
    assert r.status_code == 400
    r = post(api, "/api/groups", {"jobs": [{"kind": "echo"}], "callback": {"payload": {}}})
    assert r.status_code == 400 and "callback" in r.json()["error"]
    assert not Job.objects.exists() and not JobGroup.objects.exists()
    r = api.get("/api/groups/99999")
    assert r.status_code == 404 and r.json()["error"] == "group 99999 does not exist"


def test_post_jobs_takes_depends_on_and_refuses_unknown_ids(api):
    a = post(api, "/api/jobs", {"kind": "echo"}).json()
    r = post(api, "/api/jobs", {"kind": "echo", "depends_on": [a["id"]], "on_dependency_failure": "run"})
    assert r.status_code == 201 and r.json()["state"] == State.WAITING
    r = post(api, "/api/jobs", {"kind": "echo", "depends_on": [987654]})
    assert r.status_code == 400 and "no job with id 987654" in r.json()["error"]
    assert Job.objects.count() == 2


def test_the_schema_lists_the_group_endpoints(api):
    paths = api.get("/api/openapi.json").json()["paths"]
    assert set(paths["/api/groups/{group_id}"]) == {"get"}
    assert set(paths["/api/groups"]) == {"post"}


def test_post_jobs_takes_an_ordering_key_and_the_schema_documents_it(api):
    a = post(api, "/api/jobs", {"kind": "echo", "ordering_key": "acct:1", "ordering_blocks": True}).json()
    r = post(api, "/api/jobs", {"kind": "echo", "ordering_key": "acct:1", "ordering_blocks": True})
    assert r.status_code == 201 and r.json()["state"] == State.WAITING
    assert r.json()["ordering_key"] == "acct:1" and a["state"] == State.PENDING
    why = api.get(f"/api/jobs/{r.json()['id']}").json()["why"]
    assert why["text"] == f"it waits for job {a['id']}, ahead of it on ordering key 'acct:1'"
    r = post(api, "/api/jobs", {"kind": "echo", "ordering_blocks": True})
    assert r.status_code == 400 and "ordering_blocks needs an ordering_key" in r.json()["error"]
    schema = api.get("/api/openapi.json").json()["components"]["schemas"]["JobIn"]["properties"]
    assert {"ordering_key", "ordering_blocks"} <= set(schema)
