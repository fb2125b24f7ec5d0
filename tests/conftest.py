import multiprocessing
import os
import sys

import pytest
from django.db import connection, connections
from hypothesis import settings as hypothesis_settings
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from queue_app.handlers import registry
from tests import sample_handlers as handlers

# The project has no SECRET_KEY of its own (web and runworker refuse to start without one):
# the tests' manage.py subprocesses inherit this one.
TEST_SECRET_KEY = "tests-only-not-a-secret"
os.environ.setdefault("SECRET_KEY", TEST_SECRET_KEY)
# The sample workloads (crashy, slow ...) are registered only where asked: the tests'
# manage.py subprocesses inherit this; the test process registers them in pytest_configure.
os.environ["JOBQUEUE_SAMPLE_HANDLERS"] = "1"

# Hypothesis's per-example deadline (200 ms) is a timing assertion, and the suites share
# two cores in CI: a 0.15 ms example of the redaction property once took 256 ms there.
# The properties check rules, not speed (benchmarks/ measure that), so none has a deadline.
hypothesis_settings.register_profile("jobqueue", deadline=None)
hypothesis_settings.load_profile("jobqueue")


def pytest_configure(config):
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    # Settings were read before this module set the variable (pytest-django sets Django
    # up first): the in-process tests need the key as well.
    try:
        missing = not settings.SECRET_KEY
    except ImproperlyConfigured:  # Django refuses to hand out an empty key
        missing = True
    if missing:
        settings.SECRET_KEY = os.environ["SECRET_KEY"]
    # WhiteNoise's middleware reads the metadata of every file under STATIC_ROOT each time
    # it is built, which the tests do for each test client (~290 files once anything has
    # collected there: the tests that start `manage.py web` do). No in-process test serves
    # a collected file (live_server serves them from the apps, the servers the tests start
    # are processes with their own settings), so here the tests' clients read no
    # directory, as in a fresh checkout, whichever test ran first.
    settings.STATIC_ROOT = None
    registry.load_samples()
    _cheaper_flush()


# Rows only the migrations' post_migrate handlers make (and no test changes): kept by the
# tests' flush, so that post_migrate, which runs after every flush, finds them all and
# inserts nothing, instead of making all of them again after every transaction=True test.
KEPT_BY_FLUSH = {"django_content_type", "auth_permission"}


def _cheaper_flush():
    """A transaction=True test ends with Django's flush command: every table emptied, then
    post_migrate. Two things made it cost most of a second on PostgreSQL. There the flush
    is one TRUNCATE of every table, which gives each of our 33 tables new files and waits on
    a WAL flush, 0.7-0.9 s whatever the tables hold; DELETE of the few rows a test leaves
    takes milliseconds, with the same result (every table empty, sequences kept, as the
    flush without reset_sequences keeps them; Django's foreign keys are checked at the
    flush's commit, so the order does not matter). MySQL and SQLite flush by DELETE
    already. And the content types and permissions were deleted and inserted again each
    time (KEPT_BY_FLUSH). A flush that resets sequences is Django's own."""
    from django.core.management.commands import flush

    django_sql_flush = flush.sql_flush

    def sql_flush(style, connection, reset_sequences=True, allow_cascade=False):
        if reset_sequences:
            return django_sql_flush(style, connection, reset_sequences=True, allow_cascade=allow_cascade)
        tables = [
            table
            for table in connection.introspection.django_table_names(only_existing=True, include_views=False)
            if table not in KEPT_BY_FLUSH
        ]
        if connection.vendor == "postgresql":
            return [f"DELETE FROM {connection.ops.quote_name(table)};" for table in tables]
        return connection.ops.sql_flush(style, tables, reset_sequences=False, allow_cascade=allow_cascade)

    flush.sql_flush = sql_flush


def pytest_collection_modifyitems(config, items):
    # JOBQUEUE_TEST_SKIP_PROPERTIES=1 (scripts/test.sh's Django 6.0 repeat): leave out the
    # hypothesis tests. They check our rules over many generated cases, which the main
    # runs do on every database; a quarter of the repeat's time, for no more of Django's API.
    if os.environ.get("JOBQUEUE_TEST_SKIP_PROPERTIES") != "1":
        return
    keep, drop = [], []
    for item in items:
        (drop if getattr(getattr(item, "obj", None), "is_hypothesis_test", False) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_report_header(config):
    from django.conf import settings

    db = settings.DATABASES["default"]
    return f"jobqueue database: {db['ENGINE'].rsplit('.', 1)[-1]} ({db.get('HOST') or db['NAME']})"


@pytest.fixture(autouse=True)
def _test_handlers():
    """Register the test handlers for every test and drop anything a test added."""
    with registry.override():
        handlers.register_all()
        yield


# Settings keys the project reads from JOBQUEUE_* environment variables, at the values
# the project ships with: a developer's exports must not change what the tests see.
PROJECT_ENV_DEFAULTS = {
    "LEASE_SECONDS": 30.0,
    "AGING_INTERVAL": 30.0,
    "DEFAULT_MAX_ATTEMPTS": 3,
    "SHELL_JOBS": False,
    "SAMPLE_HANDLERS": True,
}


@pytest.fixture(autouse=True)
def _project_queue_settings(settings):
    """Pin settings.JOBQUEUE to the project's own (its HANDLERS included), env ignored."""
    settings.JOBQUEUE = {**getattr(settings, "JOBQUEUE", {}), **PROJECT_ENV_DEFAULTS}


@pytest.fixture(autouse=True)
def _kill_surviving_workers():
    """Kill whatever worker or manage.py process a test started and left running."""
    yield
    support = sys.modules.get("tests.worker_support")  # imported only by the tests that fork
    if support is not None:
        support.kill_survivors()


@pytest.fixture(autouse=True)
def _test_task_modules(settings):
    """Let the test modules' django.tasks functions resolve (tests/ is not an app)."""
    settings.JOBQUEUE = {**settings.JOBQUEUE, "TASK_MODULES": [*registry.task_modules(), "tests"]}


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


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    # The default hasher spends most of a second per user by design.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


_span_exporter = InMemorySpanExporter()


@pytest.fixture
def spans():
    """OpenTelemetry's SDK with an in-memory exporter: the spans finished in the test."""
    # The global provider can be set once per process: the first test that asks sets it.
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_span_exporter))
        trace.set_tracer_provider(provider)
    _span_exporter.clear()
    yield _span_exporter
    _span_exporter.clear()
