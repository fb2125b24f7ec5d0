"""The built-in shell kind: argv without a shell, the job's timeout, exit code and output
kept, and 20 real workers running a pile of shell jobs each exactly once."""

import fcntl
import os
import shlex
import signal
import sys
import time

import pytest
from django.db import connection
from django.db.models import Count

from queue_app import bulk_enqueue, enqueue
from queue_app.exceptions import InvalidJob
from queue_app.handlers import registry
from queue_app.models import Event, EventType, Job, State, Worker, WorkerState
from queue_app.worker import shell
from queue_app.worker.execution import run_one
from tests.worker_support import lease_settings, start_worker, wait_for

# The figure is 20 workers x 1,000 jobs: JOBQUEUE_SHELL_TEST_JOBS=20000, as
# `make test` runs it (scripts/test.sh); 2,000 when pytest runs alone, for a quick check.
# JOBQUEUE_SHELL_TEST_JOBS_<VENDOR> (e.g. _POSTGRESQL) sets one database's size.
SHELL_TEST_WORKERS = 20


def shell_test_jobs(vendor):
    return int(
        os.environ.get(f"JOBQUEUE_SHELL_TEST_JOBS_{vendor.upper()}")
        or os.environ.get("JOBQUEUE_SHELL_TEST_JOBS", "2000")
    )


@pytest.fixture
def shell_on(settings):
    settings.JOBQUEUE = lease_settings(SHELL_JOBS=True)
    registry.register("shell", shell.run)


def quoted(path):
    return shlex.quote(str(path))


def only_event(job, type_):
    (event,) = job.events.filter(type=type_)
    return event


@pytest.mark.django_db
@pytest.mark.parametrize(
    "how",
    [
        lambda: enqueue("shell", {"command": "echo hi"}),
        lambda: bulk_enqueue([{"kind": "echo"}, {"kind": "shell", "payload": {"command": "echo hi"}}]),
        lambda: enqueue("echo", on_success={"kind": "shell", "payload": {"command": "echo hi"}}),
    ],
    ids=["enqueue", "bulk", "follow-up"],
)
def test_a_shell_job_is_refused_at_enqueue_where_the_setting_is_off(settings, how):
    settings.JOBQUEUE = lease_settings(SHELL_JOBS=False)

    with pytest.raises(InvalidJob, match="shell jobs are disabled") as refused:
        how()

    assert refused.value.field in ("kind", "on_success")
    assert Job.objects.count() == 0 and Event.objects.count() == 0


@pytest.mark.django_db
def test_a_worker_with_the_setting_off_refuses_a_shell_job_enqueued_elsewhere(settings):
    settings.JOBQUEUE = lease_settings(SHELL_JOBS=True)  # where it was enqueued
    registry.register("shell", shell.run)
    job = enqueue("shell", {"command": "echo hi"})
    settings.JOBQUEUE = lease_settings(SHELL_JOBS=False)  # the worker

    run_one()

    job.refresh_from_db()
    assert job.state == State.PENDING
    assert job.last_error["type"] == "PermissionError"
    assert "SHELL_JOBS" in job.last_error["message"]


