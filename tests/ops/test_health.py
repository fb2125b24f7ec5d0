from datetime import timedelta

import pytest
from django.utils import timezone

from queue_app.models import Worker

pytestmark = pytest.mark.django_db


def test_health_is_503_without_a_live_worker(client):
    Worker.objects.create(name="old", host="h", pid=1, last_heartbeat=timezone.now() - timedelta(hours=1))
    r = client.get("/health")
    assert r.status_code == 503
    body = r.json()
    assert body["checks"]["database"]["ok"] and body["checks"]["migrations"]["ok"]
    assert body["checks"]["workers"] == {"ok": False, "alive": 0, "required": 1}


def test_health_is_200_with_a_live_worker(client):
    Worker.objects.create(name="w", host="h", pid=1)
    r = client.get("/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"


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
