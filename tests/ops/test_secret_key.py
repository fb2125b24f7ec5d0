"""No public secret key: with DEBUG off and no SECRET_KEY, the entry points that serve or
sign refuse to start with one line saying how to set it; with DEBUG on a process makes a
throwaway key and says so."""

import os
import subprocess
import sys

import pytest

from queue_app.models import Worker
from tests.worker_support import ROOT, database_url

pytestmark = pytest.mark.django_db(transaction=True)


def manage_without_a_key(*args, debug=False):
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DEBUG", "SQLITE_TEST_NAME")}
    env["DATABASE_URL"] = database_url()
    if debug:
        env["DEBUG"] = "1"
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "args",
    [
        ["runworker", "--burst"],
        ["work", "--burst"],
        ["web", "--addr", "127.0.0.1:0", "--no-collectstatic"],
        ["metrics", "--addr", "127.0.0.1:0"],
    ],
)
def test_an_entry_point_that_serves_or_signs_refuses_to_start_without_a_secret_key(args):
    done = manage_without_a_key(*args)

    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "SECRET_KEY is not set" in lines[0] and "export SECRET_KEY=" in lines[0]
    assert not Worker.objects.exists()


def test_a_command_that_neither_serves_nor_signs_still_runs_without_a_secret_key():
    done = manage_without_a_key("inspect", "--json")

    assert done.returncode == 0, done.stderr


def test_with_debug_on_a_worker_makes_a_throwaway_key_and_says_so():
    done = manage_without_a_key("runworker", "--burst", debug=True)

    assert done.returncode == 0, done.stderr
    assert "throwaway key" in done.stderr
    assert Worker.objects.filter(state="stopped").count() == 1


def test_the_repository_holds_no_default_secret_key():
    settings_py = (ROOT / "jobqueue_project" / "settings.py").read_text()

    assert 'env("SECRET_KEY", default="")' in settings_py
    assert "insecure-dev-key" not in settings_py