@pytest.mark.django_db
def test_a_command_sees_only_the_allowed_environment_variables(shell_on, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://queue:hunter2@db/jobs")
    monkeypatch.setenv("SECRET_KEY", "not-for-commands")
    monkeypatch.setenv("TZ", "Europe/Paris")
    job = enqueue("shell", {"command": "env"})

    run_one()

    job.refresh_from_db()
    names = {line.split("=", 1)[0] for line in job.result["stdout"].splitlines()}
    assert "PATH" in names and "TZ" in names
    assert not names & {"DATABASE_URL", "SECRET_KEY"}
    assert "hunter2" not in job.result["stdout"]


@pytest.mark.django_db
def test_shell_job_stores_exit_code_and_output_in_result_and_event(shell_on):
    job = enqueue("shell", {"command": "echo hi there"})

    run_one()

    job.refresh_from_db()
    assert job.state == State.COMPLETED
    assert job.result == {"exit_code": 0, "stdout": "hi there\n", "stderr": ""}
    assert only_event(job, EventType.COMPLETED).metadata["output"] == {"stdout": "hi there\n"}


@pytest.mark.django_db
def test_string_command_runs_without_a_shell_by_default(shell_on):
    job = enqueue("shell", {"command": "echo $HOME 'a  b' ; whoami"})

    run_one()

    job.refresh_from_db()
    # No shell: the variable, the quoting and the ; reach echo as plain arguments.
    assert job.result["stdout"] == "$HOME a  b ; whoami\n"


@pytest.mark.django_db
def test_use_shell_setting_hands_the_string_to_sh(settings):
    settings.JOBQUEUE = lease_settings(SHELL_JOBS=True, SHELL_JOBS_USE_SHELL=True)
    registry.register("shell", shell.run)
    job = enqueue("shell", {"command": "X=shell; echo $X | tr a-z A-Z"})

    run_one()

    job.refresh_from_db()
    assert job.result["stdout"] == "SHELL\n"


@pytest.mark.django_db
def test_list_command_is_the_argv_as_given(shell_on):
    argv = [sys.executable, "-c", "import sys; print(sys.argv[1:])", "a b", "$X"]
    job = enqueue("shell", {"command": argv})

    run_one()

    job.refresh_from_db()
    assert job.result["stdout"] == "['a b', '$X']\n"


@pytest.mark.django_db
def test_non_zero_exit_fails_the_attempt_with_exit_code_and_stderr_tail(shell_on):
    job = enqueue(
        "shell",
        {"command": "sh -c 'echo partial; echo first >&2; echo it broke >&2; exit 3'"},
        max_attempts=1,
    )

    run_one()

    job.refresh_from_db()
    assert job.state == State.DEAD_LETTER
    assert job.last_error["type"] == "queue_app.worker.shell.CommandFailed"
    assert job.last_error["message"] == "command exited with status 3: first\nit broke"
    event = only_event(job, EventType.DEAD_LETTERED)
    assert event.metadata["output"] == {"stdout": "partial\n", "stderr": "first\nit broke\n"}


@pytest.mark.django_db
def test_error_message_quotes_only_the_end_of_a_long_stderr(shell_on):
    job = enqueue(
        "shell",
        {"command": [sys.executable, "-c", "import sys; sys.stderr.write('x' * 3000 + 'END'); sys.exit(1)"]},
    )

    run_one()

    job.refresh_from_db()
    message = job.last_error["message"]
    assert message.startswith("command exited with status 1: xxx")
    assert message.endswith("END")
    assert len(message) < 2100


@pytest.mark.django_db
def test_command_that_overruns_the_job_timeout_is_killed_and_keeps_its_output(shell_on):
    # 3 s for sh to start and echo before the kill (0.5 s is little on a loaded machine).
    job = enqueue("shell", {"command": "sh -c 'echo started; sleep 30'"}, timeout=3)

    run_one()

    job.refresh_from_db()
    assert job.state == State.PENDING  # a failed attempt with attempts left
    assert job.last_error["type"] == "TimeoutError"
    assert "3s timeout" in job.last_error["message"]
    assert only_event(job, EventType.FAILED).metadata["output"] == {"stdout": "started\n"}


@pytest.mark.django_db
def test_missing_program_fails_the_attempt(shell_on):
    job = enqueue("shell", {"command": "no-such-program-jq --flag"})

    run_one()

    job.refresh_from_db()
    assert job.last_error["type"] == "FileNotFoundError"
    assert "no-such-program-jq" in job.last_error["message"]


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"command": ""},
        {"command": "   "},
        {"command": 42},
        {"command": []},
        {"command": ["ls", 1]},
    ],
)
@pytest.mark.django_db
def test_bad_command_payload_fails_with_a_message_that_says_what_to_fix(shell_on, payload):
    job = enqueue("shell", payload)

    run_one()

    job.refresh_from_db()
    assert job.last_error["type"] == "ValueError"
    assert "command" in job.last_error["message"]


