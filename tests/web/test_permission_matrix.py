"""The permission matrix: every principal against every API endpoint and dashboard page,
reads and writes, with the status each must get; a refused request writes nothing and an
allowed write changes something.

Principals: nobody, a logged-in user who is not staff, staff with no permission, staff
with the view permissions, staff with the change permissions, a superuser, and API keys
read-only, write (enqueue), operate, expired and revoked. The dashboard takes no API key:
a request carrying one is anonymous there.
"""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from queue_app.core import canvas
from queue_app.models import (
    ApiKey,
    Event,
    Job,
    Pause,
    PauseScope,
    RuntimeSetting,
    Schedule,
    SettingChange,
    Worker,
)
from queue_app.web import api as api_module
from queue_app.web import auth
from queue_app.web import urls as dashboard_urls
from tests.factories import DeadLetterFactory, JobFactory, WorkerFactory, make_staff
from tests.support import shared_rows

pytestmark = pytest.mark.django_db

VIEW = [
    "view_job",
    "view_event",
    "view_deadletter",
    "view_worker",
    "view_pause",
    "view_schedule",
    "view_runtimesetting",
]
CHANGE = [
    *VIEW,
    "add_job",
    "change_job",
    "delete_job",
    "change_worker",
    "add_pause",
    "delete_pause",
    "change_schedule",
    "change_runtimesetting",
    "delete_runtimesetting",
]


def _staff(username, *perms):
    return lambda: ("session", make_staff(username, *[f"queue_app.{p}" for p in perms]))


def _key(name, *scopes, expired=False, revoked=False):
    def make():
        key, raw = auth.create(name, scopes=scopes)
        if expired:
            ApiKey.objects.filter(id=key.id).update(expires_at=timezone.now() - timedelta(seconds=1))
        if revoked:
            auth.revoke(name)
        return "key", raw

    return make


PRINCIPALS = {
    "anonymous": lambda: (None, None),
    "user": lambda: ("session", get_user_model().objects.create_user("user", password="pw")),
    "staff_none": _staff("staff_none"),
    "staff_view": _staff("staff_view", *VIEW),
    "staff_change": _staff("staff_change", *CHANGE),
    "superuser": lambda: ("session", get_user_model().objects.create_superuser("root", password="pw")),
    "key_read": _key("key_read", "read"),
    "key_write": _key("key_write", "read", "write"),
    "key_operate": _key("key_operate", "read", "operate"),
    "key_expired": _key("key_expired", "read", "write", "operate", expired=True),
    "key_revoked": _key("key_revoked", "read", "write", "operate", revoked=True),
}

# What each principal gets, per kind of API endpoint: "ok" is the endpoint's own success.
API_EXPECTED = {
    "anonymous": {"read": 401, "enqueue": 401, "operate": 401},
    "user": {"read": 401, "enqueue": 401, "operate": 401},
    "staff_none": {"read": 403, "enqueue": 403, "operate": 403},
    "staff_view": {"read": "ok", "enqueue": 403, "operate": 403},
    "staff_change": {"read": "ok", "enqueue": "ok", "operate": "ok"},
    "superuser": {"read": "ok", "enqueue": "ok", "operate": "ok"},
    "key_read": {"read": "ok", "enqueue": 403, "operate": 403},
    "key_write": {"read": "ok", "enqueue": "ok", "operate": 403},
    "key_operate": {"read": "ok", "enqueue": 403, "operate": "ok"},
    "key_expired": {"read": 401, "enqueue": 401, "operate": 401},
    "key_revoked": {"read": 401, "enqueue": 401, "operate": 401},
}

