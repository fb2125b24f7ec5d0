"""runworker, work, workers and stopworkers as an operator runs them: real manage.py
subprocesses against the test database."""

import re
import signal
import socket
import time
import urllib.error
import urllib.request
from datetime import timedelta
from io import StringIO

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from queue_app import bulk_enqueue, enqueue
from queue_app.models import EventType, Job, State, Worker, WorkerState
from queue_app.worker import loop as worker
from tests import worker_support
from tests.factories import WorkerFactory
from tests.worker_support import manage, read_until, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
# The tests that run all they test in this process (no worker process, no subprocess, no
# second connection) need no commit: a transaction rolled back after each, not a flush of
# every table.
in_process = pytest.mark.django_db

RUNWORKER = ("runworker", "--import", "tests.worker_support", "--poll", "50ms")


def finish(proc, within=20):
    out, _ = proc.communicate(timeout=within)
    return proc.returncode, out


def test_runworker_on_sigterm_finishes_its_job_releases_the_rest_and_exits_0(tmp_path):
    marker = tmp_path / "started"
    # The first job runs until the test appends a line, after the stop has reached the
    # worker: a fixed half-second job ended before a loaded machine delivered it.
    first = enqueue("mark", {"path": str(marker), "seconds": 60, "until_lines": 2}, priority=5)
    rest = bulk_enqueue([{"kind": "echo"}] * 3)
    proc = manage(*RUNWORKER, "--name", "cli-term", "--batch", "10")
    wait_for(marker.exists, timeout=90, what="the first job to start", proc=proc)

    proc.send_signal(signal.SIGTERM)
    worker_support.end_mark_once_stopping(marker, "cli-term")
    code, out = finish(proc, within=60)

    assert code == 0, out
    assert "stopped" in out
    first.refresh_from_db()
    assert first.state == State.COMPLETED
    assert set(Job.objects.filter(id__in=[j.id for j in rest]).values_list("state", flat=True)) == {
        State.PENDING
    }
    assert not Job.objects.leased().exists()
    assert Worker.objects.get(name="cli-term").state == WorkerState.STOPPED


def test_stopworkers_from_another_process_stops_a_running_worker():
    proc = manage(*RUNWORKER, "--name", "cli-stop")
    wait_for(
        lambda: Worker.objects.filter(name="cli-stop", state=WorkerState.RUNNING).exists(),
        timeout=90,
        what="the worker to register",
        proc=proc,
    )

    # Generous waits: CI runs four suites at once on two cores.
    stopper = manage("stopworkers", "--worker", "cli-stop", "--wait", "50s")
    stop_code, stop_out = finish(stopper, within=60)
    code, out = finish(proc, within=60)

    assert stop_code == 0, stop_out
    assert "stop requested: cli-stop" in stop_out
    assert code == 0, out
    row = Worker.objects.get(name="cli-stop")
    assert row.state == WorkerState.STOPPED
    assert row.stop_requested_at is not None


def test_quiet_worker_finishes_its_running_job_leases_no_more_and_stays_up_until_stopped(tmp_path):
    marker = tmp_path / "started"
    first = enqueue("mark", {"path": str(marker), "seconds": 1.5}, priority=5)
    proc = manage(*RUNWORKER, "--name", "cli-quiet", "--heartbeat", "0.5")
    wait_for(marker.exists, timeout=90, what="the first job to start", proc=proc)

    quieter = manage("stopworkers", "--quiet", "--worker", "cli-quiet", "--wait", "50s")
    quiet_code, quiet_out = finish(quieter, within=60)
    later = enqueue("echo")
    time.sleep(1.0)  # a few polls: a leasing worker would have taken it

    assert quiet_code == 0, quiet_out
    assert "quiet requested: cli-quiet" in quiet_out
    first.refresh_from_db()
    later.refresh_from_db()
    assert first.state == State.COMPLETED
    assert later.state == State.PENDING
    row = Worker.objects.get(name="cli-quiet")
    assert (row.status, row.jobs_in_hand) == (WorkerState.QUIET, 0)
    beat = row.last_heartbeat
    wait_for(
        lambda: Worker.objects.get(name="cli-quiet").last_heartbeat > beat,
        timeout=30,
        what="a heartbeat while quiet",
        proc=proc,
    )
    assert proc.poll() is None  # still up

    stopper = manage("stopworkers", "--worker", "cli-quiet", "--wait", "50s")
    stop_code, stop_out = finish(stopper, within=60)
    code, out = finish(proc, within=60)
    assert (stop_code, code) == (0, 0), (stop_out, out)
    assert "quiet" in out
    assert Worker.objects.get(name="cli-quiet").state == WorkerState.STOPPED
    later.refresh_from_db()
    assert later.state == State.PENDING


