"""The worker with real processes: a forked runworker supervisor forking its children,
against the test database. Short leases and polls keep each test to a few seconds."""

import os
import signal
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from queue_app import bulk_enqueue, enqueue
from queue_app.core import aborting, transitions
from queue_app.models import DeadLetter, EventType, Job, State, Worker, WorkerState
from queue_app.worker import loop as worker
from tests import worker_support
from tests.support import event_types as events
from tests.support import lapse
from tests.worker_support import lease_settings, run_worker, start_worker, stop, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
# The tests that run all they test in this process (no worker process, no subprocess, no
# second connection) need no commit: a transaction rolled back after each, not a flush of
# every table.
in_process = pytest.mark.django_db


def test_burst_worker_drains_the_queue_with_sync_and_async_handlers():
    jobs = bulk_enqueue(
        [{"kind": "echo", "payload": {"n": n}} for n in range(40)]
        + [{"kind": "async_echo", "payload": {"n": n}} for n in range(10)]
    )

    assert run_worker(burst=True, concurrency=2, batch=5) == 0

    assert Job.objects.completed().count() == 50
    for job in Job.objects.filter(id__in=[j.id for j in jobs]):
        assert job.result == job.payload
        assert job.attempts == 1
        assert events(job) == [EventType.ENQUEUED, EventType.CLAIMED, EventType.COMPLETED]
    assert list(Worker.objects.values_list("state", flat=True)) == [WorkerState.STOPPED]


def test_worker_with_several_threads_runs_every_job_once():
    bulk_enqueue([{"kind": "sleepy", "payload": {"seconds": 0.02}} for _ in range(30)])

    assert run_worker(burst=True, concurrency=1, threads=3, batch=4) == 0

    assert Job.objects.completed().count() == 30
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}


@in_process
def test_run_once_runs_one_batch_in_this_process():
    bulk_enqueue([{"kind": "add", "payload": {"a": n, "b": 1}} for n in range(3)] + [{"kind": "echo"}] * 2)

    outcomes = worker.run_once(worker.Options(batch=3, kinds=("add",)))

    assert [state for _, state in outcomes] == ["completed"] * 3
    assert sorted(Job.objects.completed().values_list("result", flat=True)) == [1, 2, 3]
    assert Job.objects.pending().count() == 2


@pytest.mark.parametrize("batch", [1, 10])  # acknowledged one by one; in batches
def test_handler_returning_what_json_cannot_hold_is_dead_lettered_at_once(batch):
    bad = enqueue("unserializable", max_attempts=3)
    good = bulk_enqueue([{"kind": "echo", "payload": {"n": n}} for n in range(3)])

    assert run_worker(burst=True, batch=batch) == 0

    bad.refresh_from_db()
    assert bad.state == State.DEAD_LETTER
    assert bad.attempts == 1
    assert DeadLetter.objects.get(job=bad).reason == "not_retryable"
    assert Job.objects.filter(id__in=[j.id for j in good], state=State.COMPLETED).count() == 3


@in_process
def test_batched_acks_complete_only_the_jobs_this_worker_still_holds():
    kept, taken = bulk_enqueue([{"kind": "echo"}, {"kind": "echo"}])
    claimed = {j.id: j for j in transitions.claim("w/0.1", limit=2)}
    # Its abort is requested, and its lease lapses: recovery cancels it under the worker.
    aborting.cancel(taken.id, reason="operator")
    lapse(taken)
    transitions.recover()

    done = transitions.complete_many(
        [(kept.id, claimed[kept.id].attempts, {"ok": 1}), (taken.id, claimed[taken.id].attempts, None)],
        worker_id="w/0.1",
    )

    assert done == {kept.id}
    kept.refresh_from_db()
    taken.refresh_from_db()
    assert (kept.state, kept.result) == (State.COMPLETED, {"ok": 1})
    assert taken.state == State.CANCELLED
    assert events(kept)[-1] == EventType.COMPLETED
    assert EventType.COMPLETED not in events(taken)


