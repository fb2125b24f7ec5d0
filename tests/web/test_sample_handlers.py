"""The sample workloads (crashy, slow ...) are registered only where SAMPLE_HANDLERS asks
(the demo, the tests, a hand-run try): with the shipped settings an API writer cannot
enqueue a job that kills or ties up the workers, and the API refuses unknown kinds."""

import json
import os
import subprocess
import sys

import pytest

from queue_app.handlers import registry
from queue_app.models import Job
from queue_app.web import auth

pytestmark = pytest.mark.django_db


def post(client, key, body):
    return client.post("/api/jobs", body, content_type="application/json", HTTP_X_API_KEY=key)


@pytest.fixture
def shipped(settings):
    """The registry as the shipped settings leave it (SAMPLE_HANDLERS off)."""
    settings.JOBQUEUE = {**settings.JOBQUEUE, "SAMPLE_HANDLERS": False}
    with registry.override():
        for kind in registry.SAMPLES:
            registry.unregister(kind)
        registry.load_configured_handlers()
        yield


def test_the_shipped_settings_register_no_sample_handler():
    env = {k: v for k, v in os.environ.items() if k != "JOBQUEUE_SAMPLE_HANDLERS"}
    code = "from queue_app.handlers import registry; import json; print(json.dumps(registry.kinds()))"
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    kinds = json.loads(out.strip().splitlines()[-1])
    assert "crashy" not in kinds and not set(registry.SAMPLES) & set(kinds)
    assert {"queue_app.webhook", "shell"} <= set(kinds)


@pytest.mark.parametrize("kind", ["crashy", "slow"])
def test_with_the_shipped_settings_the_api_refuses_a_sample_kind_as_unknown(client, shipped, kind):
    _, key = auth.create("writer", scopes=["read", "write"])
    response = post(client, key, {"kind": kind})
    assert response.status_code == 400
    assert response.json() == {
        "error": f"unknown kind {kind!r}: no handler registered for kind {kind!r}",
        "field": "kind",
    }
    response = post(client, key, {"kind": "echo", "on_failure": {"kind": kind}})
    assert response.status_code == 400 and f"unknown kind {kind!r}" in response.json()["error"]
    response = client.post(
        "/api/jobs/bulk",
        {"jobs": [{"kind": "echo"}, {"kind": kind}]},
        content_type="application/json",
        HTTP_X_API_KEY=key,
    )
    assert response.status_code == 400 and response.json()["error"].startswith("job 1: unknown kind")
    assert not Job.objects.exists()


def test_sample_handlers_on_lets_the_api_enqueue_them(client, shipped, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "SAMPLE_HANDLERS": True}
    registry.load_configured_handlers()
    _, key = auth.create("writer", scopes=["read", "write"])
    assert post(client, key, {"kind": "crashy"}).status_code == 201
