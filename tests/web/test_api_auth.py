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
    _, raw = api_auth.create("reader", scopes=["read"])
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
    _, runner = api_auth.create("runner", scopes=["write", "shell"])

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
    _, runner = api_auth.create("runner", scopes=["write", "operate", "shell"])
    plain, shell = Client(headers={"X-API-Key": writer}), Client(headers={"X-API-Key": runner})

    assert (
        post(plain, f"/api/jobs/{job.id}/requeue", {"payload": {"command": "cat /etc/passwd"}}).status_code
        == 403
    )
    assert post(plain, f"/api/dead-letters/{letter.id}/replay", {}).status_code == 403
    assert Job.objects.get(id=job.id).state == "dead_letter"
    assert post(shell, f"/api/dead-letters/{letter.id}/replay", {}).status_code == 200


def test_a_shell_job_is_refused_over_the_api_where_shell_jobs_are_off():
    _, runner = api_auth.create("runner", scopes=["write", "shell"])

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
    assert "read,write,operate,shell" in listed
    with pytest.raises(CommandError, match="must be able to write"):
        call_command("apikey", "create", "odd", "--shell", "--read-only")


def test_a_keys_scopes_split_enqueuing_from_operating():
    job = JobFactory()
    _, enqueuer = api_auth.create("ci", scopes=["read", "write"])
    _, operator = api_auth.create("ops", scopes=["read", "operate"])
    ci, ops = Client(headers={"X-API-Key": enqueuer}), Client(headers={"X-API-Key": operator})

    assert enqueue_with(ci).status_code == 201
    assert ci.delete(f"/api/jobs/{job.id}").status_code == 403
    assert post(ci, "/api/pauses", {"queue": "default"}).status_code == 403
    assert enqueue_with(ops).status_code == 403
    assert ops.delete(f"/api/jobs/{job.id}").status_code == 200
    assert ops.get("/api/jobs").status_code == 200


def test_an_expired_key_is_refused_as_a_revoked_one_is():
    from datetime import timedelta

    from django.utils import timezone

    key, raw = api_auth.create("temp", expires_in=3600)
    client = Client(headers={"X-API-Key": raw})
    assert client.get("/api/jobs").status_code == 200

    ApiKey.objects.filter(id=key.id).update(expires_at=timezone.now() - timedelta(seconds=1))

    assert client.get("/api/jobs").status_code == 401
    assert enqueue_with(client).status_code == 401
    assert Job.objects.count() == 0


def test_apikey_create_takes_scopes_and_an_expiry_and_refuses_bad_ones(capsys):
    call_command("apikey", "create", "ci", "--scopes", "read,write", "--expires", "30d")
    ci = ApiKey.objects.get(name="ci")
    assert (ci.can_write, ci.can_operate, ci.can_run_shell) == (True, False, False)
    assert 29 * 86400 < (ci.expires_at - ci.created_at).total_seconds() <= 30 * 86400
    call_command("apikey", "list")
    assert "read,write" in capsys.readouterr().out

    for bad, says in [
        (["--scopes", "read,admin"], "unknown scope"),
        (["--expires", "soon"], "--expires"),
        (["--expires", "0"], "in the future"),
    ]:
        with pytest.raises(CommandError, match=says):
            call_command("apikey", "create", "bad", *bad)
    assert not ApiKey.objects.filter(name="bad").exists()


def test_the_scopes_migration_keeps_read_only_keys_from_operating():
    from importlib import import_module

    from django.apps import apps

    ApiKey.objects.create(name="old-reader", prefix="jq_x", hashed_key="a" * 64, can_write=False)
    ApiKey.objects.create(name="old-writer", prefix="jq_y", hashed_key="b" * 64, can_write=True)

    import_module("queue_app.migrations.0015_apikey_scopes_expiry").read_only_keys_stay_read_only(apps, None)

    assert dict(ApiKey.objects.values_list("name", "can_operate")) == {
        "old-reader": False,
        "old-writer": True,
    }


def test_the_admin_lists_keys_with_their_scopes_and_revokes_them(admin_client):
    key, raw = api_auth.create("ops", scopes=["read", "operate"])
    page = admin_client.get("/admin/queue_app/apikey/")
    assert page.status_code == 200 and "read, operate" in page.content.decode()
    assert admin_client.get("/admin/queue_app/apikey/add/").status_code == 403

    admin_client.post(
        "/admin/queue_app/apikey/", {"action": "revoke", "_selected_action": [str(key.id)]}, follow=True
    )

    assert ApiKey.objects.get(id=key.id).revoked_at is not None
    assert Client(headers={"X-API-Key": raw}).get("/api/jobs").status_code == 401