def test_raising_handler_retries_with_backoff_then_dead_letters(settings):
    settings.JOBQUEUE = lease_settings(BACKOFF_BASE=0.2)
    job = enqueue("boom", {"message": "kaput"}, max_attempts=3)

    assert run_worker(max_jobs=3, poll=0.02) == 0

    job.refresh_from_db()
    assert job.state == State.DEAD_LETTER
    assert job.attempts == 3
    assert job.last_error["type"] == "tests.sample_handlers.Boom"
    assert job.last_error["message"] == "kaput"
    assert "raise Boom" in job.last_error["traceback"]
    assert events(job) == [
        EventType.ENQUEUED,
        EventType.CLAIMED,
        EventType.FAILED,
        EventType.CLAIMED,
        EventType.FAILED,
        EventType.CLAIMED,
        EventType.DEAD_LETTERED,
    ]
    failed = list(job.events.filter(type=EventType.FAILED))
    # delay = base ** attempt, and the retry time is persisted for the next claim to honour.
    assert [e.metadata["delay"] for e in failed] == pytest.approx([0.2, 0.04])
    claims = list(job.events.filter(type=EventType.CLAIMED).values_list("at", flat=True))
    for fail_event, next_claim in zip(failed, claims[1:]):
        assert next_claim >= fail_event.at + timedelta(seconds=fail_event.metadata["delay"])
    assert DeadLetter.objects.get(job=job).reason == "failed"


def test_job_that_fails_twice_then_succeeds_completes_on_its_third_attempt(settings, tmp_path):
    settings.JOBQUEUE = lease_settings(BACKOFF_BASE=0.1)
    job = enqueue("flaky", {"path": str(tmp_path / "tries"), "fails": 2}, max_attempts=5)

    assert run_worker(max_jobs=3, poll=0.02) == 0

    job.refresh_from_db()
    assert job.state == State.COMPLETED
    assert job.attempts == 3
    assert job.result == "ok"
    assert events(job).count(EventType.FAILED) == 2


def test_handler_that_exits_its_process_is_failed_and_the_child_replaced(settings):
    settings.JOBQUEUE = lease_settings(BACKOFF_BASE=0.05)
    crash = enqueue("crash", {"code": 13}, max_attempts=2, priority=10)
    after = bulk_enqueue([{"kind": "echo"}] * 3)

    assert run_worker(max_jobs=5, concurrency=1, batch=1, poll=0.02) == 0

    crash.refresh_from_db()
    assert crash.state == State.DEAD_LETTER
    assert crash.attempts == 2
    assert crash.last_error["type"] == "WorkerCrashed"
    assert "exited with code 13" in crash.last_error["message"]
    assert events(crash).count(EventType.FAILED) == 1
    # The replacement child ran the rest.
    assert Job.objects.filter(id__in=[j.id for j in after], state=State.COMPLETED).count() == 3


def test_crashed_childs_unstarted_claims_are_released_without_spending_an_attempt():
    crash = enqueue("crash", {"code": 3}, max_attempts=1, priority=10)
    others = bulk_enqueue([{"kind": "echo"}] * 4)

    assert run_worker(burst=True, concurrency=1, batch=5) == 0

    crash.refresh_from_db()
    assert crash.state == State.DEAD_LETTER
    for job in Job.objects.filter(id__in=[j.id for j in others]):
        assert job.state == State.COMPLETED
        assert job.attempts == 1
        assert events(job) == [
            EventType.ENQUEUED,
            EventType.CLAIMED,
            EventType.RELEASED,
            EventType.CLAIMED,
            EventType.COMPLETED,
        ]


def test_jobs_finished_but_not_yet_acknowledged_when_the_child_dies_are_failed_not_released(
    settings, monkeypatch
):
    settings.JOBQUEUE = lease_settings(BACKOFF_BASE=0.001)
    # Acks wait for a full batch or ACK_DELAY; a long delay (inherited by the forked child)
    # makes sure the echoes' acks are still pending when the crash job kills the child.
    monkeypatch.setattr(worker, "ACK_DELAY", 30.0)
    done = bulk_enqueue([{"kind": "echo", "priority": 10}] * 3)
    enqueue("crash", {"code": 9}, max_attempts=1)

    # One claim takes all four; the echoes run first, then the crash.
    assert run_worker(burst=True, batch=10) == 0

    for job in Job.objects.filter(id__in=[j.id for j in done]):
        history = events(job)
        assert job.state == State.COMPLETED
        assert EventType.RELEASED not in history
        assert EventType.FAILED in history
        error = job.events.get(type=EventType.FAILED).metadata["error"]
        assert error["type"] == "WorkerCrashed"
        assert "before the job's completion was recorded" in error["message"]