# (name, kind, method, path, body, success status); {pending}, {dead}, {letter} are ids.
API = [
    ("list jobs", "read", "get", "/api/jobs", None, 200),
    ("get job", "read", "get", "/api/jobs/{pending}", None, 200),
    ("stats", "read", "get", "/api/stats", None, 200),
    ("dead letters", "read", "get", "/api/dead-letters", None, 200),
    ("workers", "read", "get", "/api/workers", None, 200),
    ("pauses", "read", "get", "/api/pauses", None, 200),
    ("enqueue", "enqueue", "post", "/api/jobs", {"kind": "echo"}, 201),
    ("bulk enqueue", "enqueue", "post", "/api/jobs/bulk", {"jobs": [{"kind": "echo"}]}, 201),
    ("cancel", "operate", "delete", "/api/jobs/{pending}", None, 200),
    ("requeue", "operate", "post", "/api/jobs/{dead}/requeue", {}, 200),
    ("replay", "operate", "post", "/api/dead-letters/{letter}/replay", None, 200),
    ("pause", "operate", "post", "/api/pauses", {"queue": "other"}, 201),
    ("resume", "operate", "delete", "/api/pauses?queue=mail", None, 200),
    ("quiet worker", "operate", "post", "/api/workers/{worker}/quiet", None, 200),
    ("stop worker", "operate", "post", "/api/workers/{worker}/stop", None, 200),
    ("create group", "enqueue", "post", "/api/groups", {"jobs": [{"kind": "echo"}]}, 201),
    ("get group", "read", "get", "/api/groups/{group}", None, 200),
    ("runtime settings", "read", "get", "/api/config", None, 200),
    ("set runtime setting", "operate", "put", "/api/config/{setting}", {"value": 60}, 200),
    ("unset runtime setting", "operate", "delete", "/api/config/{setting}", None, 200),
]

# The dashboard: "login" is a redirect to the admin's login page, "done" a redirect back
# after the action ran, "kept" a redirect back with the action refused (nothing written).
# "confirm" is the page that asks before an action: it needs the action's permission.
SESSIONLESS = {"page": "login", "act": "login", "confirm": "login"}
DASHBOARD_EXPECTED = {
    "anonymous": SESSIONLESS,
    "user": SESSIONLESS,
    "staff_none": {"page": 403, "act": 403, "confirm": 403},
    "staff_view": {"page": 200, "act": 403, "confirm": 403},
    "staff_change": {"page": 200, "act": "done", "confirm": 200},
    "superuser": {"page": 200, "act": "done", "confirm": 200},
    **{name: SESSIONLESS for name in PRINCIPALS if name.startswith("key_")},
}
# Editing a payload shows it whole: without view_unredacted_payload it is refused, and
# the page comes back (400) with what was typed.
KEPT = {("staff_change", "edit payload"): 400}

DASHBOARD = [
    ("overview", "page", "get", "overview", (), None),
    ("jobs", "page", "get", "jobs", (), None),
    ("job", "page", "get", "job", ("pending",), None),
    ("dead letters page", "page", "get", "dead_letters", (), None),
    ("running now", "page", "get", "running", (), None),
    ("workers page", "page", "get", "workers", (), None),
    ("queues", "page", "get", "queues", (), None),
    ("requeue", "act", "post", "job_action", ("dead", "requeue"), {}),
    ("retry now", "act", "post", "job_action", ("pending", "retry_now"), {}),
    ("cancel", "act", "post", "job_action", ("pending", "cancel"), {}),
    ("change priority", "act", "post", "job_action", ("pending", "change_priority"), {"priority": "7"}),
    ("edit payload", "act", "post", "job_action", ("pending", "edit_payload"), {"payload": '{"n": 99}'}),
    ("delete", "act", "post", "job_action", ("pending", "delete"), {}),
    (
        "bulk cancel",
        "act",
        "post",
        "bulk",
        (),
        {"action": "cancel", "scope": "selected", "ids": "{pending}", "confirm": "yes"},
    ),
    ("stop worker", "act", "post", "worker_stop", ("worker",), {}),
    ("stop worker: confirm", "confirm", "get", "worker_stop", ("worker",), None),
    ("quiet worker", "act", "post", "worker_quiet", ("worker",), {}),
    ("quiet worker: confirm", "confirm", "get", "worker_quiet", ("worker",), None),
    ("schedules", "page", "get", "schedules", (), None),
    ("workflow", "page", "get", "workflow", ("pending",), None),
    ("run schedule now", "act", "post", "schedule_run_now", ("nightly",), {}),
    ("disable schedule", "act", "post", "schedule_enable", ("nightly",), {"enabled": "0"}),
    ("pause queue", "act", "post", "pause", (), {"queue": "other"}),
    ("resume queue", "act", "post", "resume", (), {"queue": "mail"}),
]


@pytest.fixture(scope="module")
def _rows(django_db_setup, django_db_blocker):
    """The world and every principal, made once for the module's 484 cells: what a cell
    writes is rolled back after it (tests.support.shared_rows), so each cell starts from
    the rows as they were made."""
    with shared_rows(django_db_blocker):
        yield _world(), {name: make() for name, make in PRINCIPALS.items()}


@pytest.fixture(scope="module")
def _handler():
    """One request handler for the module's clients, as one server process has one: its
    middleware is built once, not once per cell (WhiteNoise's, once collectstatic has
    run, reads every collected file's metadata as it is built)."""
    return Client().handler