@in_process
def test_stopworkers_quiet_asks_running_workers_but_not_stopping_ones():
    running = WorkerFactory(name="up")
    WorkerFactory(name="leaving", stop_requested_at=timezone.now())
    out = StringIO()

    call_command("stopworkers", "--quiet", stdout=out)

    assert out.getvalue().splitlines() == ["quiet requested: up"]
    assert list(Worker.objects.filter(quiet_requested_at__isnull=False).values_list("id", flat=True)) == [
        running.id
    ]


@in_process
def test_stopworkers_without_names_asks_every_running_worker():
    running = WorkerFactory.create_batch(2)
    WorkerFactory(state=WorkerState.STOPPED)
    out = StringIO()

    call_command("stopworkers", stdout=out)

    assert Worker.objects.filter(stop_requested_at__isnull=False).count() == 2
    assert all(f"stop requested: {w.name}" in out.getvalue() for w in running)


@in_process
def test_stopworkers_with_an_unknown_name_fails_and_asks_nobody():
    WorkerFactory(name="known")

    with pytest.raises(CommandError, match="no running worker named ghost") as err:
        call_command("stopworkers", "--worker", "known", "--worker", "ghost")

    assert err.value.returncode == 2
    assert not Worker.objects.filter(stop_requested_at__isnull=False).exists()


@in_process
def test_workers_lists_running_workers_and_shows_a_stale_one_as_lost():
    WorkerFactory(name="fresh", jobs_in_hand=3)
    WorkerFactory(name="stale", last_heartbeat=timezone.now() - timedelta(minutes=10))
    WorkerFactory(name="gone", state=WorkerState.STOPPED)
    out = StringIO()

    call_command("workers", stdout=out)

    lines = {line.split()[0]: line for line in out.getvalue().splitlines()[1:]}
    assert set(lines) == {"fresh", "stale"}
    assert "running" in lines["fresh"]
    assert "lost" in lines["stale"]
    assert re.search(r"\b10m0\ds ago", lines["stale"])


@in_process
def test_workers_all_includes_stopped_ones():
    WorkerFactory(name="gone", state=WorkerState.STOPPED)
    out = StringIO()

    call_command("workers", "--all", "--json", stdout=out)

    assert '"status": "stopped"' in out.getvalue()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port, path):
    """(status, body) of GET http://127.0.0.1:port/path; (None, error) if nothing answers."""
    try:
        # A loaded machine took more than 5 s over a server's first page (CI, PostgreSQL).
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return None, str(exc)


def test_runworker_serves_metrics_and_the_web_ui_beside_its_jobs_and_stops_them_with_it():
    metrics_port, web_port = free_port(), free_port()
    job = enqueue("echo", {"n": 1})
    proc = manage(
        *RUNWORKER,
        "--name",
        "cli-side",
        "--metrics-addr",
        f"127.0.0.1:{metrics_port}",
        "--web-addr",
        f"127.0.0.1:{web_port}",
    )
    wait_for(
        lambda: Job.objects.filter(id=job.id, state=State.COMPLETED).exists(),
        timeout=60,
        what="the worker to run a job",
    )

    status, body = http_get(metrics_port, "/metrics")
    assert status == 200, body
    assert 'jobqueue_jobs{state="completed"} 1.0' in body
    status, body = http_get(web_port, "/health")
    assert status == 200, body
    status, _ = http_get(web_port, "/dashboard/")
    assert status == 200  # the login page, after the redirect

    proc.send_signal(signal.SIGTERM)
    code, out = finish(proc, within=40)
    assert code == 0, out
    # Both servers went with the worker.
    assert http_get(metrics_port, "/metrics")[0] is None
    assert http_get(web_port, "/health")[0] is None
    assert Worker.objects.get(name="cli-side").state == WorkerState.STOPPED