@pytest.mark.parametrize("kind", ["spin", "sleepy"])  # a Python busy loop; a C-level sleep
def test_job_past_its_timeout_is_killed_and_failed_with_a_timeout_error(kind):
    stuck = enqueue(kind, {"seconds": 60}, timeout=0.3, max_attempts=1, priority=10)
    after = enqueue("echo", {"after": True})

    # run_worker fails if it takes 30s: the 60s job was cut short.
    assert run_worker(burst=True, concurrency=1, batch=1, timeout=None) == 0

    stuck.refresh_from_db()
    assert stuck.state == State.DEAD_LETTER
    assert stuck.last_error["type"] == "TimeoutError"
    assert "0.3s timeout" in stuck.last_error["message"]
    after.refresh_from_db()
    assert after.state == State.COMPLETED


def test_default_timeout_applies_to_jobs_that_set_none(settings):
    settings.JOBQUEUE = lease_settings(BACKOFF_BASE=0.05)
    stuck = enqueue("spin", {"seconds": 60}, max_attempts=2)

    assert run_worker(max_jobs=2, timeout=0.2, poll=0.02) == 0

    stuck.refresh_from_db()
    assert stuck.state == State.DEAD_LETTER
    assert stuck.attempts == 2
    assert stuck.last_error["type"] == "TimeoutError"
    assert events(stuck).count(EventType.FAILED) == 1


def test_long_job_keeps_its_lease_through_heartbeats_while_recovery_runs():
    job = enqueue("sleepy", {"seconds": 7.5})

    # Recovery sweeps every 0.2s: had the 5s lease lapsed, it would take the job back;
    # heartbeats every half second keep renewing it (a lease of 3 s renewed every second
    # lapsed on a loaded CI machine, whose supervisor went 3 s without a turn).
    assert run_worker(burst=True, lease=5.0, heartbeat=0.5, recovery_interval=0.2) == 0

    job.refresh_from_db()
    assert job.state == State.COMPLETED
    assert job.attempts == 1
    assert EventType.RECOVERED not in events(job)


def test_sigterm_finishes_the_running_job_and_releases_the_claimed_ones(tmp_path):
    marker = tmp_path / "started"
    # Until the stop has reached the worker (end_mark_once_stopping), not a fixed second.
    first = enqueue("mark", {"path": str(marker), "seconds": 60, "until_lines": 2}, priority=10)
    rest = bulk_enqueue([{"kind": "echo"}] * 4)
    proc = start_worker(concurrency=1, batch=5, grace=90)
    wait_for(marker.exists, what="the first job to start")

    os.kill(proc.pid, signal.SIGTERM)
    worker_support.end_mark_once_stopping(marker)
    assert worker_support.join(proc, within=60) == 0

    first.refresh_from_db()
    assert first.state == State.COMPLETED
    for job in Job.objects.filter(id__in=[j.id for j in rest]):
        assert job.state == State.PENDING
        assert job.attempts == 0
        assert events(job)[-1] == EventType.RELEASED
    assert not Job.objects.leased().exists()
    assert Worker.objects.get().state == WorkerState.STOPPED


def test_job_still_running_when_the_grace_period_ends_fails_and_its_unstarted_claims_are_released(tmp_path):
    marker = tmp_path / "started"
    # One attempt: a job longer than the grace would otherwise run again at every deploy.
    job = enqueue("mark", {"path": str(marker), "seconds": 60}, max_attempts=1, priority=10)
    waiting = enqueue("echo")  # claimed in the same batch, never started
    proc = start_worker(grace=0.3, batch=5)
    wait_for(marker.exists, what="the job to start")

    # Well inside the 15s stop() allows, so the 60s job did not run to its end.
    assert stop(proc) == 0

    job.refresh_from_db()
    assert (job.state, job.attempts) == (State.DEAD_LETTER, 1)
    assert job.last_error["type"] == "WorkerStopped"
    assert "killed at shutdown" in job.last_error["message"]
    assert "0.3s grace period" in job.last_error["message"]
    assert EventType.RELEASED not in events(job)
    waiting.refresh_from_db()
    assert (waiting.state, waiting.attempts) == (State.PENDING, 0)
    assert events(waiting)[-1] == EventType.RELEASED