@pytest.fixture
def client(_handler):
    """pytest-django's client (a fresh one per cell: its own cookies), on the shared handler."""
    client = Client()
    client.handler = _handler
    return client


@pytest.fixture
def world(_rows):
    return _rows[0]


@pytest.fixture
def principals(_rows):
    return _rows[1]


def _world():
    """One of each row the endpoints act on; ids by name."""
    pending = JobFactory(kind="echo", run_at=timezone.now() + timedelta(hours=1))
    letter = DeadLetterFactory(job=JobFactory(kind="echo", dead=True))
    worker = WorkerFactory()
    Pause.objects.create(scope=PauseScope.QUEUE, name="mail")
    Schedule.objects.create(name="nightly", cron="0 3 * * *", kind="echo")
    group = canvas.group([{"kind": "echo", "payload": {}}])
    RuntimeSetting.objects.create(name="LEASE_SECONDS", value=45.0)
    return {
        "pending": pending.id,
        "dead": letter.job_id,
        "letter": letter.id,
        "worker": worker.id,
        "group": group.id,
        "setting": "lease-seconds",
    }


def fingerprint():
    """Everything a write could change."""
    return (
        sorted(Job.objects.values_list("id", "state", "priority", "run_at", "payload")),
        Event.objects.count(),
        sorted(Pause.objects.values_list("scope", "name")),
        sorted(Worker.objects.values_list("id", "stop_requested_at", "quiet_requested_at")),
        sorted(Schedule.objects.values_list("name", "enabled")),
        sorted(RuntimeSetting.objects.values_list("name", "value")),
        SettingChange.objects.count(),
    )


def as_principal(client, principals, name):
    how, who = principals[name]
    if how == "session":
        client.force_login(who)
    return {"HTTP_X_API_KEY": who} if how == "key" else {}


def cells(table):
    return [
        pytest.param(principal, endpoint, id=f"{principal}-{endpoint[0]}")
        for principal in PRINCIPALS
        for endpoint in table
    ]


@pytest.mark.parametrize("principal, endpoint", cells(API))
def test_api(client, world, principals, principal, endpoint):
    _, kind, method, path, body, success = endpoint
    headers = as_principal(client, principals, principal)
    expected = API_EXPECTED[principal][kind]
    before = fingerprint()
    send = getattr(client, method)
    url = path.format(**world)
    if body is None:
        response = send(url, **headers)
    else:
        response = send(url, body, content_type="application/json", **headers)
    assert response.status_code == (success if expected == "ok" else expected), response.content
    assert response["Content-Type"].startswith("application/json")
    changed = fingerprint() != before
    assert changed == (expected == "ok" and method != "get")


@pytest.mark.parametrize("principal, endpoint", cells(DASHBOARD))
def test_dashboard(client, world, principals, principal, endpoint):
    name, kind, method, view, args, data = endpoint
    headers = as_principal(client, principals, principal)
    expected = DASHBOARD_EXPECTED[principal][kind]
    expected = KEPT.get((principal, name), expected)
    url = reverse(f"queue_app_dashboard:{view}", args=[world.get(a, a) for a in args])
    if data:
        data = {k: str(world["pending"]) if v == "{pending}" else v for k, v in data.items()}
    before = fingerprint()
    response = client.get(url, **headers) if method == "get" else client.post(url, data, **headers)
    if expected in ("login", "done", "kept"):
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("admin:login")) == (expected == "login")
    else:
        assert response.status_code == expected
    assert (fingerprint() != before) == (expected == "done")


def test_the_matrix_covers_every_api_operation_and_dashboard_view():
    ids = {
        "{pending}": "{job_id}",
        "{dead}": "{job_id}",
        "{letter}": "{letter_id}",
        "{group}": "{group_id}",
        "{setting}": "{name}",
        "{worker}": "{worker_id}",
    }

    def template(path):
        path = path.removeprefix("/api").split("?")[0]
        for cell, param in ids.items():
            path = path.replace(cell, param)
        return path

    operations = {
        (method.lower(), path)
        for _, router in api_module.api._routers
        for path, view in router.path_operations.items()
        for operation in view.operations
        for method in operation.methods
    }
    assert operations == {(method, template(path)) for _, _, method, path, _, _ in API}
    assert {u.name for u in dashboard_urls.urlpatterns} == {view for _, _, _, view, _, _ in DASHBOARD}
