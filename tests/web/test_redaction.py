"""Redaction on the web surfaces: the dashboard, the admin and the JSON API show secrets as
[redacted] unless the caller holds queue_app.view_unredacted_payload (or a key the
unredacted scope), and nobody without it can write the markers back into a payload."""

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from queue_app.models import Job, State
from queue_app.web import auth
from tests.factories import make_staff
from tests.ops.test_redaction import secret_job

pytestmark = pytest.mark.django_db

READ = ["queue_app.view_job", "queue_app.view_event", "queue_app.view_deadletter"]
CHANGE = [*READ, "queue_app.change_job"]
UNREDACTED = "queue_app.view_unredacted_payload"


@pytest.fixture
def job():
    return secret_job()


def pages(job):
    dash = "queue_app_dashboard"
    return [
        reverse(f"{dash}:overview"),
        reverse(f"{dash}:jobs"),
        reverse(f"{dash}:job", args=[job.id]),
        reverse(f"{dash}:dead_letters"),
        reverse("admin:queue_app_job_change", args=[job.id]),
        reverse("admin:queue_app_event_changelist"),
        reverse("admin:queue_app_deadletter_changelist"),
        reverse("admin:queue_app_deadletter_change", args=[job.dead_letters.get().id]),
        reverse("admin:queue_app_event_change", args=[job.events.get().id]),
    ]


def test_dashboard_and_admin_pages_show_no_secret_without_the_permission(client, job):
    client.force_login(make_staff("viewer", *READ))
    for page in pages(job):
        response = client.get(page)
        assert response.status_code == 200, page
        assert "SECRET" not in response.content.decode(), page
    # What is not secret is still there.
    assert "ann@example.com" in client.get(pages(job)[2]).content.decode()


@pytest.mark.parametrize("superuser", [False, True])
def test_the_permission_or_a_superuser_sees_the_stored_values(client, job, superuser):
    if superuser:
        user = get_user_model().objects.create_superuser("root", password="pw")
    else:
        user = make_staff("auditor", *READ, UNREDACTED)
    client.force_login(user)
    assert "hunter2-SECRET" in client.get(pages(job)[2]).content.decode()
    assert "hunter2-SECRET" in client.get(pages(job)[4]).content.decode()


def test_a_redacted_payload_cannot_be_edited_on_the_dashboard_or_in_the_admin(client, job):
    client.force_login(make_staff("op", *CHANGE))
    page = client.get(reverse("queue_app_dashboard:job", args=[job.id])).content.decode()
    assert 'name="payload"' not in page
    url = reverse("queue_app_dashboard:job_action", args=[job.id, "edit_payload"])
    response = client.post(url, {"payload": '{"password": "[redacted]"}'}, follow=True)
    assert "needs the queue_app.view_unredacted_payload permission" in response.content.decode()
    data = {"action": "edit_payload", "_selected_action": [str(job.id)], "confirm": "yes", "index": "0"}
    response = client.post(reverse("admin:queue_app_job_changelist"), {**data, "payload": "{}"}, follow=True)
    assert "needs the queue_app.view_unredacted_payload permission" in response.content.decode()
    assert Job.objects.get(id=job.id).payload["password"] == "hunter2-SECRET"


def test_the_permission_lets_an_operator_edit_the_payload(client, job):
    client.force_login(make_staff("op", *CHANGE, UNREDACTED))
    url = reverse("queue_app_dashboard:job_action", args=[job.id, "edit_payload"])
    client.post(url, {"payload": '{"password": "new"}'})
    assert Job.objects.get(id=job.id).payload == {"password": "new"}


def api_get(client, path, key=None):
    headers = {"HTTP_X_API_KEY": key} if key else {}
    response = client.get(f"/api{path}", **headers)
    assert response.status_code == 200, response.content
    return response.content.decode()


def test_api_reads_redact_for_a_key_without_the_unredacted_scope(client, job):
    _, raw = auth.create("reader", scopes=["read"])
    for path in ["/jobs", f"/jobs/{job.id}", "/dead-letters"]:
        assert "SECRET" not in api_get(client, path, raw), path
    assert "ann@example.com" in api_get(client, f"/jobs/{job.id}", raw)


def test_api_writes_answer_with_the_job_redacted(client, job):
    _, raw = auth.create("operator", scopes=["read", "write", "operate"])
    response = client.post(
        f"/api/jobs/{job.id}/requeue", {}, content_type="application/json", HTTP_X_API_KEY=raw
    )
    assert response.status_code == 200, response.content
    assert "SECRET" not in response.content.decode()
    assert Job.objects.get(id=job.id).state == State.PENDING
    response = client.post(
        "/api/jobs",
        {"kind": "echo", "payload": {"token": "new-SECRET"}},
        content_type="application/json",
        HTTP_X_API_KEY=raw,
    )
    assert response.status_code == 201
    assert "SECRET" not in response.content.decode()


def test_the_unredacted_scope_or_permission_reads_the_stored_values(client, job):
    _, raw = auth.create("auditor", scopes=["read", "unredacted"])
    assert "hunter2-SECRET" in api_get(client, f"/jobs/{job.id}", raw)
    assert "pw-SECRET" in api_get(client, "/jobs", raw)
    client.force_login(make_staff("auditor-user", *READ, UNREDACTED))
    assert "hunter2-SECRET" in api_get(client, f"/jobs/{job.id}")
    client.force_login(make_staff("plain-user", *READ))
    assert "SECRET" not in api_get(client, f"/jobs/{job.id}")