def test_second_signal_stops_at_once_and_fails_the_running_job_without_waiting_for_its_lease(tmp_path):
    marker = tmp_path / "started"
    job = enqueue("mark", {"path": str(marker), "seconds": 60})
    proc = start_worker(grace=30)
    wait_for(marker.exists, what="the job to start")

    os.kill(proc.pid, signal.SIGTERM)
    time.sleep(0.2)

    # The 30s grace would keep it past stop()'s 10s: only the second signal ends it in time.
    assert stop(proc, signal.SIGINT, within=10) == 1

    job.refresh_from_db()
    assert (job.state, job.lease_owner, job.last_error["type"]) == (State.PENDING, None, "WorkerStopped")
    assert events(job)[-1] == EventType.FAILED


def test_killed_workers_job_is_recovered_and_completed_by_another_worker(tmp_path):
    marker = tmp_path / "stalled"
    job = enqueue("stall_once", {"path": str(marker)})
    first = start_worker(lease=1.0)
    wait_for(marker.exists, what="the job to start")
    # Seen running by a renewal: its recovery spends the attempt (an unstarted one's would not).
    wait_for(lambda: Job.objects.filter(id=job.id, started_attempt=1).exists(), what="a lease renewal")

    stop(first, signal.SIGKILL, within=5)
    job.refresh_from_db()
    assert job.state == State.LEASED
    # Its child dies with it (PDEATHSIG), so nobody renews the lease any more.
    wait_for(lambda: Job.objects.expired().exists(), timeout=5, what="the lease to lapse")

    assert run_worker(burst=True, lease=1.0) == 0

    job.refresh_from_db()
    assert job.state == State.COMPLETED
    assert job.attempts == 2
    assert EventType.RECOVERED in events(job)


def test_kind_filter_runs_only_the_named_kinds():
    bulk_enqueue([{"kind": "echo"}] * 3 + [{"kind": "add", "payload": {"a": 1, "b": 2}}] * 2)

    assert run_worker(burst=True, kinds=("add",)) == 0

    assert sorted(Job.objects.completed().values_list("kind", flat=True)) == ["add", "add"]
    assert Job.objects.pending().filter(kind="echo").count() == 3


def test_queue_filter_runs_only_the_named_queues():
    bulk_enqueue([{"kind": "echo", "queue_name": "mail"}] * 2 + [{"kind": "echo", "queue_name": "video"}])

    assert run_worker(burst=True, queues=("mail",)) == 0

    assert list(Job.objects.pending().values_list("queue_name", flat=True)) == ["video"]


def test_max_jobs_stops_the_worker_after_that_many_jobs():
    bulk_enqueue([{"kind": "echo"}] * 10)

    assert run_worker(max_jobs=4, concurrency=2, batch=3) == 0

    assert Job.objects.completed().count() == 4
    assert Job.objects.pending().filter(attempts=0).count() == 6


def test_max_runtime_stops_an_idle_worker_gracefully():
    began = time.monotonic()

    # An idle worker without max_runtime would never exit: run_worker would fail at 10s.
    assert run_worker(max_runtime=0.5, within=10) == 0

    assert time.monotonic() - began >= 0.5
    assert Worker.objects.get().state == WorkerState.STOPPED


def test_expired_leases_are_recovered_when_a_worker_starts():
    job = enqueue("echo", {"x": 1})
    Job.objects.filter(id=job.id).update(
        state=State.LEASED,
        attempts=1,
        lease_owner="gone/0.1",
        lease_expires_at=timezone.now() - timedelta(seconds=5),
    )

    assert run_worker(burst=True) == 0

    job.refresh_from_db()
    assert job.state == State.COMPLETED
    assert events(job)[-3:] == [EventType.RECOVERED, EventType.CLAIMED, EventType.COMPLETED]


