"""The JSON API takes the debounce and unique options and says so in its schema."""

import json

import pytest
from django.test import Client

from queue_app.models import AdmissionKey, Event, Job
from queue_app.web import auth as api_auth

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    return Client(headers={"X-API-Key": api_auth.create("script")[1]})


def post(client, body, url="/api/jobs"):
    return client.post(url, json.dumps(body), content_type="application/json")


def test_a_debounced_post_returns_200_with_the_updated_job_even_when_strict(api):
    body = {"kind": "echo", "payload": {"n": 1}, "debounce_key": "k", "debounce_for": "30s", "strict": True}
    first = post(api, body)
    assert first.status_code == 201
    again = post(api, {**body, "payload": {"n": 2}, "debounce_max_wait": 60})
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"] and again.json()["payload"] == {"n": 2}
    assert again.json()["run_at"] > first.json()["run_at"]
    assert Event.objects.filter(type="debounced").count() == 1


def test_a_unique_key_match_answers_200_or_409_naming_the_key_when_strict(api):
    body = {"kind": "echo", "unique_key": "sync:1", "unique_while": ["pending"]}
    first = post(api, body)
    assert first.status_code == 201
    assert post(api, body).json()["id"] == first.json()["id"]
    strict = post(api, {**body, "strict": True})
    assert strict.status_code == 409
    assert strict.json()["field"] == "unique_key" and strict.json()["job_id"] == first.json()["id"]


def test_the_bulk_endpoint_debounces_too(api):
    spec = {"kind": "echo", "debounce_key": "k", "debounce_for": 30}
    r = post(api, {"jobs": [{**spec, "payload": {"n": 1}}, {**spec, "payload": {"n": 2}}]}, "/api/jobs/bulk")
    assert r.status_code == 201
    assert len({j["id"] for j in r.json()}) == 1 and Job.objects.get().payload == {"n": 2}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"debounce_key": "k"}, "debounce_for"),
        ({"debounce_key": "k", "debounce_for": "soon"}, "debounce_for"),
        ({"unique_key": "k", "unique_while": ["running"]}, "unique_while"),
        ({"unique_while": "pending"}, "unique_while"),
    ],
)
def test_bad_options_get_a_400_naming_the_field_and_write_nothing(api, body, field):
    r = post(api, {"kind": "echo", **body})
    assert r.status_code == 400 and r.json()["field"] == field
    assert not Job.objects.exists() and not AdmissionKey.objects.exists()


def test_a_debounce_mode_outside_the_two_is_refused_by_the_schema(api):
    r = post(api, {"kind": "echo", "debounce_key": "k", "debounce_for": 1, "debounce_mode": "merge"})
    assert r.status_code in (400, 422) and not Job.objects.exists()


def test_the_schema_describes_the_options(api):
    props = api.get("/api/openapi.json").json()["components"]["schemas"]["JobIn"]["properties"]
    for name in (
        "debounce_key",
        "debounce_for",
        "debounce_max_wait",
        "debounce_mode",
        "unique_key",
        "unique_while",
    ):
        assert props[name]["description"], name


def test_the_job_page_and_history_show_the_debounced_event(client):
    from io import StringIO

    from django.core.management import call_command
    from django.urls import reverse
    from django.utils.html import escape

    from queue_app import enqueue
    from tests.factories import make_staff

    first = enqueue("echo", {"n": 1}, debounce_key="k", debounce_for=30)
    enqueue("echo", {"n": 2}, debounce_key="k", debounce_for=30)
    event = Event.objects.get(type="debounced")
    client.force_login(make_staff("viewer", "queue_app.view_job"))
    page = client.get(reverse("queue_app_dashboard:job", args=[first.id])).content.decode()
    assert "ev-debounced" in page and escape(event.message) in page and "payload_replaced" in page
    out = StringIO()
    call_command("history", str(first.id), stdout=out)
    assert "debounced" in out.getvalue() and event.message in out.getvalue()
    out = StringIO()
    call_command("history", str(first.id), "--json", stdout=out)
    (shown,) = [e for e in json.loads(out.getvalue())["events"] if e["type"] == "debounced"]
    assert shown["metadata"]["new_run_at"] == event.metadata["new_run_at"]