def test_runworker_refuses_to_start_when_its_metrics_port_is_taken_and_registers_nothing():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = manage(*RUNWORKER, "--name", "cli-taken", "--metrics-addr", f"127.0.0.1:{port}")
        code, out = finish(proc, within=40)

    assert code != 0
    assert f"cannot serve the metrics server on 127.0.0.1:{port}: Address already in use" in out
    assert not Worker.objects.exists()


@in_process
@pytest.mark.parametrize(
    "flag, addr, message",
    [
        ("--metrics-addr", "9100", "--metrics-addr '9100' is not HOST:PORT or :PORT"),
        ("--metrics-addr", "host:99999", "--metrics-addr 'host:99999' is not HOST:PORT"),
        ("--metrics-addr", "nonsense", "--metrics-addr 'nonsense' is not HOST:PORT"),
        ("--web-addr", "a b:80", "--web-addr 'a b:80' is not HOST:PORT"),
    ],
)
def test_runworker_refuses_a_malformed_server_address_and_registers_nothing(flag, addr, message):
    with pytest.raises(CommandError, match=re.escape(message)) as err:
        call_command("runworker", flag, addr)

    assert err.value.returncode == 2
    assert not Worker.objects.exists()


@in_process
@pytest.mark.parametrize(
    "args, message",
    [
        (["--lease", "5x"], "invalid duration '5x'"),
        (["--lease", "0"], "argument --lease: invalid duration '0': must be longer than 0"),
        (["--poll=-1s"], "invalid duration"),
        # An idle worker would look again without pausing, forever.
        (["--poll", "0"], "argument --poll: invalid duration '0': must be longer than 0"),
        (["--heartbeat", "0s"], "argument --heartbeat: invalid duration '0s': must be longer than 0"),
        (["--timeout", "0"], "argument --timeout: invalid duration '0': must be longer than 0"),
        # 0 used to mean "no limit" without a word; leaving the flag out means that.
        (["--max-runtime", "0"], "argument --max-runtime: invalid duration '0': must be longer than 0"),
        (["--max-jobs", "-1"], "argument --max-jobs: invalid number '-1': must be at least 1"),
        (["--concurrency", "0"], "must be at least 1"),
        (["--lease", "1s", "--heartbeat", "2s"], "heartbeat must be shorter than the lease (1s)"),
        (["--heartbeat", "20s", "--lease", "10s"], "heartbeat must be shorter than the lease (10s)"),
        (["--heartbeat", "40s"], "heartbeat must be shorter than the lease (30s)"),  # LEASE_SECONDS
        (["--import", "no.such.module"], "--import no.such.module: No module named 'no'"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_runworker_refuses_bad_flags_with_a_clear_message_and_status_2(args, message):
    with pytest.raises(CommandError, match=re.escape(message)) as err:
        call_command("runworker", *args)

    assert err.value.returncode == 2
    assert not Worker.objects.exists()


@in_process
def test_runworker_defaults_for_kinds_max_jobs_max_runtime_and_burst_come_from_settings(settings):
    assert (worker.Options().resolved().kinds, worker.Options().resolved().burst) == ((), False)
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "WORKER_KINDS": ["echo"],
        "WORKER_MAX_JOBS": 7,
        "WORKER_MAX_RUNTIME": 60.0,
        "WORKER_BURST": True,
    }

    defaults = worker.Options().resolved()
    given = worker.Options(kinds=("add",), max_jobs=1, max_runtime=5.0, burst=False).resolved()

    assert (defaults.kinds, defaults.max_jobs, defaults.max_runtime, defaults.burst) == (
        ("echo",),
        7,
        60.0,
        True,
    )
    assert (given.kinds, given.max_jobs, given.max_runtime, given.burst) == (("add",), 1, 5.0, False)


def test_runworker_stops_after_the_worker_max_jobs_setting_without_a_flag(settings):
    # WORKER_MAX_RUNTIME only bounds the test if the budget were ignored.
    settings.JOBQUEUE = {**settings.JOBQUEUE, "WORKER_MAX_JOBS": 2, "WORKER_MAX_RUNTIME": 20.0}
    bulk_enqueue([{"kind": "echo", "payload": {"n": n}} for n in range(5)])

    call_command("runworker", "--poll", "50ms", "--batch", "1", "--name", "budget")

    assert Job.objects.completed().count() == 2
    assert Job.objects.filter(state=State.PENDING).count() == 3
    assert Worker.objects.get(name="budget").state == WorkerState.STOPPED


def test_runworker_burst_and_kinds_from_settings_and_no_burst_overrides_it(settings):
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "WORKER_BURST": True,
        "WORKER_KINDS": ["echo"],
        "WORKER_MAX_RUNTIME": 20.0,
    }
    bulk_enqueue([{"kind": "echo"}] * 2 + [{"kind": "add", "payload": {"a": 1, "b": 1}}])

    call_command("runworker", "--poll", "50ms")  # drains the echo jobs, then exits

    assert list(Job.objects.completed().values_list("kind", flat=True)) == ["echo", "echo"]
    assert Job.objects.get(kind="add").state == State.PENDING
    started = time.monotonic()
    call_command("runworker", "--no-burst", "--max-runtime", "1s", "--poll", "50ms")  # waits, nothing to do
    assert time.monotonic() - started >= 1.0


def test_work_is_runworker_under_the_seeds_name():
    bulk_enqueue([{"kind": "echo"}] * 3 + [{"kind": "add", "payload": {"a": 1, "b": 1}}])

    call_command("work", "--burst", "--kind", "echo", "--poll", "50ms")

    assert list(Job.objects.completed().values_list("kind", flat=True)) == ["echo"] * 3
    assert Job.objects.get(kind="add").state == State.PENDING
    assert all(
        e == [EventType.ENQUEUED, EventType.CLAIMED, EventType.COMPLETED]
        for e in (list(j.events.values_list("type", flat=True)) for j in Job.objects.completed())
    )


def test_a_stopped_workers_name_can_be_reused_but_a_running_ones_cannot():
    WorkerFactory(name="reused", state=WorkerState.STOPPED, jobs_done=7)
    WorkerFactory(name="busy")
    enqueue("echo")

    call_command("runworker", "--burst", "--name", "reused", "--poll", "50ms")
    with pytest.raises(CommandError, match="'busy' is already running"):
        call_command("runworker", "--burst", "--name", "busy")

    row = Worker.objects.get(name="reused")
    assert (row.state, row.jobs_done) == (WorkerState.STOPPED, 1)
    assert Job.objects.get().state == State.COMPLETED


@pytest.mark.django_db(transaction=True)
def test_runworker_waits_out_a_database_that_refuses_it_and_starts_work_when_it_answers():
    if connection.vendor != "postgresql":
        pytest.skip("refusing every new connection (ALLOW_CONNECTIONS false) is PostgreSQL's")
    s = connection.settings_dict
    job = enqueue("echo", {"n": 1})
    admin = psycopg.connect(
        host=s["HOST"] or "127.0.0.1",
        port=s["PORT"] or 5432,
        user=s["USER"],
        dbname="postgres",
        autocommit=True,
    )
    admin.execute(f'ALTER DATABASE "{s["NAME"]}" ALLOW_CONNECTIONS false')
    try:
        proc = manage(*RUNWORKER, "--name", "refused-at-start", "--burst")
        # Under load the process can take seconds to boot: wait for the refusal itself.
        before = read_until(proc, "the database refused the start", timeout=60)
        time.sleep(1.0)
        # Refused, it is still there and retrying (a worker that exits here crash-loops).
        assert proc.poll() is None
    finally:
        admin.execute(f'ALTER DATABASE "{s["NAME"]}" ALLOW_CONNECTIONS true')
        admin.close()
    rest, _ = proc.communicate(timeout=60)
    out = before + rest

    assert proc.returncode == 0, out
    assert out.count("the database refused the start") == 1  # once per episode
    assert "the database answered after" in out
    job.refresh_from_db()
    assert job.state == State.COMPLETED
    assert Worker.objects.get(name="refused-at-start").state == WorkerState.STOPPED
