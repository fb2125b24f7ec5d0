"""wakeup.py: one watch per runworker hands each piece of news to one idle child, and the
watch survives the database going away (the children poll meanwhile) instead of ending."""

import multiprocessing
import os
import threading
import time
from types import SimpleNamespace

import pytest
from django.db import connection, connections, transaction

from queue_app import bulk_enqueue, engines, enqueue
from queue_app.core import transitions
from queue_app.engines.base import WakeUp
from queue_app.models import EventType, Job, State, Worker, WorkerState
from queue_app.worker import wakeup
from queue_app.worker.slots import WakeUps
from tests.support import event_types
from tests.worker_support import join, start_worker, stop, wait_for


def _wakeups():
    return WakeUps(multiprocessing.get_context("fork"))


def _posted(wakeups):
    """How many wake-ups were waiting (taking them)."""
    n = 0
    while wakeups.take(0):
        n += 1
    return n


@pytest.mark.django_db
def test_a_failing_wake_up_check_sleeps_out_a_poll_instead_of_raising(monkeypatch):
    engine = type(engines.of(connection))
    calls = []

    def failing(self):
        calls.append(1)
        raise OSError("server closed the connection unexpectedly")

    monkeypatch.setattr(engine, "wake_version", failing)
    monkeypatch.setattr(engine, "wake_up", lambda self: WakeUp(interval=0.01))
    watcher = wakeup.Watcher.for_connection(SimpleNamespace(burst=False, poll=0.3, queues=()), _wakeups())
    began = time.monotonic()
    watcher.step()  # must not raise
    took = time.monotonic() - began
    assert calls == [1]
    assert took >= 0.25  # slept out the poll rather than spinning


def test_a_lost_listen_connection_is_replaced_on_the_next_step(monkeypatch):
    class Broken:
        def notifies(self, **kwargs):
            raise OSError("connection lost")

        def close(self):
            pass

    connects = []
    monkeypatch.setattr(
        wakeup.ListenWatcher, "_connect", lambda self: connects.append(1) or setattr(self, "conn", Broken())
    )
    watcher = wakeup.ListenWatcher(_wakeups(), 0.1, "jobqueue")
    watcher.step()  # must not raise
    assert watcher.conn is None
    watcher.step()
    assert len(connects) == 2  # LISTEN again after the loss


def test_news_for_a_queue_the_worker_does_not_serve_wakes_no_child():
    class Notes:
        def __init__(self, payloads):
            self.payloads = payloads

        def notifies(self, **kwargs):
            yield from (SimpleNamespace(payload=p) for p in self.payloads)
            self.payloads = []

    wakeups = _wakeups()
    watcher = wakeup.ListenWatcher(wakeups, 0.1, "jobqueue", queues=("mail",))
    watcher.conn = Notes(["default", "reports"])
    watcher.step()
    assert _posted(wakeups) == 0
    watcher.conn = Notes(["default", "mail"])
    watcher.step()
    assert _posted(wakeups) == 1


def test_wake_ups_posted_while_no_child_waits_are_held_as_one():
    wakeups = _wakeups()
    for _ in range(5):
        wakeups.post()

    assert _posted(wakeups) == 1


