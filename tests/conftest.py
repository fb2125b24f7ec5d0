import multiprocessing
import os

import pytest
from django.db import connection, connections

from queue_app import registry
from tests import handlers


def pytest_report_header(config):
    from django.conf import settings

    db = settings.DATABASES["default"]
    return f"jobqueue database: {db['ENGINE'].rsplit('.', 1)[-1]} ({db.get('HOST') or db['NAME']})"


@pytest.fixture(autouse=True)
def _test_handlers():
    """Register the test handlers for every test and drop anything a test added."""
    before = dict(registry._handlers)
    handlers.register_all()
    yield
    registry._handlers.clear()
    registry._handlers.update(before)


@pytest.fixture
def vendor():
    return connection.vendor


def run_processes(target, args_list, timeout=300):
    """Run ``target(*args)`` in one forked process per entry; return their exit codes.

    Connections are closed before forking so no child shares a socket or SQLite handle
    with the parent; each child opens its own.
    """
    connections.close_all()
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_child, args=(target, args)) for args in args_list]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    codes = []
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
        codes.append(p.exitcode)
    return codes


def _child(target, args):
    code = 0
    try:
        connections.close_all()
        target(*args)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        connections.close_all()
        os._exit(code)


@pytest.fixture
def enqueue_job():
    from queue_app import enqueue

    return enqueue
