import json

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.test import Client

from queue_app.models import ApiKey, Job
from queue_app.web import auth as api_auth
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def enqueue_with(client):
    return client.post("/api/jobs", json.dumps({"kind": "echo"}), content_type="application/json")


def staff(*perms, is_staff=True):
    user = User.objects.create_user("op", password="pw", is_staff=is_staff)
    user.user_permissions.set(
        Permission.objects.filter(codename__in=perms, content_type__app_label="queue_app")
    )
    client = Client()
    client.force_login(user)
    return client


def test_no_credentials_is_401_for_reads_and_writes():
    assert Client().get("/api/jobs").status_code == 401
    assert enqueue_with(Client()).status_code == 401
    assert Job.objects.count() == 0


def test_reads_open_by_setting_but_writes_still_need_credentials(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "API_READS_OPEN": True}
    assert Client().get("/api/jobs").status_code == 200
    assert enqueue_with(Client()).status_code == 401


def test_a_wrong_or_revoked_key_is_401():
    _, raw = api_auth.create("old")
    assert enqueue_with(Client(headers={"X-API-Key": "jq_wrong"})).status_code == 401
    api_auth.revoke("old")
    assert enqueue_with(Client(headers={"X-API-Key": raw})).status_code == 401


def test_a_read_only_key_reads_but_cannot_write():
    _, raw = api_auth.create("reader", can_write=False)
    client = Client(headers={"X-API-Key": raw})
    assert client.get("/api/jobs").status_code == 200
    assert enqueue_with(client).status_code == 403
    job = JobFactory()
    assert client.delete(f"/api/jobs/{job.id}").status_code == 403
    assert Job.objects.get(id=job.id).state == "pending"


READS = [
    ("/api/jobs", "view_job"),
    ("/api/jobs/{job}", "view_job"),
    ("/api/stats", "view_job"),
    ("/api/dead-letters", "view_deadletter"),
    ("/api/workers", "view_worker"),
    ("/api/pauses", "view_pause"),
]


@pytest.mark.parametrize("path, perm", READS)
def test_a_staff_session_reads_only_what_its_view_permission_covers_as_on_the_dashboard(path, perm):
    path = path.format(job=JobFactory().id)
    # Every view permission but the one this read needs: still refused.
    others = [p for _, p in READS if p != perm]

    refused = staff(*others).get(path)
    allowed = staff_named("viewer", perm).get(path)

    assert refused.status_code == 403
    assert perm in refused.json()["error"]
    assert allowed.status_code == 200


def test_a_staff_session_without_permissions_can_neither_read_nor_write():
    client = staff()
    assert client.get("/api/jobs").status_code == 403
    assert enqueue_with(client).status_code == 403
    assert Job.objects.count() == 0


def staff_named(name, *perms):
    user = User.objects.create_user(name, is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(codename__in=perms, content_type__app_label="queue_app")
    )
    client = Client()
    client.force_login(user)
    return client


def test_staff_with_add_job_enqueues_but_needs_change_job_to_cancel():
    client = staff("add_job")
    r = enqueue_with(client)
    assert r.status_code == 201
    assert client.delete(f"/api/jobs/{r.json()['id']}").status_code == 403
    assert staff_with_change(r.json()["id"]) == 200


def staff_with_change(job_id):
    user = User.objects.create_user("op2", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="change_job"))
    client = Client()
    client.force_login(user)
    return client.delete(f"/api/jobs/{job_id}").status_code


def test_a_logged_in_non_staff_user_is_401():
    assert staff("add_job", is_staff=False).get("/api/jobs").status_code == 401


def test_session_writes_need_a_csrf_token():
    user = User.objects.create_superuser("root", password="pw")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    r = enqueue_with(client)
    assert r.status_code == 403 and "CSRF" in r.json()["error"]
    assert Job.objects.count() == 0


def test_apikey_command_prints_a_key_once_and_stores_only_its_hash(capsys):
    call_command("apikey", "create", "deploy-bot")
    raw = capsys.readouterr().out.strip()
    stored = ApiKey.objects.get(name="deploy-bot")
    assert raw.startswith("jq_") and raw not in (stored.hashed_key, stored.prefix)
    assert stored.hashed_key == api_auth.hash_key(raw)
    assert enqueue_with(Client(headers={"X-API-Key": raw})).status_code == 201
    with pytest.raises(CommandError, match="already exists"):
        call_command("apikey", "create", "deploy-bot")
    call_command("apikey", "revoke", "deploy-bot")
    with pytest.raises(CommandError, match="no active key"):
        call_command("apikey", "revoke", "deploy-bot")


