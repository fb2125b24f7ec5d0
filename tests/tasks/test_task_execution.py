"""django.tasks functions running on our workers: results, errors, retries, context, signals."""

import json
import os
import sys
import time
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.tasks import TaskResultStatus, default_task_backend, task
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils import timezone

from queue_app.core import enqueueing, transitions
from queue_app.handlers import registry
from queue_app.handlers.registry import UnknownTask
from queue_app.models import DeadLetter, EventType, Job, State
from queue_app.tasks import results
from queue_app.tasks.backend import DatabaseBackend
from queue_app.tasks.results import LeaseExpired
from queue_app.worker.execution import claimed, run_one
from tests import sample_handlers as handlers
from tests import sample_tasks as tasks

pytestmark = pytest.mark.django_db

WORKER = "test-host:1:tasks"


def run(worker=WORKER):
    job = run_one(worker_id=worker)
    assert job is not None, "no job was ready"
    return job


def retry(job):
    """Make a job waiting out its backoff ready now (as an operator's "retry now")."""
    transitions.retry_now(job.id)


@pytest.fixture
def signals():
    seen = []

    def receiver(signal, sender, task_result, **kwargs):
        name = {task_enqueued: "enqueued", task_started: "started", task_finished: "finished"}[signal]
        seen.append(
            {
                "signal": name,
                "sender": sender,
                "id": task_result.id,
                "status": task_result.status,
                "errors": len(task_result.errors),
                "exc_info": sys.exc_info()[0],
                "value": task_result._return_value,
            }
        )

    for signal in (task_enqueued, task_started, task_finished):
        signal.connect(receiver, dispatch_uid="test_task_execution")
    yield seen
    for signal in (task_enqueued, task_started, task_finished):
        signal.disconnect(dispatch_uid="test_task_execution")


def test_a_running_task_reads_as_running():
    result = tasks.add.enqueue(1, 1)
    transitions.claim(WORKER)
    result.refresh()
    assert result.status == TaskResultStatus.RUNNING
    assert result.worker_ids == [WORKER]
    assert result.finished_at is None
    with pytest.raises(ValueError, match="not finished"):
        result.return_value


def test_a_released_claim_is_not_counted_as_an_attempt():
    result = tasks.attempt_number.enqueue()
    [job] = transitions.claim("leaving-worker")
    transitions.release(job.id, worker_id="leaving-worker", attempt=job.attempts)
    assert run().result["attempt"] == 1
    result.refresh()
    assert result.worker_ids == [WORKER]


def test_a_lapsed_lease_shows_as_a_lease_expired_error():
    result = tasks.add.enqueue(1, 2)
    transitions.claim("dead-worker", lease_seconds=1)
    transitions.mark_started({int(result.id): 1}, worker_id="dead-worker")  # a renewal saw it run
    later = timezone.now() + timedelta(seconds=5)
    transitions.recover(now=later)
    result.refresh()
    assert result.status == TaskResultStatus.READY
    [error] = result.errors
    assert error.exception_class is LeaseExpired
    assert "lease held by dead-worker expired" in error.traceback
    assert run_one(worker_id=WORKER, now=later).result == 3


def test_an_attempt_recovery_gave_back_unstarted_is_no_attempt_in_the_result():
    result = tasks.add.enqueue(1, 2)
    transitions.claim("dead-worker", lease_seconds=1)  # and its worker died before starting it
    later = timezone.now() + timedelta(seconds=5)
    transitions.recover(now=later)
    result.refresh()
    assert (result.status, result.errors, result.worker_ids) == (TaskResultStatus.READY, [], [])
    assert run_one(worker_id=WORKER, now=later).result == 3
    result.refresh()
    assert (result.status, result.errors, result.worker_ids) == (TaskResultStatus.SUCCESSFUL, [], [WORKER])


def test_a_cancelled_task_is_failed():
    result = tasks.add.enqueue(1, 2)
    transitions.cancel(int(result.id))
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert run_one(worker_id=WORKER) is None


