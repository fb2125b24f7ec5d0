"""The example project's settings from the environment: each case is a fresh `manage.py`
process (settings are read once, at start-up), on its own SQLite file."""

import os
import subprocess
import sys

from tests.worker_support import ROOT

SHOW_SYNC = (
    "from django.db import connection; print(connection.cursor().execute('PRAGMA synchronous').fetchone()[0])"
)


def manage_shell(tmp_path, code, **env):
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith("JOBQUEUE_") and k != "SQLITE_TEST_NAME"
    }
    environ.update(DATABASE_URL=f"sqlite:///{tmp_path / 'settings.db'}", **env)
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "shell", "--verbosity", "0", "-c", code],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_sqlite_commits_sync_normally_by_default_and_fully_when_asked(tmp_path):
    # PRAGMA synchronous reads 1 for NORMAL, 2 for FULL, 3 for EXTRA.
    default = manage_shell(tmp_path, SHOW_SYNC)
    assert default.returncode == 0, default.stderr
    assert default.stdout.split() == ["1"]
    full = manage_shell(tmp_path, SHOW_SYNC, SQLITE_SYNCHRONOUS="full")
    assert full.returncode == 0, full.stderr
    assert full.stdout.split() == ["2"]


def test_an_unknown_sqlite_synchronous_value_stops_start_up_with_a_clear_message(tmp_path):
    bad = manage_shell(tmp_path, SHOW_SYNC, SQLITE_SYNCHRONOUS="OFF")
    assert bad.returncode != 0
    assert "SQLITE_SYNCHRONOUS must be NORMAL, FULL or EXTRA, not 'OFF'" in bad.stderr
    assert not (tmp_path / "settings.db").exists()


SHOW_TASK_LOGGING = (
    "import logging;"
    "print(logging.getLogger('django.tasks').isEnabledFor(logging.INFO),"
    " logging.getLogger('queue_app').isEnabledFor(logging.INFO))"
)


def test_djangos_task_lines_are_made_only_where_djangos_handlers_print_them(tmp_path):
    # Django's handlers print its INFO lines only with DEBUG on: off, none is made.
    quiet = manage_shell(tmp_path, SHOW_TASK_LOGGING, DEBUG="0", SECRET_KEY="k" * 50)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.split() == ["False", "True"]
    debug = manage_shell(tmp_path, SHOW_TASK_LOGGING, DEBUG="1", SECRET_KEY="k" * 50)
    assert debug.returncode == 0, debug.stderr
    assert debug.stdout.split() == ["True", "True"]
    # A level name in any case; ERROR keeps both at ERROR.
    error = manage_shell(
        tmp_path, SHOW_TASK_LOGGING, DEBUG="1", JOBQUEUE_LOG_LEVEL="error", SECRET_KEY="k" * 50
    )
    assert error.returncode == 0, error.stderr
    assert error.stdout.split() == ["False", "False"]