def test_an_anonymous_write_is_401_even_where_csrf_is_enforced():
    client = Client(enforce_csrf_checks=True)

    r = enqueue_with(client)

    assert r.status_code == 401
    assert Job.objects.count() == 0


def test_a_staff_session_still_needs_the_csrf_token_to_write():
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_superuser("boss", password="pw"))

    assert enqueue_with(client).status_code == 403


@pytest.mark.parametrize(
    "method, perm",
    [("post", "add_pause"), ("delete", "delete_pause")],
)
def test_pausing_over_the_api_needs_the_pause_permissions_the_admin_asks_for(method, perm):
    from queue_app.core import flow

    if method == "delete":
        flow.pause(queue="q", actor="t")
    call = {
        "post": lambda c: c.post("/api/pauses", json.dumps({"queue": "q"}), content_type="application/json"),
        "delete": lambda c: c.delete("/api/pauses?queue=q"),
    }[method]

    refused = call(staff("change_job", "view_pause"))
    allowed = call(staff_named("pauser", perm))

    assert refused.status_code == 403 and perm in refused.json()["error"]
    assert allowed.status_code in (200, 201)


SHELL = {"kind": "shell", "payload": {"command": "echo hi"}}


def post(client, path, body):
    return client.post(path, json.dumps(body), content_type="application/json")


@pytest.mark.parametrize(
    "path, body",
    [
        ("/api/jobs", SHELL),
        ("/api/jobs/bulk", {"jobs": [{"kind": "echo"}, SHELL]}),
        ("/api/jobs", {"kind": "echo", "on_success": {"kind": "echo", "on_failure": SHELL}}),
    ],
    ids=["enqueue", "bulk", "nested-follow-up"],
)
def test_shell_jobs_need_their_own_permission_beyond_writing(settings, path, body):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "SHELL_JOBS": True}
    _, writer = api_auth.create("writer")
    _, runner = api_auth.create("runner", can_run_shell=True)

    refused = [
        post(Client(headers={"X-API-Key": writer}), path, body),
        post(staff("add_job"), path, body),
    ]
    assert [r.status_code for r in refused] == [403, 403]
    assert "queue_app.enqueue_shell_job" in refused[0].json()["error"]
    assert Job.objects.count() == 0

    User.objects.all().delete()
    allowed = [
        post(Client(headers={"X-API-Key": runner}), path, body),
        post(staff("add_job", "enqueue_shell_job"), path, body),
    ]
    assert [r.status_code for r in allowed] == [201, 201]


def test_requeuing_or_replaying_a_shell_job_needs_the_shell_permission(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "SHELL_JOBS": True}
    from queue_app.models import DeadLetter

    job = JobFactory(dead=True, kind="shell", payload={"command": "echo hi"})
    letter = DeadLetter.objects.create(job=job, kind=job.kind, payload=job.payload, attempts=3)
    _, writer = api_auth.create("writer")
    _, runner = api_auth.create("runner", can_run_shell=True)
    plain, shell = Client(headers={"X-API-Key": writer}), Client(headers={"X-API-Key": runner})

    assert (
        post(plain, f"/api/jobs/{job.id}/requeue", {"payload": {"command": "cat /etc/passwd"}}).status_code
        == 403
    )
    assert post(plain, f"/api/dead-letters/{letter.id}/replay", {}).status_code == 403
    assert Job.objects.get(id=job.id).state == "dead_letter"
    assert post(shell, f"/api/dead-letters/{letter.id}/replay", {}).status_code == 200


def test_a_shell_job_is_refused_over_the_api_where_shell_jobs_are_off():
    _, runner = api_auth.create("runner", can_run_shell=True)

    refused = post(Client(headers={"X-API-Key": runner}), "/api/jobs", SHELL)

    assert refused.status_code == 400
    assert "shell jobs are disabled" in refused.json()["error"]
    assert Job.objects.count() == 0


def test_apikey_create_shell_makes_a_key_that_may_enqueue_shell_jobs(capsys):
    call_command("apikey", "create", "ops", "--shell")
    call_command("apikey", "create", "bot")
    call_command("apikey", "list")

    listed = capsys.readouterr().out
    assert {k.name: k.can_run_shell for k in ApiKey.objects.all()} == {"ops": True, "bot": False}
    assert "read-write+shell" in listed
    with pytest.raises(CommandError, match="must be able to write"):
        call_command("apikey", "create", "odd", "--shell", "--read-only")