def test_one_wake_up_wakes_one_waiting_child_not_all():
    wakeups, stopping = _wakeups(), threading.Event()
    woke = []

    def child(n):
        waiter = wakeup.SharedWaiter(wakeups)
        began = time.monotonic()
        waiter.wait(1.0, stopping)
        if time.monotonic() - began < 0.9:
            woke.append(n)

    threads = [threading.Thread(target=child, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    wakeups.post()
    for t in threads:
        t.join()

    assert len(woke) == 1


def test_a_full_batch_passes_the_wake_up_on_and_a_short_one_waits_for_news_first():
    wakeups = _wakeups()
    waiter = wakeup.SharedWaiter(wakeups)

    waiter.claimed(10, 10)
    assert (_posted(wakeups), waiter.wait_first) == (1, False)
    waiter.claimed(3, 10)
    assert (_posted(wakeups), waiter.wait_first) == (0, True)
    waiter.wait(0.0, threading.Event())
    assert not waiter.wait_first  # after a wait it claims
    waiter.claimed(0, 10)
    assert (_posted(wakeups), waiter.wait_first) == (0, False)


# --- with real processes ---------------------------------------------------------------


def _count_claims(monkeypatch, path, after_first=None):
    """Make every engine claim in this process and the workers it forks append one
    byte to ``path``: 1 if it leased something, 0 if not; the first one then calls
    ``after_first()`` (in the claiming process) before it returns."""
    engine = type(engines.of(connection))
    real = engine.claim

    def counted(self, **kwargs):
        found = real(self, **kwargs)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, b"1" if found else b"0")
        finally:
            os.close(fd)
        if after_first is not None and path.stat().st_size == 1:
            after_first()
        return found

    monkeypatch.setattr(engine, "claim", counted)
    path.write_bytes(b"")
    return lambda: path.read_bytes()


def _settled(claims, quiet=1.0, within=20):
    """Wait until no claim has been made for ``quiet`` seconds; return the claims so far."""
    end = time.monotonic() + within
    seen, since = claims(), time.monotonic()
    while time.monotonic() < end:
        time.sleep(0.05)
        now = claims()
        if now != seen:
            seen, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return seen
    raise AssertionError(f"the workers kept claiming: {seen!r}")


@pytest.mark.django_db(transaction=True)
def test_one_enqueue_into_four_idle_children_leads_to_one_claim_not_four(monkeypatch, tmp_path):
    claims = _count_claims(monkeypatch, tmp_path / "claims")
    proc = start_worker(concurrency=4, batch=10, poll=60)
    try:
        wait_for(lambda: Worker.objects.filter(state=WorkerState.RUNNING).exists(), what="the worker")
        wait_for(lambda: len(claims()) >= 4, what="each child's first claim")
        before = len(_settled(claims))
        job = enqueue("echo", {"n": 1})
        wait_for(
            lambda: Job.objects.filter(id=job.id, state=State.COMPLETED).exists(),
            timeout=10,
            what="the job, long before the 60 s poll",
        )
        after = _settled(claims)
    finally:
        assert stop(proc, within=10) == 0

    assert after[before:] == b"1"  # the child that leased it; no other child woke to look
    assert event_types(Job.objects.get(id=job.id)) == [
        EventType.ENQUEUED,
        EventType.CLAIMED,
        EventType.COMPLETED,
    ]


@pytest.mark.django_db(transaction=True)
def test_a_child_that_claims_a_full_batch_wakes_another_idle_child(tmp_path):
    proc = start_worker(concurrency=3, batch=1, poll=60)
    try:
        wait_for(lambda: Worker.objects.filter(state=WorkerState.RUNNING).exists(), what="the worker")
        time.sleep(0.5)  # the children's first claims found nothing: they wait
        # One enqueue, one notification, three jobs: batch 1 takes one each.
        # Each job holds its child until all three have started (or 25 s): run one after
        # another by the one child woken, they would take 75 s; side by side, a moment,
        # however slowly a loaded machine wakes the other two.
        mark = {"path": str(tmp_path / "m"), "seconds": 25, "until_lines": 3}
        jobs = bulk_enqueue([{"kind": "mark", "payload": mark}] * 3)
        wait_for(
            lambda: Job.objects.filter(id__in=[j.id for j in jobs], state=State.COMPLETED).count() == 3,
            timeout=40,
            what="the three jobs, long before the 60 s poll",
        )
    finally:
        assert stop(proc, within=10) == 0

    # Run side by side, by three children: not one after another by the one woken.
    assert len(set((tmp_path / "m").read_text().split())) == 3


def _hold_row_lock(job_id, locked, release, released):
    """In a forked process: lock job ``job_id``'s row until the file ``release`` exists,
    then write ``released`` once the lock's transaction has ended."""
    try:
        with transaction.atomic():
            Job.objects.select_for_update().get(id=job_id)
            locked.write_text("locked")
            end = time.monotonic() + 30
            while not release.exists() and time.monotonic() < end:
                time.sleep(0.02)
        released.write_text("released")
    finally:
        connections.close_all()
        os._exit(0)


@pytest.mark.django_db(transaction=True)
def test_a_burst_worker_does_not_leave_after_a_claim_that_passed_over_a_locked_ready_job(
    monkeypatch, tmp_path
):
    """SKIP LOCKED passes over a ready row another transaction holds: that one empty claim
    does not prove the queue empty, and the worker claims once more, a poll later."""
    if not transitions.claims_skip_locked():
        pytest.skip("SQLite's writers take turns: a claim sees every ready row")
    job = enqueue("echo")
    locked, release, released = tmp_path / "locked", tmp_path / "release", tmp_path / "released"

    def unlock():
        # In the worker, after its first (empty) claim: the lock ends before the second
        # look, however slowly a loaded machine runs the holder.
        release.write_text("go")
        wait_for(released.exists, timeout=30, interval=0.02, what="the holder's lock to end")

    claims = _count_claims(monkeypatch, tmp_path / "claims", after_first=unlock)
    connections.close_all()  # the holder makes its own connection, as the worker does
    holder = multiprocessing.get_context("fork").Process(
        target=_hold_row_lock, args=(job.id, locked, release, released)
    )
    holder.start()
    try:
        wait_for(locked.exists, what="the row lock")
        proc = start_worker(burst=True, concurrency=1, poll=0.5)
        wait_for(lambda: claims() != b"", what="the worker's first claim")
    finally:
        release.write_text("go")
        holder.join(30)
    assert join(proc) == 0
    job.refresh_from_db()
    assert job.state == State.COMPLETED
    # Passed over, then leased; then the empty claim and its second look before leaving.
    assert claims() == b"0100"