def test_signals_fire_in_order_on_enqueue_start_and_finish(signals, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        result = tasks.add.enqueue(1, 2)
    run()
    assert [(s["signal"], s["status"]) for s in signals] == [
        ("enqueued", TaskResultStatus.READY),
        ("started", TaskResultStatus.RUNNING),
        ("finished", TaskResultStatus.SUCCESSFUL),
    ]
    assert {s["id"] for s in signals} == {result.id}
    assert {s["sender"] for s in signals} == {DatabaseBackend}
    assert signals[-1]["value"] == 3


def test_task_finished_says_ready_while_retries_remain_and_failed_at_the_end(signals):
    tasks.fail.using(max_attempts=2).enqueue()
    job = run()
    retry(job)
    run()
    finished = [s for s in signals if s["signal"] == "finished"]
    assert [s["status"] for s in finished] == [TaskResultStatus.READY, TaskResultStatus.FAILED]
    assert [s["errors"] for s in finished] == [1, 2]
    # Sent inside the exception handler, as Django's logger expects.
    assert {s["exc_info"] for s in finished} == {tasks.TaskBoom}


def test_a_path_to_something_that_is_not_a_task_is_never_called():
    job = enqueueing.enqueue("tests.sample_handlers.echo", {"args": [], "kwargs": {}})
    ran = run()
    assert ran.state == State.DEAD_LETTER
    assert "tests.sample_handlers.echo is not a Task" in ran.last_error["message"]
    with pytest.raises(UnknownTask, match="tests.sample_tasks.missing is missing"):
        registry.get("tests.sample_tasks.missing")
    with pytest.raises(UnknownTask, match="standard-library"):
        registry.get("os.system")
    assert job.id == ran.id


def test_a_registered_handler_wins_over_a_task_path():
    registry.register("tests.sample_tasks.add", handlers.echo)
    assert registry.get("tests.sample_tasks.add") is handlers.echo
    registry.unregister("tests.sample_tasks.add")
    assert registry.get("tests.sample_tasks.add") is tasks.add


def test_an_edited_payload_the_task_cannot_take_fails_with_a_clear_error():
    result = tasks.add.using(max_attempts=1).enqueue(1, 2)
    transitions.change_payload(int(result.id), {"a": 1})
    ran = run()
    assert ran.state == State.DEAD_LETTER
    assert 'a task payload is {"args": [...], "kwargs": {...}}' in ran.last_error["message"]


# --- through a real worker (forked runworker supervisor and children) ----------------------


@pytest.fixture
def worker_signals(tmp_path):
    """What task_started / task_finished said in the worker: receivers connected here are
    inherited by the forked supervisor and its children, which append to a file. Returns
    a function giving [(pid, id, signal, status)]."""
    log = tmp_path / "worker-signals"

    def note(signal, sender, task_result, **kwargs):
        name = "started" if signal is task_started else "finished"
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {task_result.id} {name} {task_result.status}\n")

    task_started.connect(note, dispatch_uid="worker_signals")
    task_finished.connect(note, dispatch_uid="worker_signals")
    yield lambda: [tuple(line.split()) for line in (log.read_text().splitlines() if log.exists() else [])]
    task_started.disconnect(dispatch_uid="worker_signals")
    task_finished.disconnect(dispatch_uid="worker_signals")


def work(**options):
    """Run a forked runworker (one child, one thread, one job per claim unless told) to
    the end: burst, or max_jobs attempts."""
    from tests.worker_support import run_worker

    options = {"concurrency": 1, "threads": 1, "batch": 1, "poll": 0.02, "name": "tasks-e2e", **options}
    if "max_jobs" not in options:
        options["burst"] = True
    assert run_worker(**options) == 0


@pytest.mark.django_db(transaction=True)
def test_a_worker_runs_tasks_and_their_results_say_so(worker_signals):
    added = tasks.add.enqueue(2, b=3)
    nothing = tasks.noop.enqueue()
    echoed = tasks.echo.enqueue(1, word="two")
    context = tasks.attempt_number.enqueue()
    awaited = async_to_sync(tasks.async_add.aenqueue)(20, 22)
    work()

    added.refresh()
    assert added.status == TaskResultStatus.SUCCESSFUL and added.is_finished
    assert added.return_value == 5
    [worker_id] = added.worker_ids
    assert worker_id.startswith("tasks-e2e/")
    assert (added.attempts, added.errors) == (1, [])
    assert added.enqueued_at <= added.started_at <= added.last_attempted_at <= added.finished_at
    assert added.finished_at == Job.objects.get(id=int(added.id)).finished_at
    nothing.refresh()
    assert (nothing.status, nothing.return_value) == (TaskResultStatus.SUCCESSFUL, None)
    # Looked up afresh, through the default backend and through the task.
    fetched = default_task_backend.get_result(echoed.id)
    assert fetched.return_value == {"args": [1], "kwargs": {"word": "two"}}
    assert fetched.task == tasks.echo
    assert tasks.echo.get_result(echoed.id).status == TaskResultStatus.SUCCESSFUL
    # The TaskContext carries the running attempt's TaskResult.
    assert tasks.attempt_number.get_result(context.id).return_value == {
        "attempt": 1,
        "id": context.id,
        "workers": [worker_id],
    }
    # An async task, enqueued from async code, ran on an event loop in the worker.
    fetched = async_to_sync(tasks.async_add.aget_result)(awaited.id)
    assert (fetched.status, fetched.return_value) == (TaskResultStatus.SUCCESSFUL, 42)
    # The worker process sent task_started and task_finished, not this one.
    seen = worker_signals()
    assert {pid for pid, *_ in seen} and all(int(pid) != os.getpid() for pid, *_ in seen)
    assert [(name, status) for _, job_id, name, status in seen if job_id == added.id] == [
        ("started", "RUNNING"),
        ("finished", "SUCCESSFUL"),
    ]


@pytest.mark.django_db(transaction=True)
def test_a_worker_runs_higher_priority_tasks_first():
    low = tasks.add.using(priority=-10).enqueue(0, 1)
    middle = tasks.add.enqueue(0, 2)
    high = tasks.add.using(priority=90).enqueue(0, 3)
    work()
    for result in (low, middle, high):
        result.refresh()
    assert high.started_at < middle.started_at < low.started_at
    assert {r.status for r in (low, middle, high)} == {TaskResultStatus.SUCCESSFUL}


@pytest.mark.django_db(transaction=True)
def test_a_worker_holds_a_deferred_task_until_its_run_after():
    later = timezone.now() + timedelta(seconds=2)
    deferred = tasks.add.using(run_after=later).enqueue(1, 2)
    ready = tasks.add.enqueue(3, 4)
    work()  # burst: runs what is ready and leaves
    burst_ended = timezone.now()
    deferred.refresh()
    ready.refresh()
    assert ready.status == TaskResultStatus.SUCCESSFUL
    if burst_ended < later:  # on a slow machine the burst can outlast the deferral
        assert deferred.status == TaskResultStatus.READY
    if deferred.status == TaskResultStatus.READY:
        # Not when the burst outlasted the deferral and ran it too (CI's loaded Django 6.0
        # repeat did): a max_jobs=1 worker would then wait for a job that never comes.
        work(max_jobs=1)  # waits for it
    deferred.refresh()
    assert (deferred.status, deferred.return_value) == (TaskResultStatus.SUCCESSFUL, 3)
    # What holds however slow the machine: it did not start before its run_after.
    assert deferred.started_at >= later
    assert deferred.started_at >= later


@pytest.mark.django_db(transaction=True)
def test_a_worker_retries_a_task_whose_context_counts_attempts_and_records_each_error(
    settings, worker_signals
):
    from tests.worker_support import lease_settings

    settings.JOBQUEUE = lease_settings(BACKOFF_BASE=0.05)
    flaky = tasks.fail_until_third_attempt.using(max_attempts=5).enqueue()
    work(max_jobs=3)
    flaky.refresh()
    assert (flaky.status, flaky.return_value, flaky.attempts) == (TaskResultStatus.SUCCESSFUL, 3, 3)
    assert len(flaky.worker_ids) == 3
    assert [e.exception_class for e in flaky.errors] == [tasks.TaskBoom, tasks.TaskBoom]
    assert "TaskBoom: attempt 1" in flaky.errors[0].traceback
    assert "TaskBoom: attempt 2" in flaky.errors[1].traceback
    # Each failed attempt's task_finished said READY (a retry is coming), the last SUCCESSFUL.
    assert [(name, status) for _, job_id, name, status in worker_signals() if job_id == flaky.id] == [
        ("started", "RUNNING"),
        ("finished", "READY"),
        ("started", "RUNNING"),
        ("finished", "READY"),
        ("started", "RUNNING"),
        ("finished", "SUCCESSFUL"),
    ]


@pytest.mark.django_db(transaction=True)
def test_a_worker_dead_letters_failing_tasks_with_their_errors(worker_signals):
    failing = tasks.fail.using(max_attempts=1).enqueue("disk on fire")
    builtin = tasks.fail_builtin.using(max_attempts=1).enqueue()
    unstorable = tasks.returns_set.enqueue()
    gone = enqueueing.enqueue("tests.gone_away.vanished", {"args": [], "kwargs": {}})
    work()

    failing.refresh()
    assert failing.status == TaskResultStatus.FAILED and failing.finished_at is not None
    with pytest.raises(ValueError, match="Task failed"):
        failing.return_value
    [error] = failing.errors
    assert error.exception_class_path == "tests.sample_tasks.TaskBoom"
    assert error.exception_class is tasks.TaskBoom
    assert error.traceback.startswith("Traceback (most recent call last)")
    assert error.traceback.endswith("tests.sample_tasks.TaskBoom: disk on fire\n")
    builtin.refresh()
    assert builtin.errors[0].exception_class_path == "builtins.ValueError"
    assert builtin.errors[0].exception_class is ValueError
    for result in (failing, builtin):
        assert DeadLetter.objects.filter(job_id=int(result.id)).count() == 1
    # A return value JSON cannot hold: the attempt fails, not retried.
    job = Job.objects.get(id=int(unstorable.id))
    assert job.state == State.DEAD_LETTER and job.attempts == 1
    # Django's own error for it, from normalize_json, as its backends record it.
    assert (job.last_error["type"], job.last_error["message"]) == (
        "TypeError",
        "Unsupported type: <class 'set'>",
    )
    assert default_task_backend.get_result(unstorable.id).status == TaskResultStatus.FAILED
    # A task whose module no longer imports is dead-lettered at once, not lost.
    job = Job.objects.get(id=gone.id)
    assert (job.state, job.attempts) == (State.DEAD_LETTER, 1)
    assert "module tests.gone_away does not import" in job.last_error["message"]
    assert job.last_error["type"] == "queue_app.handlers.registry.UnknownTask"
    assert DeadLetter.objects.get(job=job).reason == "not_retryable"
    finished = {job_id: status for _, job_id, name, status in worker_signals() if name == "finished"}
    assert finished == {failing.id: "FAILED", builtin.id: "FAILED", unstorable.id: "FAILED"}


@pytest.mark.django_db(transaction=True)
def test_async_tasks_on_a_childs_threads_run_at_the_same_time(tmp_path):
    meeting = str(tmp_path / "meeting")
    naps = [tasks.async_rendezvous.enqueue(meeting, 3) for _ in range(3)]
    # One child, three threads: each awaits (on its own thread's event loop) until all
    # three have started, so they must run at once rather than queue up.
    work(threads=3, batch=3)
    for nap in naps:
        nap.refresh()
        assert (nap.status, nap.return_value) == (TaskResultStatus.SUCCESSFUL, 3)


@pytest.mark.django_db(transaction=True)
def test_a_tasks_on_success_and_on_failure_follow_ups_run_on_the_worker():
    done = tasks.double_then_after.enqueue(4)
    failed = tasks.double_then_after.using(max_attempts=1).enqueue(-1)
    work(max_jobs=4)

    done.refresh()
    assert (done.status, done.return_value) == (TaskResultStatus.SUCCESSFUL, 8)
    child = Job.objects.get(parent_id=int(done.id))
    assert default_task_backend.get_result(child.id).return_value == {
        "tag": "after",
        "parent": {
            "id": int(done.id),
            "kind": "tests.sample_tasks.double_then_after",
            "state": "completed",
            "result": 8,
        },
        "error": None,
    }
    failed.refresh()
    assert failed.status == TaskResultStatus.FAILED
    child = Job.objects.get(parent_id=int(failed.id))
    follow = tasks.after.get_result(child.id)
    assert follow.status == TaskResultStatus.SUCCESSFUL
    assert (follow.args, follow.kwargs) == (["failed"], {})
    assert follow.return_value == {
        "tag": "failed",
        "parent": {
            "id": int(failed.id),
            "kind": "tests.sample_tasks.double_then_after",
            "state": "dead_letter",
            "result": None,
        },
        "error": "tests.sample_tasks.TaskBoom",
    }


@pytest.mark.django_db(transaction=True)
def test_a_task_past_its_timeout_is_killed_and_reported_as_a_timeout_error():
    from tests.worker_support import run_worker

    stuck = tasks.spin.using(timeout=0.3, max_attempts=1).enqueue(60)
    assert run_worker(burst=True, concurrency=1, batch=1) == 0
    stuck.refresh()
    assert stuck.status == TaskResultStatus.FAILED
    [error] = stuck.errors
    assert error.exception_class is TimeoutError
    assert "0.3s timeout" in error.traceback


# --- task_finished after the outcome is recorded ------------------------------------------------


@pytest.fixture
def row_status_at_finish():
    """What a task_finished receiver sees when it reads the job back through the backend."""
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append((task_result.status, default_task_backend.get_result(task_result.id).status))

    task_finished.connect(receiver, dispatch_uid="row_status_at_finish")
    yield seen
    task_finished.disconnect(dispatch_uid="row_status_at_finish")


def test_a_task_finished_receiver_reading_the_row_sees_the_final_status(row_status_at_finish):
    tasks.add.enqueue(1, 2)
    run()
    flaky = tasks.fail.using(max_attempts=2).enqueue()
    run()
    retry(Job.objects.get(id=int(flaky.id)))
    run()
    tasks.returns_set.enqueue()
    run()
    assert row_status_at_finish == [
        (TaskResultStatus.SUCCESSFUL, TaskResultStatus.SUCCESSFUL),
        (TaskResultStatus.READY, TaskResultStatus.READY),
        (TaskResultStatus.FAILED, TaskResultStatus.FAILED),
        (TaskResultStatus.FAILED, TaskResultStatus.FAILED),
    ]


def test_task_finished_comes_after_the_outcome_event_and_carries_the_rows_result(signals):
    from queue_app.models import Event, EventType

    events_at_finish = []

    def count_events(sender, task_result, **kwargs):
        events_at_finish.append(
            list(
                Event.objects.filter(job_id=int(task_result.id)).order_by("id").values_list("type", flat=True)
            )
        )

    task_finished.connect(count_events, dispatch_uid="events_at_finish")
    try:
        result = tasks.add.enqueue(20, 22)
        run()
    finally:
        task_finished.disconnect(dispatch_uid="events_at_finish")
    assert events_at_finish == [[EventType.ENQUEUED, EventType.CLAIMED, EventType.COMPLETED]]
    [finished] = [s for s in signals if s["signal"] == "finished"]
    assert (finished["status"], finished["value"]) == (TaskResultStatus.SUCCESSFUL, 42)
    assert [s["signal"] for s in signals] == ["started", "finished"]
    assert {s["id"] for s in signals} == {result.id}


def test_a_failing_task_finished_receiver_does_not_undo_the_recorded_outcome(caplog):
    def broken(sender, task_result, **kwargs):
        raise RuntimeError("receiver bug")

    task_finished.connect(broken, dispatch_uid="broken_receiver")
    try:
        result = tasks.add.enqueue(1, 1)
        job = run()
    finally:
        task_finished.disconnect(dispatch_uid="broken_receiver")
    assert job.state == State.COMPLETED and job.result == 2
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.errors == []
    assert "task_finished receiver" in caplog.text and "receiver bug" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_task_finished_fires_only_once_the_outcome_is_committed():
    import threading

    from django.db import connection

    seen_elsewhere = []

    def from_another_connection(sender, task_result, **kwargs):
        # A new thread has its own connection: it sees only what was committed.
        def read():
            try:
                seen_elsewhere.append(Job.objects.get(id=int(task_result.id)).state)
            finally:
                connection.close()

        reader = threading.Thread(target=read)
        reader.start()
        reader.join()

    task_finished.connect(from_another_connection, dispatch_uid="committed")
    try:
        tasks.add.enqueue(2, 2)
        run()
        tasks.fail.using(max_attempts=1).enqueue()
        run()
    finally:
        task_finished.disconnect(dispatch_uid="committed")
    assert seen_elsewhere == [State.COMPLETED, State.DEAD_LETTER]


# --- SystemExit / KeyboardInterrupt fail the attempt -----------------------------------------------


@pytest.mark.parametrize(
    ("task", "exception", "message"),
    [(tasks.exits, SystemExit, "3"), (tasks.interrupts, KeyboardInterrupt, "")],
)
def test_a_task_raising_system_exit_or_keyboard_interrupt_fails_its_attempt_as_itself(
    task, exception, message, signals
):
    result = task.using(max_attempts=1).enqueue()
    job = run()  # returns: the exception did not escape the worker
    assert job.state == State.DEAD_LETTER
    assert (job.last_error["type"], job.last_error["message"]) == (exception.__name__, message)
    # The task's own traceback: it ends where the task raised.
    assert (
        job.last_error["traceback"]
        .rstrip()
        .endswith(exception.__name__ + (f": {message}" if message else ""))
    )
    assert f"in {task.func.__name__}" in job.last_error["traceback"]
    result.refresh()
    [error] = result.errors
    assert (error.exception_class_path, error.exception_class) == (
        f"builtins.{exception.__name__}",
        exception,
    )
    finished = [s for s in signals if s["signal"] == "finished"]
    assert [(s["status"], s["exc_info"]) for s in finished] == [(TaskResultStatus.FAILED, exception)]


def test_a_plain_handler_calling_sys_exit_fails_its_attempt_and_retries():
    def leaves(payload):
        sys.exit("bye")

    registry.register("test-sys-exit", leaves)
    try:
        enqueueing.enqueue("test-sys-exit", {}, max_attempts=2)
        job = run()
    finally:
        registry.unregister("test-sys-exit")
    assert job.state == State.PENDING and job.attempts == 1
    assert (job.last_error["type"], job.last_error["message"]) == ("SystemExit", "bye")
    assert "SystemExit: bye" in job.last_error["traceback"]


@pytest.mark.django_db(transaction=True)
def test_sys_exit_in_a_task_leaves_the_worker_child_running_batched_or_not():
    from tests.worker_support import run_worker

    for batch in (1, 4):
        exits = tasks.exits.using(max_attempts=1).enqueue(0)
        after = tasks.add.enqueue(batch, 1)
        # One child, one thread: had the exit escaped, the child would be replaced and
        # the job failed as a crash, not with the handler's SystemExit.
        assert run_worker(burst=True, concurrency=1, threads=1, batch=batch, poll=0.02) == 0
        exits.refresh()
        after.refresh()
        assert exits.status == TaskResultStatus.FAILED
        assert exits.errors[0].exception_class_path == "builtins.SystemExit"
        assert (after.status, after.return_value) == (TaskResultStatus.SUCCESSFUL, batch + 1)


# --- task_finished from the supervisor: timeouts and crashes ------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_supervisor_sends_task_finished_for_a_task_killed_for_its_timeout_or_crashed(tmp_path):
    from tests.worker_support import PATIENCE, run_worker

    log = tmp_path / "signals"

    def note(signal, sender, task_result, **kwargs):
        # Inherited by the forked supervisor and its children; the row as the receiver reads it.
        name = "started" if signal is task_started else "finished"
        row = default_task_backend.get_result(task_result.id).status
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {task_result.id} {name} {task_result.status} {row}\n")

    task_started.connect(note, dispatch_uid="supervisor_finished")
    task_finished.connect(note, dispatch_uid="supervisor_finished")
    try:
        # The timeout runs from the start, task_started's receivers included: time for
        # them to write their line first (a niced run took more than 0.3 s for it; 3 s leaves
        # room for CI, whose load reaches 25).
        stuck = tasks.spin.using(timeout=3 * PATIENCE, max_attempts=1).enqueue(60)
        crashed = tasks.crashes.using(max_attempts=2, backoff={"base": 100}).enqueue()
        assert run_worker(burst=True, concurrency=1, batch=4, poll=0.02) == 0
    finally:
        task_started.disconnect(dispatch_uid="supervisor_finished")
        task_finished.disconnect(dispatch_uid="supervisor_finished")
    lines = [line.split() for line in log.read_text().splitlines()]
    by_job = {}
    for _pid, job_id, name, status, row in lines:
        by_job.setdefault(job_id, []).append((name, status, row))
    assert by_job[stuck.id] == [("started", "RUNNING", "RUNNING"), ("finished", "FAILED", "FAILED")]
    # A crash with an attempt left: READY, and the retry waits out the task's own backoff.
    assert by_job[crashed.id] == [("started", "RUNNING", "RUNNING"), ("finished", "READY", "READY")]
    started_in = {pid for pid, _, name, _, _ in lines if name == "started"}
    finished_in = {pid for pid, _, name, _, _ in lines if name == "finished"}
    assert not started_in & finished_in, "task_finished comes from the supervisor, not the dead child"
    job = Job.objects.get(id=int(crashed.id))
    # From the crash's record, not from now: a loaded machine took 21 s to get here.
    crashed_at = job.events.filter(type=EventType.FAILED).latest("id").at
    assert job.run_at - crashed_at > timedelta(seconds=90)


# --- the TaskResults a worker builds are the ones get_result() reads ------------------------------


@task(takes_context=True)
def loses_its_lease(context):
    """Has its lease taken back while it runs, as recovery does to a worker that stalled
    (seen running by a lease renewal first, as a job that stalls for a lease is)."""
    owner = context.task_result.worker_ids[-1]
    transitions.mark_started({int(context.task_result.id): context.attempt}, worker_id=owner)
    transitions.recover(owned_by=owner)
    return "too late"


@task
def prints(text):
    print(text)
    return text


def test_a_tasks_stored_output_is_what_it_printed_not_djangos_log_of_its_start():
    from queue_app.models import Event, EventType

    result = prints.enqueue("hello")
    run()
    event = Event.objects.get(job_id=int(result.id), type=EventType.COMPLETED)
    assert event.metadata["output"] == {"stdout": "hello\n"}


@pytest.fixture
def worker_results(tmp_path):
    """What each task_started / task_finished a worker sent carried, beside what
    get_result() read from the database when the receiver ran (inherited by the forked
    supervisor and children, as worker_signals). Returns a function giving one dict per
    signal sent outside this process."""
    log = tmp_path / "worker-results"

    def compare(signal, sender, task_result, **kwargs):
        stored = default_task_backend.get_result(task_result.id)
        line = {
            "pid": os.getpid(),
            "id": task_result.id,
            "signal": "started" if signal is task_started else "finished",
            "status": str(task_result.status),
            "same": task_result == stored,
            "finished_at": task_result.finished_at.isoformat() if task_result.finished_at else None,
        }
        if not line["same"]:
            line["sent"], line["stored"] = repr(task_result), repr(stored)
        with open(log, "a") as f:
            f.write(json.dumps(line) + "\n")

    task_started.connect(compare, dispatch_uid="worker_results")
    task_finished.connect(compare, dispatch_uid="worker_results")
    yield lambda: [
        line
        for line in map(json.loads, log.read_text().splitlines() if log.exists() else [])
        if line["pid"] != os.getpid()
    ]
    task_started.disconnect(dispatch_uid="worker_results")
    task_finished.disconnect(dispatch_uid="worker_results")


def test_a_first_attempts_task_result_comes_off_the_claimed_row_without_a_query(
    django_assert_num_queries,
):
    enqueued = tasks.attempt_number.enqueue()
    now = timezone.now()
    [job] = claimed(transitions.claim(WORKER, now=now), now)
    with django_assert_num_queries(0):
        running = results.running(job, tasks.attempt_number, "default")
    assert running == default_task_backend.get_result(enqueued.id)
    transitions.complete_many([(job.id, job.attempts, 7)], worker_id=WORKER, now=now)
    with django_assert_num_queries(0):
        done = results.succeeded(running, now, 7)
    assert done == default_task_backend.get_result(enqueued.id)
    assert running.status == TaskResultStatus.RUNNING  # the running one is left as it was


@pytest.mark.django_db(transaction=True)
def test_the_task_results_a_worker_sends_equal_what_get_result_reads_for_every_history(
    settings, worker_results
):
    from tests.worker_support import lease_settings

    settings.JOBQUEUE = lease_settings(BACKOFF_BASE=0.05)
    # Requeued: two failed attempts, dead-lettered, requeued; the third attempt succeeds.
    requeued = tasks.fail_until_third_attempt.using(max_attempts=2).enqueue()
    for _ in range(2):
        job = run("earlier-worker")
        retry(job) if job.state == State.PENDING else transitions.requeue(job.id)
    # Recovered: its first worker's lease lapsed.
    recovered = tasks.add.using(priority=60).enqueue(1, 2)
    assert [j.id for j in transitions.claim("dead-worker", lease_seconds=0.05)] == [int(recovered.id)]
    transitions.mark_started({int(recovered.id): 1}, worker_id="dead-worker")  # a renewal saw it run
    # Released: claimed and given back before it started.
    released = tasks.echo.using(priority=50).enqueue("back")
    [job] = transitions.claim("leaving-worker")
    assert job.id == int(released.id)
    transitions.release(job.id, worker_id="leaving-worker", attempt=job.attempts)
    first = tasks.attempt_number.enqueue()
    retried = tasks.fail_until_third_attempt.using(max_attempts=5).enqueue()
    time.sleep(0.1)
    assert transitions.recover() == [(int(recovered.id), State.PENDING)]

    work(max_jobs=7, batch=10)

    seen = worker_results()
    assert [line for line in seen if not line["same"]] == []
    by_job = {}
    for line in seen:
        by_job.setdefault(line["id"], []).append((line["signal"], line["status"]))
    once = [("started", "RUNNING"), ("finished", "SUCCESSFUL")]
    assert {r.id: by_job[r.id] for r in (first, released, recovered, requeued)} == {
        r.id: once for r in (first, released, recovered, requeued)
    }
    assert by_job[retried.id] == [("started", "RUNNING"), ("finished", "READY")] * 2 + once
    for result in (first, retried, released, recovered, requeued):
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
    assert first.return_value["workers"] == first.worker_ids and len(first.worker_ids) == 1
    assert [e.exception_class for e in recovered.errors] == [LeaseExpired]
    assert released.worker_ids == first.worker_ids
    assert (requeued.attempts, len(requeued.errors), requeued.return_value) == (3, 2, 3)


@pytest.mark.django_db(transaction=True)
def test_task_jobs_share_a_batched_acknowledgement_and_each_gets_task_finished_in_order(worker_results):
    added = [tasks.add.enqueue(i, i) for i in range(6)]
    work(batch=10)
    seen = worker_results()
    started = [line["id"] for line in seen if line["signal"] == "started"]
    finished = [line for line in seen if line["signal"] == "finished"]
    assert sorted(started) == sorted(r.id for r in added)
    assert [line["id"] for line in finished] == started
    assert {(line["status"], line["same"]) for line in finished} == {("SUCCESSFUL", True)}
    # One acknowledgement's jobs share its commit's time: fewer times than jobs.
    assert len({line["finished_at"] for line in finished}) < len(added)
    assert {Job.objects.get(id=int(r.id)).result for r in added} == {0, 2, 4, 6, 8, 10}


@pytest.mark.django_db(transaction=True)
def test_a_batched_acknowledgement_that_finds_the_lease_lost_sends_no_successful(worker_results):
    lost = loses_its_lease.using(max_attempts=1).enqueue()
    work(batch=10)
    job = Job.objects.get(id=int(lost.id))
    assert (job.state, job.result) == (State.DEAD_LETTER, None)
    assert [(line["signal"], line["status"], line["same"]) for line in worker_results()] == [
        ("started", "RUNNING", True),
        ("finished", "FAILED", True),
    ]


@pytest.mark.parametrize("own", [True, False])
def test_an_acknowledgement_that_committed_but_lost_its_answer_still_sends_task_finished_once(signals, own):
    """The worker retries an acknowledgement after a reconnect; if the first try had
    committed, the retry is refused. task_finished then goes out from the row, as
    SUCCESSFUL, because the completion is this worker's own attempt; another worker's
    completion reports itself and sends nothing here."""
    from queue_app.tasks import running as task_running
    from queue_app.worker.execution import acknowledged

    tasks.add.enqueue(1, 2)
    now = timezone.now()
    (job,) = claimed(transitions.claim(WORKER, limit=1, now=now), now)
    value = task_running.run(job, tasks.add)
    assert transitions.complete_many([(job.id, job.attempts, value, None)], worker_id=WORKER, now=now) == {
        job.id
    }
    signals.clear()

    acknowledged([(job, value)], set(), now, worker_id=WORKER if own else "someone-else/0.1")

    if own:
        assert [(s["signal"], s["status"], s["value"]) for s in signals] == [
            ("finished", TaskResultStatus.SUCCESSFUL, 3)
        ]
    else:
        assert signals == []