def test_idle_worker_wakes_on_an_enqueue_long_before_its_poll():
    """PostgreSQL: LISTEN/NOTIFY; SQLite: PRAGMA data_version; MariaDB: the newest event
    id (wakeup.py). Without them the job would wait for the 30 s poll."""
    proc = start_worker(poll=30)
    try:
        wait_for(lambda: Worker.objects.filter(state=WorkerState.RUNNING).exists(), what="the worker")
        if connection.vendor == "postgresql":
            wait_for(_listening, what="the worker's child to LISTEN")
        # A first job proves the child is claiming; after it the child's next claim finds
        # nothing and it settles into the 30 s wait.
        probe = enqueue("echo", {"n": 0})
        wait_for(
            lambda: Job.objects.filter(id=probe.id, state=State.COMPLETED).exists(),
            timeout=30,
            what="the probe job",
        )
        time.sleep(0.5)
        job = enqueue("echo", {"n": 1})
        wait_for(
            lambda: Job.objects.filter(id=job.id, state=State.COMPLETED).exists(),
            timeout=5,
            what="the job to complete without waiting for the 30s poll",
        )
    finally:
        code = stop(proc, within=10)
    assert code == 0


def _listening():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND query ILIKE 'LISTEN%%'"
        )
        return cursor.fetchone()[0] > 0


def test_an_acknowledgement_whose_combined_claim_fails_is_still_recorded_once(monkeypatch):
    """At --batch 1 a finished job's acknowledgement rides in the next claim's transaction
    (transitions.complete_and_claim). When that transaction fails, both roll back: the
    worker must then acknowledge on its own, and retry the claim, losing and repeating
    nothing."""
    import multiprocessing

    from queue_app.worker.slots import Budget, Slots

    jobs = bulk_enqueue([{"kind": "echo", "payload": {"n": n}} for n in range(3)])
    real_claim, calls = transitions._claim, []

    def flaky_claim(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the first claim that carries an acknowledgement
            raise RuntimeError("injected: the claim's transaction fails")
        return real_claim(*args, **kwargs)

    monkeypatch.setattr(transitions, "_claim", flaky_claim)
    # Loop.run() sets a child's signal handlers: keep pytest's own.
    monkeypatch.setattr(worker.signal, "signal", lambda *args: None)
    options = worker.Options(batch=1, burst=True, concurrency=1, poll=0.01).resolved()
    loop = worker.Loop(
        options, "in-process/0.1", Slots(1, 4, buffered=1), Budget(multiprocessing.get_context("fork"), None)
    )
    loop.run()

    assert len(calls) >= 4  # the failed one was retried
    for job in jobs:
        job.refresh_from_db()
        assert job.state == State.COMPLETED
        assert events(job) == [EventType.ENQUEUED, EventType.CLAIMED, EventType.COMPLETED]


def test_a_claim_whose_rows_cannot_be_read_keeps_its_acknowledgements(monkeypatch, caplog):
    """complete_and_claim reads the claimed rows after its commit (SQLite's write lock is
    not held for it). When that read fails, the acknowledgements it committed stand: the
    worker reports them (no second acknowledgement, no "lease lost"), gives back the
    jobs the claim leased (release_orphans) and runs them later, each once."""
    import multiprocessing

    from queue_app.engines import rows
    from queue_app.worker.slots import Budget, Slots

    jobs = bulk_enqueue([{"kind": "echo", "payload": {"n": n}} for n in range(3)])
    real_jobs, reads = rows.JobReader.jobs, []

    def flaky_read(self, found):
        reads.append(len(found))
        if len(reads) == 2:  # the read after the first claim that carried an acknowledgement
            raise RuntimeError("injected: reading the claimed rows fails")
        return real_jobs(self, found)

    monkeypatch.setattr(rows.JobReader, "jobs", flaky_read)
    monkeypatch.setattr(worker.signal, "signal", lambda *args: None)
    options = worker.Options(batch=1, burst=True, concurrency=1, poll=0.01).resolved()
    loop = worker.Loop(
        options, "in-process/0.1", Slots(1, 4, buffered=1), Budget(multiprocessing.get_context("fork"), None)
    )
    loop.run()

    assert len(reads) >= 4  # the failed read's claim was given back and claimed again
    assert "lease lost" not in caplog.text
    for job in jobs:
        job.refresh_from_db()
        assert job.state == State.COMPLETED
        assert events(job)[-2:] == [EventType.CLAIMED, EventType.COMPLETED]
        assert events(job).count(EventType.COMPLETED) == 1
