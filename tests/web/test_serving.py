"""`manage.py web` serves the site's own WSGI application, not the example project's."""

import os
import socket
import time
import urllib.error
import urllib.request

import pytest

from queue_app.management.commands.web import gunicorn_argv
from tests.worker_support import manage, wait_for


def test_web_serves_the_wsgi_application_the_settings_name(settings):
    settings.WSGI_APPLICATION = "mysite.wsgi.app"

    argv = gunicorn_argv(":8000")

    assert "mysite.wsgi:app" in argv
    assert not any("jobqueue_project" in arg for arg in argv)


def test_web_serves_the_example_project_by_default():
    assert "jobqueue_project.wsgi:application" in gunicorn_argv("127.0.0.1:8000")


def test_web_runs_threaded_workers_sized_from_the_cpus(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "WEB_WORKERS": None, "WEB_THREADS": 8}

    argv = gunicorn_argv(":8000")

    assert argv[argv.index("--worker-class") + 1] == "gthread"
    assert argv[argv.index("--threads") + 1] == "8"
    assert int(argv[argv.index("--workers") + 1]) == max(2, os.cpu_count() or 1)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url, timeout):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


# Transactional: a test transaction would hold SQLite's write lock against the server.
@pytest.mark.django_db(transaction=True)
def test_two_clients_that_never_finish_their_request_do_not_stop_the_site():
    port = _free_port()
    # Two processes, as `manage.py web` ran before (two sync workers: both held here).
    proc = manage("web", "--addr", f"127.0.0.1:{port}", "--workers", "2", "--no-collectstatic")
    base = f"http://127.0.0.1:{port}"
    slow = []
    try:
        wait_for(lambda: _ready(base), timeout=30, what="manage.py web to answer")
        for _ in range(2):
            client = socket.create_connection(("127.0.0.1", port), timeout=5)
            client.sendall(b"GET /admin/login/ HTTP/1.1\r\nHost: localhost\r\n")  # no blank line: unfinished
            slow.append(client)
        time.sleep(0.5)

        began = time.monotonic()
        assert _answers(base + "/admin/login/", timeout=10) == 200
        assert time.monotonic() - began < 5
    finally:
        for client in slow:
            client.close()
        proc.terminate()
        proc.wait(10)


def _ready(base):
    try:
        return _answers(base + "/admin/login/", timeout=1) == 200
    except OSError:
        return False
