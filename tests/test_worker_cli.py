"""runworker, work, workers and stopworkers as an operator runs them: real manage.py
subprocesses against the test database."""
import re
import signal
from datetime import timedelta
from io import StringIO

import factory
import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from queue_app import bulk_enqueue, enqueue
from queue_app.models import EventType, Job, State, Worker, WorkerState
from tests.worker_support import manage, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

RUNWORKER = ("runworker", "--import", "tests.worker_support", "--poll", "50ms")


class WorkerFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Worker

    name = factory.Sequence(lambda n: f"host:{100 + n}:abc{n}")
    host = "host"
    pid = factory.Sequence(lambda n: 100 + n)
    queues = ["*"]


def finish(proc, within=20):
    out, _ = proc.communicate(timeout=within)
    return proc.returncode, out


def test_runworker_on_sigterm_finishes_its_job_releases_the_rest_and_exits_0(tmp_path):
    marker = tmp_path / "started"
    first = enqueue("mark", {"path": str(marker), "seconds": 0.5}, priority=5)
    rest = bulk_enqueue([{"kind": "echo"}] * 3)
    proc = manage(*RUNWORKER, "--name", "cli-term", "--batch", "10")
    wait_for(marker.exists, timeout=20, what="the first job to start")

    proc.send_signal(signal.SIGTERM)
    code, out = finish(proc)

    assert code == 0, out
    assert "stopped" in out
    first.refresh_from_db()
    assert first.state == State.COMPLETED
    assert set(Job.objects.filter(id__in=[j.id for j in rest]).values_list("state", flat=True)) == {State.PENDING}
    assert not Job.objects.leased().exists()
    assert Worker.objects.get(name="cli-term").state == WorkerState.STOPPED


def test_stopworkers_from_another_process_stops_a_running_worker():
    proc = manage(*RUNWORKER, "--name", "cli-stop")
    wait_for(lambda: Worker.objects.filter(name="cli-stop", state=WorkerState.RUNNING).exists(),
             timeout=20, what="the worker to register")

    stopper = manage("stopworkers", "--worker", "cli-stop", "--wait", "15s")
    stop_code, stop_out = finish(stopper)
    code, out = finish(proc)

    assert stop_code == 0, stop_out
    assert "stop requested: cli-stop" in stop_out
    assert code == 0, out
    row = Worker.objects.get(name="cli-stop")
    assert row.state == WorkerState.STOPPED
    assert row.stop_requested_at is not None


def test_stopworkers_without_names_asks_every_running_worker():
    running = WorkerFactory.create_batch(2)
    WorkerFactory(state=WorkerState.STOPPED)
    out = StringIO()

    call_command("stopworkers", stdout=out)

    assert Worker.objects.filter(stop_requested_at__isnull=False).count() == 2
    assert all(f"stop requested: {w.name}" in out.getvalue() for w in running)


def test_stopworkers_with_an_unknown_name_fails_and_asks_nobody():
    WorkerFactory(name="known")

    with pytest.raises(CommandError, match="no running worker named ghost"):
        call_command("stopworkers", "--worker", "known", "--worker", "ghost")

    assert not Worker.objects.filter(stop_requested_at__isnull=False).exists()


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


def test_workers_all_includes_stopped_ones():
    WorkerFactory(name="gone", state=WorkerState.STOPPED)
    out = StringIO()

    call_command("workers", "--all", "--json", stdout=out)

    assert '"status": "stopped"' in out.getvalue()


@pytest.mark.parametrize("flag", ["--metrics-addr", "--web-addr"])
def test_runworker_refuses_the_not_yet_available_servers_and_registers_nothing(flag):
    with pytest.raises(CommandError, match="not available yet"):
        call_command("runworker", flag, "127.0.0.1:9100")

    assert not Worker.objects.exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--lease", "5x"], "invalid duration '5x'"),
        (["--poll=-1s"], "invalid duration"),
        (["--concurrency", "0"], "must be at least 1"),
        (["--lease", "1s", "--heartbeat", "2s"], "heartbeat must be shorter"),
        (["--import", "no.such.module"], "--import no.such.module"),
    ],
)
def test_runworker_refuses_bad_flags_with_a_clear_message(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("runworker", *args)

    assert not Worker.objects.exists()


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