def test_command_timeout_leaves_a_margin_before_the_supervisor_deadline():
    assert shell.command_timeout(None) is None
    assert shell.command_timeout(10) == 9.5
    assert shell.command_timeout(1) == pytest.approx(0.9)
    assert 0 < shell.command_timeout(0.1) < 0.1


@pytest.fixture
def one_at_a_time():
    """make test runs a suite per database at once, and three sets of twenty workers on
    two cores take three times as long each: this test takes a host-wide lock, so the
    suites take turns at it and get on with their other tests meanwhile."""
    with open("/tmp/jobqueue-twenty-workers.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_twenty_workers_run_every_shell_job_exactly_once(one_at_a_time, shell_on, tmp_path):
    """Each job appends its token to its own file: a job run twice shows as two lines."""
    markers = tmp_path / "markers"
    markers.mkdir()
    n = shell_test_jobs(connection.vendor)
    # Half acknowledge one by one (execute), half in batches (complete_many).
    workers = [
        start_worker(concurrency=1, batch=1 if w % 2 else 10, name=f"shell-{w}")
        for w in range(SHELL_TEST_WORKERS)
    ]
    try:
        # All twenty are up and polling before the first job lands, so all of them compete.
        wait_for(
            lambda: Worker.objects.filter(state=WorkerState.RUNNING).count() == SHELL_TEST_WORKERS,
            timeout=60,
            what="20 workers to register",
        )
        began = time.monotonic()
        bulk_enqueue(
            [
                {"kind": "shell", "payload": {"command": f"sh -c 'echo {i} >> {quoted(markers / f'm-{i}')}'"}}
                for i in range(n)
            ]
        )
        wait_for(
            lambda: (
                Job.objects.filter(state=State.COMPLETED).count() == n
                or Job.objects.exclude(state__in=[State.PENDING, State.LEASED, State.COMPLETED]).exists()
            ),
            timeout=900,
            interval=0.5,
            what=f"{n} shell jobs to complete",
        )
        took = time.monotonic() - began
    finally:
        for proc in workers:
            os.kill(proc.pid, signal.SIGTERM)
        for proc in workers:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
                proc.join()
    print(f"\n{n} shell jobs on {SHELL_TEST_WORKERS} workers: {took:.1f}s ({n / took:.0f} jobs/s)")
    assert [p.exitcode for p in workers] == [0] * SHELL_TEST_WORKERS

    assert Job.objects.filter(state=State.COMPLETED).count() == n
    assert sorted(os.listdir(markers)) == sorted(f"m-{i}" for i in range(n))
    wrong = [i for i in range(n) if (markers / f"m-{i}").read_text() != f"{i}\n"]
    assert wrong == [], f"{len(wrong)} markers not written exactly once, e.g. {wrong[:5]}"
    per_job = (
        Event.objects.filter(type__in=[EventType.CLAIMED, EventType.COMPLETED])
        .values("job_id", "type")
        .annotate(times=Count("id"))
        .order_by()
    )
    counts = {(row["job_id"], row["type"]): row["times"] for row in per_job}
    assert len(counts) == 2 * n
    assert set(counts.values()) == {1}
    others = Event.objects.exclude(type__in=[EventType.ENQUEUED, EventType.CLAIMED, EventType.COMPLETED])
    assert list(others.values_list("job_id", "type", "message")[:5]) == []
    # The jobs were shared out, and both ack paths ran. Not every worker is promised a job:
    # on a loaded machine the batch-10 workers can drain the queue before a late
    # batch-1 worker's first poll.
    owners = Event.objects.filter(type=EventType.CLAIMED).values_list("worker", flat=True).distinct()
    names = {owner.partition("/")[0] for owner in owners}
    assert names <= {f"shell-{w}" for w in range(SHELL_TEST_WORKERS)}
    assert len(names) >= SHELL_TEST_WORKERS // 2, sorted(names)
    assert any(int(name.rpartition("-")[2]) % 2 for name in names), "no batch-1 worker ran a job"
    assert any(not int(name.rpartition("-")[2]) % 2 for name in names), "no batch-10 worker ran a job"
