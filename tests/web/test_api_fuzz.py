"""A property-based fuzz of the JSON API against its own OpenAPI schema (schemathesis).

Schemathesis reads /api/openapi.json from the WSGI app in-process and, for every
operation, sends generated requests (valid ones and, in the negative phase, ones that
break the schema) with a read-write API key. No request may get a 5xx, and every
documented response must match its schema. Derandomized and bounded, so a run is the
same every time and takes seconds per database.
"""

import os

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from queue_app.conf import settings as queue_settings
from queue_app.web import api
from queue_app.web import auth as api_auth

schema = schemathesis.openapi.from_wsgi("/api/openapi.json", get_wsgi_application())

# negative_data_rejection: a request the schema calls invalid must be refused (4xx): the
# API takes nothing its schema forbids. The other direction (what it calls
# valid is accepted) holds for each field's own bounds (test_the_schema_states_...), not
# for rules across fields or the registry (run_at or run_after, state or status, a kind
# some handler runs), which a schema cannot state.
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@pytest.fixture
def api_key(db):
    # The real WSGI handler closes a connection that is not in autocommit mode around
    # each request, and with it the test's transaction: keep it open, as Django's test
    # client does.
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    yield api_auth.create("fuzz")[1]
    for signal in (request_started, request_finished):
        signal.connect(close_old_connections)


@pytest.mark.django_db
@schema.parametrize()
@settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", 15)),
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_request_gets_a_server_error_or_breaks_the_schema(case, api_key):
    case.call_and_validate(headers={queue_settings.API_KEY_HEADER: api_key}, checks=CHECKS)


