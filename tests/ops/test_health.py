from datetime import timedelta

import pytest
from django.utils import timezone

from queue_app.models import Worker, WorkerState

pytestmark = pytest.mark.django_db


def test_health_is_503_without_a_live_worker(client):
    Worker.objects.create(name="old", host="h", pid=1, last_heartbeat=timezone.now() - timedelta(hours=1))
    r = client.get("/health")
    assert r.status_code == 503
    body = r.json()
    assert body["checks"]["database"]["ok"] and body["checks"]["migrations"]["ok"]
    assert body["checks"]["workers"] == {"ok": False, "alive": 0, "leasing": 0, "required": 1}


def test_health_is_200_with_a_live_worker(client):
    Worker.objects.create(name="w", host="h", pid=1)
    r = client.get("/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"


@pytest.mark.parametrize("state", [WorkerState.QUIET, WorkerState.STOPPING])
def test_health_is_503_when_the_only_live_worker_leases_no_more(client, state):
    # Alive (fresh heartbeat) but told to go quiet or stop: it takes no new job.
    Worker.objects.create(name="w", host="h", pid=1, state=state)
    r = client.get("/health")
    assert r.status_code == 503
    assert r.json()["checks"]["workers"] == {"ok": False, "alive": 1, "leasing": 0, "required": 1}
    Worker.objects.create(name="w2", host="h", pid=2)
    r = client.get("/health")
    assert r.status_code == 200
    assert r.json()["checks"]["workers"] == {"ok": True, "alive": 2, "leasing": 1, "required": 1}


def test_health_needs_no_worker_when_configured_so(client, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "HEALTH_MIN_WORKERS": 0}
    assert client.get("/health").status_code == 200


def test_health_reports_unapplied_migrations(client, settings):
    from django.db import connection
    from django.db.migrations.recorder import MigrationRecorder

    Worker.objects.create(name="w", host="h", pid=1)
    MigrationRecorder(connection).migration_qs.filter(app="queue_app", name="0002_claim_indexes").delete()
    r = client.get("/health")
    assert r.status_code == 503
    assert r.json()["checks"]["migrations"]["unapplied"] == ["queue_app.0002_claim_indexes"]


def test_health_refuses_post(client):
    assert client.post("/health").status_code == 405


@pytest.fixture
def worker_table_gone():
    """A real database error in the workers check: its table renamed inside the test's
    transaction (rolled back after it; MariaDB would commit the DDL at once)."""
    from django.db import connection

    if connection.vendor == "mysql":
        pytest.skip("MariaDB commits DDL at once: the rename would outlive the test")
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE queue_app_worker RENAME TO queue_app_worker_gone")


def test_health_shows_no_error_text_to_an_anonymous_caller(client, worker_table_gone):
    r = client.get("/health")

    assert r.status_code == 503
    assert r.json()["checks"]["workers"] == {"ok": False, "required": 1}
    assert "queue_app_worker" not in r.content.decode()


def test_health_shows_the_error_text_to_staff(client, django_user_model, worker_table_gone):
    client.force_login(django_user_model.objects.create_user("ops", is_staff=True))

    r = client.get("/health")

    assert r.status_code == 503
    assert "queue_app_worker" in r.json()["checks"]["workers"]["error"]
