"""Encrypted payloads on the web surfaces: shown as [encrypted] to a caller without
queue_app.view_unredacted_payload, decrypted for one with it; plaintext in no response
of a read-only key."""

import pytest
from cryptography.fernet import Fernet
from django.urls import reverse

from queue_app import enqueue
from queue_app.core import encryption
from queue_app.handlers import registry
from queue_app.web import auth
from tests.factories import make_staff

pytestmark = pytest.mark.django_db

CARD = "4111111111111111"
READ = ["queue_app.view_job", "queue_app.view_event", "queue_app.view_deadletter"]
UNREDACTED = "queue_app.view_unredacted_payload"


@pytest.fixture
def job(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "ENCRYPTION_KEYS": [Fernet.generate_key().decode()]}
    registry.register("charge", lambda payload: None, encrypt=("card",))
    return enqueue("charge", {"card": CARD, "amount": 5})


def pages(job):
    return [
        reverse("queue_app_dashboard:jobs"),
        reverse("queue_app_dashboard:job", args=[job.id]),
        reverse("admin:queue_app_job_changelist"),
        reverse("admin:queue_app_job_change", args=[job.id]),
    ]


def test_a_read_only_api_key_sees_encrypted_not_the_plaintext(client, job):
    _, raw = auth.create("reader", scopes=["read"])
    for path in ["/api/jobs", f"/api/jobs/{job.id}"]:
        body = client.get(path, HTTP_X_API_KEY=raw).content.decode()
        assert CARD not in body, path
        assert encryption.SHOWN in body, path
    assert client.get(f"/api/jobs/{job.id}", HTTP_X_API_KEY=raw).json()["payload"]["amount"] == 5


def test_the_unredacted_scope_reads_the_decrypted_payload(client, job):
    _, raw = auth.create("auditor", scopes=["read", "unredacted"])
    assert client.get(f"/api/jobs/{job.id}", HTTP_X_API_KEY=raw).json()["payload"]["card"] == CARD


def test_dashboard_and_admin_show_encrypted_without_the_permission_and_plaintext_with_it(client, job):
    client.force_login(make_staff("viewer", *READ))
    for page in pages(job):
        body = client.get(page).content.decode()
        assert CARD not in body, page
    assert encryption.SHOWN in client.get(pages(job)[1]).content.decode()
    client.force_login(make_staff("auditor", *READ, UNREDACTED))
    assert CARD in client.get(pages(job)[1]).content.decode()
    assert CARD in client.get(pages(job)[3]).content.decode()