@pytest.mark.django_db
def test_no_sequence_of_calls_gets_a_server_error_or_breaks_the_schema(api_key):
    """The stateful phase: chains of calls linked by the ids one returns and the next takes
    (enqueue, then get, cancel or requeue that job; list dead letters, then replay one)."""

    class Workflow(schema.as_state_machine()):
        def get_call_kwargs(self, case):
            return {"headers": {queue_settings.API_KEY_HEADER: api_key}}

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            case.validate_response(response, checks=CHECKS, transport_kwargs=kwargs)

    Workflow.run(
        settings=settings(
            max_examples=int(os.environ.get("FUZZ_EXAMPLES", 15)),
            stateful_step_count=6,
            derandomize=True,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
    )


# --- what the fuzz guards, pinned as plain examples -----------------------------------


def nested(depth):
    """A JSON list ``depth`` levels deep."""
    value = 0
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.django_db
@pytest.mark.parametrize(
    "options, field",
    [
        ({"payload": {"a": "nul\x00"}}, "payload"),
        ({"payload": {"key\x00": 1}}, "payload"),
        ({"payload": ["\ud800"]}, "payload"),
        ({"payload": {"\udfff": 1}}, "payload"),
        ({"payload": {"a": nested(24)}}, "payload"),
        ({"payload": nested(5000)}, "payload"),
        ({"idempotency_key": "k\x00"}, "idempotency_key"),
        ({"idempotency_key": "\ud83d"}, "idempotency_key"),
        ({"on_success": {"kind": "echo", "payload": {"x": "\x00"}}}, "on_success"),
        ({"webhook_url": "http://example.com/\x00"}, "webhook_url"),
    ],
)
def test_enqueue_refuses_text_no_database_can_store_and_writes_nothing(options, field):
    from queue_app import enqueue
    from queue_app.exceptions import InvalidJob
    from queue_app.models import Job

    with pytest.raises(InvalidJob) as refused:
        enqueue("echo", options.pop("payload", None), **options)
    assert refused.value.field == field
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_a_payload_at_the_depth_limit_is_stored_and_can_be_requeued_with_a_new_one():
    from queue_app import enqueue
    from queue_app.core import transitions
    from tests.factories import DeadLetterFactory

    job = enqueue("echo", {"a": nested(23)})
    job.refresh_from_db()
    assert job.payload == {"a": nested(23)}
    letter = DeadLetterFactory(job__payload={"a": nested(23)})
    assert transitions.requeue(letter.job_id, payload={"b": nested(23)}).payload == {"b": nested(23)}


@pytest.mark.django_db
def test_requeue_refuses_a_payload_with_nul_and_keeps_the_job_as_it_was():
    from queue_app.core import transitions
    from queue_app.exceptions import InvalidJob
    from tests.factories import DeadLetterFactory

    letter = DeadLetterFactory()
    with pytest.raises(InvalidJob, match="NUL"):
        transitions.requeue(letter.job_id, payload={"a": "\x00"})
    letter.job.refresh_from_db()
    assert letter.job.state == "dead_letter"


@pytest.mark.django_db
def test_a_name_with_a_trailing_newline_is_refused():
    from queue_app import enqueue
    from queue_app.exceptions import InvalidJob

    with pytest.raises(InvalidJob) as refused:
        enqueue("echo\n")
    assert refused.value.field == "kind"
    with pytest.raises(InvalidJob) as refused:
        enqueue("echo", queue_name="mail\n")
    assert refused.value.field == "queue_name"


@pytest.fixture
def client_with_key(db, client):
    client.defaults["HTTP_X_API_KEY"] = api_auth.create("pinned")[1]
    return client


def test_a_pause_reason_with_nul_is_a_400_naming_the_field(client_with_key):
    r = client_with_key.post(
        "/api/pauses", {"queue": "mail", "reason": "a\x00b"}, content_type="application/json"
    )
    assert (r.status_code, r.json()["field"]) == (400, "reason")


@pytest.mark.parametrize(
    "method, url, allowed",
    [
        ("put", "/api/jobs", {"GET", "POST"}),
        ("patch", "/api/jobs/1", {"GET", "DELETE"}),
        ("get", "/api/jobs/bulk", {"POST"}),
    ],
)
def test_a_wrong_method_is_a_json_405_listing_the_allowed_ones(client_with_key, method, url, allowed):
    r = getattr(client_with_key, method)(url)
    assert r.status_code == 405
    assert r["Content-Type"].startswith("application/json")
    assert method.upper() in r.json()["error"]
    assert {m.strip() for m in r["Allow"].split(",")} == allowed


def test_an_unknown_dead_letter_is_a_json_404(client_with_key):
    r = client_with_key.post("/api/dead-letters/987654/replay")
    assert r.status_code == 404
    assert r.json() == {"error": "dead letter 987654 does not exist", "field": None}


WEEK = 7 * 24 * 3600


@pytest.mark.parametrize(
    "field, bounds, edge, past",
    [
        ("priority", {"minimum": -100, "maximum": 100}, -100, 101),
        ("max_attempts", {"minimum": 1, "maximum": 1000}, 1000, 0),
        ("run_after", {"minimum": 0, "maximum": 3650 * 86400}, 0, -1),
        ("timeout", {"exclusiveMinimum": 0, "maximum": WEEK}, WEEK, WEEK + 1),
        ("unique_for", {"exclusiveMinimum": 0, "maximum": 3650 * 86400}, 60, 0),
        ("backoff_base", {"minimum": 1, "maximum": 100}, 100, 0.5),
        ("backoff_max", {"exclusiveMinimum": 0, "maximum": WEEK}, WEEK, 0),
        ("queue_name", {"minLength": 1, "maxLength": 100, "pattern": api.NAME_PATTERN}, "q" * 100, "a b"),
        ("kind", {"minLength": 1, "maxLength": 200, "pattern": api.NAME_PATTERN}, "echo", "echo\n"),
        ("idempotency_key", {"minLength": 1, "maxLength": 255}, "k" * 255, ""),
        ("concurrency_key", {"minLength": 1, "maxLength": 255}, "c" * 255, "c" * 256),
    ],
)
def test_the_schema_states_each_bound_validation_enforces(client_with_key, field, bounds, edge, past):
    prop = api.api.get_openapi_schema()["components"]["schemas"]["JobIn"]["properties"][field]
    stated = next((s for s in prop.get("anyOf", [prop]) if s.get("type") != "null"), prop)
    assert {k: stated[k] for k in bounds} == bounds
    extra = {"idempotency_key": "dedupe"} if field == "unique_for" else {}
    body = {"kind": "echo", **extra, field: edge}
    r = client_with_key.post("/api/jobs", body, content_type="application/json")
    assert r.status_code == 201, r.content  # the edge the schema allows, the API takes
    r = client_with_key.post("/api/jobs", {**body, field: past}, content_type="application/json")
    assert (r.status_code, r.json()["field"]) == (400, field)
