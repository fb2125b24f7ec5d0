"""A fresh Django project that knows only django.tasks and our backend, run as a site
would run it: its own settings module and tasks module, `migrate`, a script that
enqueues, `runworker`, and a script that reads the results back, each a subprocess.

The project lives in tmp_path and shares nothing with jobqueue_project but the
database server: on SQLite it migrates a file of its own; on PostgreSQL and MariaDB it
uses the suite's test database, whose tables exist already (`migrate --check` says so).
"""

import json
import os
import subprocess
import sys

import pytest
from django.db import connection, connections

from tests.worker_support import ROOT

SETTINGS = """\
SECRET_KEY = "fresh"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["queue_app"]
DATABASES = {{"default": {database!r}}}
TASKS = {{
    "default": {{
        "BACKEND": "queue_app.backends.DatabaseBackend",
        # Three attempts, 50 ms apart, so the test need not wait out a real backoff.
        "OPTIONS": {{"max_attempts": 3, "backoff": {{"base": 1, "max": 0.05, "jitter": False}}}},
    }}
}}
"""

TASKS = '''\
import asyncio
from pathlib import Path

from django.tasks import task


@task
def add(a, b):
    return a + b


@task
async def shout(word):
    await asyncio.sleep(0)
    return word.upper()


@task
def flaky(counter, fails):
    """Fail the first ``fails`` times (counted in a file), then succeed."""
    path = Path(counter)
    runs = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(runs))
    if runs <= fails:
        raise RuntimeError(f"run {runs} fails")
    return runs


@task
def broken():
    raise ValueError("always broken")
'''

ENQUEUE = """\
import json
import sys

import django

django.setup()
from freshsite import tasks

results = {
    "add": tasks.add.enqueue(2, 40),
    "shout": tasks.shout.enqueue("hello"),
    "flaky": tasks.flaky.enqueue(sys.argv[1], 2),
    "broken": tasks.broken.enqueue(),
}
print(json.dumps({name: [r.id, r.status.name] for name, r in results.items()}))
"""

REPORT = """\
import json
import sys

import django

django.setup()
from django.tasks import default_task_backend
from freshsite import tasks

ids = json.loads(sys.argv[1])


def report(result):
    result.refresh()
    return {
        "status": result.status.name,
        "value": result.return_value if result.status.name == "SUCCESSFUL" else None,
        "attempts": result.attempts,
        "errors": [[e.exception_class_path, e.traceback.splitlines()[-1]] for e in result.errors],
        "finished": result.finished_at is not None,
    }


print(json.dumps({
    "add": report(tasks.add.get_result(ids["add"])),
    "shout": report(tasks.shout.get_result(ids["shout"])),
    "flaky": report(default_task_backend.get_result(ids["flaky"])),
    "broken": report(default_task_backend.get_result(ids["broken"])),
}))
"""

# Not a django.tasks API: the test's own look at the queue's dead-letter table.
DEAD_LETTERS = """\
import json
import sys

import django

django.setup()
from queue_app.models import DeadLetter

ids = [int(i) for i in sys.argv[1:]]
print(json.dumps(sorted(DeadLetter.objects.filter(job_id__in=ids).values_list("job_id", flat=True))))
"""


def database_settings(tmp_path):
    """DATABASES["default"] for the fresh project: the suite's database server, with the
    suite's connection options (SQLite's WAL and busy timeout, MariaDB's READ COMMITTED)."""
    s = connection.settings_dict
    database = {key: s[key] for key in ("ENGINE", "NAME", "USER", "PASSWORD", "HOST", "PORT", "OPTIONS")}
    if connection.vendor == "sqlite":
        database["NAME"] = str(tmp_path / "fresh.sqlite3")
    return database


@pytest.fixture
def project(tmp_path):
    package = tmp_path / "freshsite"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "settings.py").write_text(SETTINGS.format(database=database_settings(tmp_path)))
    (package / "tasks.py").write_text(TASKS)
    for name, text in (("enqueue.py", ENQUEUE), ("report.py", REPORT), ("dead_letters.py", DEAD_LETTERS)):
        (tmp_path / name).write_text(text)
    # Only what a site's own environment would hold: none of the suite's DATABASE_URL,
    # JOBQUEUE_* or DJANGO_SETTINGS_MODULE.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("JOBQUEUE_", "DJANGO_")) and k not in ("DATABASE_URL", "SQLITE_TEST_NAME")
    }
    env.update(
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
        DJANGO_SETTINGS_MODULE="freshsite.settings",
        PYTHONUNBUFFERED="1",
    )

    def run(*args, timeout=60):
        connections.close_all()
        done = subprocess.run(
            [sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout
        )
        assert done.returncode == 0, (
            f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
        return done.stdout

    return tmp_path, run


@pytest.mark.django_db(transaction=True)
def test_a_fresh_project_runs_retries_and_dead_letters_its_tasks_through_runworker(project):
    path, run = project
    if connection.vendor == "sqlite":
        run("-m", "django", "migrate", "--verbosity", "0")
    else:
        run("-m", "django", "migrate", "--check")

    enqueued = json.loads(run("enqueue.py", str(path / "counter")))
    assert {status for _, status in enqueued.values()} == {"READY"}
    ids = {name: job_id for name, (job_id, _) in enqueued.items()}

    # 1 + 1 + 3 + 3 attempts; the two retries of each wait 50 ms, so --burst could
    # leave before they are due: --max-jobs exits once all eight attempts ran.
    run("-m", "django", "runworker", "--max-jobs", "8", "--poll", "20ms")

    results = json.loads(run("report.py", json.dumps(ids)))
    assert results["add"] == {
        "status": "SUCCESSFUL",
        "value": 42,
        "attempts": 1,
        "errors": [],
        "finished": True,
    }
    assert results["shout"]["status"] == "SUCCESSFUL" and results["shout"]["value"] == "HELLO"
    assert results["flaky"] == {
        "status": "SUCCESSFUL",
        "value": 3,
        "attempts": 3,
        "finished": True,
        "errors": [
            ["builtins.RuntimeError", "RuntimeError: run 1 fails"],
            ["builtins.RuntimeError", "RuntimeError: run 2 fails"],
        ],
    }
    assert results["broken"] == {
        "status": "FAILED",
        "value": None,
        "attempts": 3,
        "finished": True,
        "errors": [["builtins.ValueError", "ValueError: always broken"]] * 3,
    }
    assert json.loads(run("dead_letters.py", *ids.values())) == [int(ids["broken"])]
    # Nothing is left for a worker to do.
    run("-m", "django", "runworker", "--burst")
    assert (path / "counter").read_text() == "3"
