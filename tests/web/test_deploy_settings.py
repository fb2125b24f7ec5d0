"""Settings a deployment sets from the environment: TLS (check --deploy clean once set),
bodies the API refuses in JSON whatever their size, 500s logged with DEBUG off."""

import json
import os
import secrets
import subprocess
import sys

import pytest
from django.test import Client

from queue_app.web import auth as api_auth
from tests.worker_support import ROOT

TLS = {
    "SESSION_COOKIE_SECURE": "1",
    "CSRF_COOKIE_SECURE": "1",
    "SECURE_SSL_REDIRECT": "1",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "1",
    "SECURE_HSTS_PRELOAD": "1",
    "SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https",
}


def check_deploy(**env):
    base = {k: v for k, v in os.environ.items() if k not in TLS and k != "DEBUG"}
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "check", "--deploy"],
        cwd=ROOT,
        env={**base, "SECRET_KEY": secrets.token_urlsafe(50), **env},
        capture_output=True,
        text=True,
        # A bound on a hang, not a speed test: on CI's loaded machine one run had printed
        # "no issues" and still not exited after 60 s, beside the 20-worker shell test.
        timeout=300,
    )


def test_check_deploy_is_clean_once_the_tls_settings_come_from_the_environment():
    done = check_deploy(**TLS)

    assert done.returncode == 0, done.stderr
    assert "System check identified no issues" in done.stdout + done.stderr


def test_check_deploy_names_what_is_missing_without_them():
    done = check_deploy()

    assert "security.W012" in done.stdout + done.stderr  # SESSION_COOKIE_SECURE


def test_a_malformed_proxy_header_setting_stops_start_up():
    done = check_deploy(SECURE_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO")

    assert done.returncode != 0
    assert "SECURE_PROXY_SSL_HEADER must be HEADER,VALUE" in done.stderr


@pytest.mark.django_db
@pytest.mark.parametrize("size, status", [(3 * 1024 * 1024, 400), (6 * 1024 * 1024, 413)])
def test_a_large_body_is_refused_in_json_whatever_its_size(size, status):
    _, raw = api_auth.create("big")
    body = json.dumps({"kind": "echo", "payload": {"blob": "x" * size}})

    r = Client(headers={"X-API-Key": raw}).post("/api/jobs", body, content_type="application/json")

    assert r.status_code == status
    assert r["Content-Type"].startswith("application/json")
    assert r.json()["error"]


FAILING_VIEW = """
import os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobqueue_project.settings")
import django
django.setup()
from django.test import Client, override_settings
from django.urls import path

def boom(request):
    raise RuntimeError("boom-for-the-log")

urlpatterns = [path("boom", boom)]
with override_settings(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["testserver"]):
    print(Client(raise_request_exception=False).get("/boom").status_code)
"""


def test_a_500_is_logged_with_its_traceback_when_debug_is_off():
    env = {k: v for k, v in os.environ.items() if k != "DEBUG"}

    done = subprocess.run(
        [sys.executable, "-c", FAILING_VIEW], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )

    assert done.stdout.strip() == "500"
    assert "Traceback (most recent call last)" in done.stderr
    assert "RuntimeError: boom-for-the-log" in done.stderr


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/dashboard/", "/admin/login/", "/api/jobs"])
def test_every_page_carries_a_content_security_policy_that_runs_only_our_own_scripts(path):
    from django.contrib.auth.models import User

    client = Client()
    client.force_login(User.objects.create_superuser("root"))

    policy = client.get(path)["Content-Security-Policy"]

    assert (
        "script-src 'self'" in policy and "unsafe-inline" not in policy.split("script-src")[1].split(";")[0]
    )
    assert "object-src 'none'" in policy and "frame-ancestors 'none'" in policy
