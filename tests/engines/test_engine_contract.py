"""The engine contract (engines/base.py), proved against whichever engine the suite runs
on: the suite runs once per database, so every case here runs on SQLite, PostgreSQL and
MariaDB alike (Oban's engine_test.exs, one case list for every engine)."""

import multiprocessing
import threading
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.utils import timezone

from queue_app import engines, enqueue
from queue_app.conf import settings as queue_settings
from queue_app.core import aborting, flow, transitions
from queue_app.engines import rows
from queue_app.engines.base import Fence
from queue_app.models import Event, EventType, Job, State
from queue_app.worker import wakeup
from queue_app.worker.slots import WakeUps
from tests.factories import JobFactory
from tests.support import event_types, events, lapse


def engine():
    return engines.of(connection)


def adapted(when):
    return connection.ops.adapt_datetimefield_value(when)


def given(now, **fields):
    """A new job's row as transitions writes it (the writer fills the other columns).
    Rows of one insert have the same keys."""
    return {
        "kind": "echo",
        "payload": {},
        "queue_name": "default",
        "priority": 0,
        "run_at": now,
        "state": State.PENDING.value,
        "attempts": 0,
        "max_attempts": 3,
        "created_at": now,
        "concurrency_key": None,
        **fields,
    }


def enqueued_event(now, at=True):
    """An enqueued event row without its job id, as engines take it (``at``: its time, adapted)."""
    at = adapted(now) if at is True else at
    return rows.event_params(connection, None, EventType.ENQUEUED, at, 0, "", "", State.PENDING, "", {})[1:]


def insert(now, specs):
    return engine().insert_jobs(
        [given(now, **spec) for spec in specs], ["{}"] * len(specs), [enqueued_event(now)] * len(specs), now
    )


def claimed_event(now, worker="w1"):
    return rows.event_params(
        connection, None, EventType.CLAIMED, adapted(now), None, worker, State.PENDING, State.LEASED, "", {}
    )


def claim(now, worker="w1", limit=10, **options):
    return engine().claim(
        owner=worker,
        limit=limit,
        now=now,
        expires=now + timedelta(seconds=30),
        event=claimed_event(now, worker),
        **options,
    )


def completed_event(now, worker="w1"):
    return rows.event_params(
        connection,
        None,
        EventType.COMPLETED,
        adapted(now),
        None,
        worker,
        State.LEASED,
        State.COMPLETED,
        "",
        {},
    )


def leased_job(worker="w1"):
    enqueue("echo", {})
    (job,) = transitions.claim(worker)
    return job


# --- insert -----------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("count", [1, 3])
def test_insert_writes_each_job_pending_with_one_enqueued_event(count):
    now = timezone.now()
    jobs = insert(now, [{"priority": n} for n in range(count)])
    assert [job.priority for job in jobs] == list(range(count))
    for job in jobs:
        row = Job.objects.get(id=job.id)
        assert (row.state, row.kind, row.attempts, row.run_at) == (State.PENDING, "echo", 0, now)
        (event,) = events(row)
        assert (event.type, event.to_state, event.attempt) == (EventType.ENQUEUED, State.PENDING, 0)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("count", [1, 3])
def test_insert_whose_events_cannot_be_written_writes_no_job(count):
    now = timezone.now()
    broken = [enqueued_event(now, at=None)] * count  # an event's time is NOT NULL
    # Any driver error: PostgreSQL's COPY raises psycopg's own, not Django's IntegrityError.
    with pytest.raises(Exception, match=r"(?i)null"):
        engine().insert_jobs([given(now) for _ in range(count)], ["{}"] * count, broken, now)
    assert Job.objects.count() == 0
    assert Event.objects.count() == 0


# --- claim ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_claim_leases_the_best_jobs_in_order_and_writes_one_claimed_event_each():
    now = timezone.now()
    low, high, mid, later = insert(
        now,
        [
            {"priority": 0},
            {"priority": 20},
            {"priority": 10},
            {"priority": 50, "run_at": now + timedelta(hours=1)},
        ],
    )
    found = claim(now, limit=2)
    leased = rows.JobReader.on(connection).jobs(found)
    assert {job.id for job in leased} == {high.id, mid.id}
    for job in leased:
        assert (job.state, job.lease_owner, job.attempts) == (State.LEASED, "w1", 1)
        assert Job.objects.get(id=job.id).state == State.LEASED
        claimed = events(job)[-1]
        assert (claimed.type, claimed.attempt, claimed.worker) == (EventType.CLAIMED, 1, "w1")
        assert (claimed.from_state, claimed.to_state) == (State.PENDING, State.LEASED)
    for job in (low, later):
        assert Job.objects.get(id=job.id).state == State.PENDING
        assert event_types(job) == [EventType.ENQUEUED]


@pytest.mark.django_db
def test_claim_of_nothing_ready_leases_nothing_and_writes_no_event():
    now = timezone.now()
    insert(now, [{"run_at": now + timedelta(hours=1)}])
    assert list(claim(now)) == []
    assert not Event.objects.filter(type=EventType.CLAIMED).exists()


@pytest.mark.django_db
def test_claim_leaves_out_excluded_queues_kinds_and_keys_but_never_jobs_without_a_key():
    now = timezone.now()
    kept = insert(now, [{"concurrency_key": "b"}, {}])
    insert(now, [{"queue_name": "paused"}, {"kind": "add"}, {"concurrency_key": "a"}])
    found = claim(now, exclude_queues=["paused"], exclude_kinds=["add"], exclude_keys=["a"])
    assert {row[0] for row in found} == {job.id for job in kept}
    assert Event.objects.filter(type=EventType.CLAIMED).count() == 2


@pytest.mark.django_db
def test_claim_fair_leases_in_rounds_over_the_tenants_in_turn_with_one_claimed_event_each():
    now = timezone.now()
    a1, a2, a3 = insert(now, [{"concurrency_key": "a", "priority": p} for p in (5, 3, 1)])
    (b1,) = insert(now, [{"concurrency_key": "b"}])
    n1, n2 = insert(now, [{}, {"priority": -5}])
    # Not this claim's: another kind, an excluded queue, scheduled for later.
    insert(now, [{"kind": "add"}, {"queue_name": "paused"}, {"run_at": now + timedelta(hours=1)}])
    found = engine().claim_fair(
        owner="w1",
        kind="echo",
        tenants=["b", None, "a"],
        limit=5,
        now=now,
        expires=now + timedelta(seconds=30),
        event=claimed_event(now),
        exclude_queues=["paused"],
    )
    # (round, turn): b1 n1 a1, then n2 a2 (b has no more); a3 is sixth.
    assert {row[0] for row in found} == {b1.id, n1.id, a1.id, n2.id, a2.id}
    assert Job.objects.get(id=a3.id).state == State.PENDING
    claimed = Event.objects.filter(type=EventType.CLAIMED)
    assert sorted(claimed.values_list("job_id", "attempt", "worker")) == sorted(
        (job.id, 1, "w1") for job in (b1, n1, a1, n2, a2)
    )


@pytest.mark.django_db
def test_fair_keys_walk_the_kinds_pending_keys_in_order_from_after_up_to_upto():
    now = timezone.now()
    insert(
        now,
        [{"concurrency_key": k} for k in ("c", "a", "d", "b", "a")]
        + [{}, {"kind": "add", "concurrency_key": "e"}],
    )
    insert(now, [{"concurrency_key": "z", "state": State.COMPLETED.value}])
    assert engine().fair_keys("echo", 10) == ["a", "b", "c", "d"]
    assert engine().fair_keys("echo", 2, after="a") == ["b", "c"]
    assert engine().fair_keys("echo", 10, upto="b") == ["a", "b"]
    assert engine().fair_keys("echo", 0) == []
    assert engine().fair_keyless("echo") is True
    assert engine().fair_keyless("add") is False


# --- the fence -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_complete_plain_of_held_jobs_writes_exactly_one_completed_event_each():
    now = timezone.now()
    first, second = leased_job(), leased_job()
    done = [(first.id, 1, {"n": 1}, None), (second.id, 1, None, {"output": "hi"})]
    assert engine().complete_plain(done, "w1", adapted(now), completed_event(now)) == {first.id, second.id}
    for job, result, meta in ((first, {"n": 1}, {}), (second, None, {"output": "hi"})):
        row = Job.objects.get(id=job.id)
        assert (row.state, row.result, row.lease_owner, row.finished_at) == (
            State.COMPLETED,
            result,
            None,
            now,
        )
        completed = [e for e in events(job) if e.type == EventType.COMPLETED]
        assert [(e.attempt, e.worker, e.metadata) for e in completed] == [(1, "w1", meta)]


@pytest.mark.django_db
def test_complete_plain_leaves_a_job_with_a_follow_up_to_the_long_way():
    now = timezone.now()
    enqueue("echo", {}, on_success={"kind": "echo"})
    (job,) = transitions.claim("w1")
    assert (
        engine().complete_plain([(job.id, 1, None, None)], "w1", adapted(now), completed_event(now)) == set()
    )
    assert Job.objects.get(id=job.id).state == State.LEASED
    assert event_types(job) == [EventType.ENQUEUED, EventType.CLAIMED]


def _stale(how):
    """A job leased to w1 at attempt 2, and the (owner, attempt) a stale write names."""
    job = leased_job()
    lapse(job)
    transitions.recover()
    (job,) = transitions.claim("w1")  # re-claimed, by the same worker
    assert job.attempts == 2
    return job, {"owner": ("w2", 2), "attempt": ("w1", 1)}[how]


STALE_WRITES = {
    "complete_plain": lambda job, owner, attempt: engine().complete_plain(
        [(job.id, attempt, None, None)],
        owner,
        adapted(timezone.now()),
        completed_event(timezone.now(), owner),
    ),
    "complete": lambda job, owner, attempt: transitions.complete(job.id, worker_id=owner, attempt=attempt),
    "complete_many": lambda job, owner, attempt: transitions.complete_many(
        [(job.id, attempt, None)], worker_id=owner
    ),
    "fail": lambda job, owner, attempt: transitions.fail(
        job.id, worker_id=owner, attempt=attempt, error={"message": "x"}
    ),
    "release": lambda job, owner, attempt: transitions.release(job.id, worker_id=owner, attempt=attempt),
    "abort": lambda job, owner, attempt: transitions.abort(
        job.id, worker_id=owner, attempt=attempt, how="stopped"
    ),
}
# What a write needs first: abort settles only a job whose abort was requested.
PREPARE = {"abort": lambda job: aborting.cancel(job.id)}


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["owner", "attempt"])
@pytest.mark.parametrize("write", sorted(STALE_WRITES))
def test_a_worker_owned_write_with_a_stale_owner_or_attempt_changes_nothing_and_writes_no_event(write, how):
    job, (owner, attempt) = _stale(how)
    PREPARE.get(write, lambda job: None)(job)
    before = event_types(job)
    assert not STALE_WRITES[write](job, owner, attempt)
    row = Job.objects.get(id=job.id)
    assert (row.state, row.lease_owner, row.attempts, row.result) == (State.LEASED, "w1", 2, None)
    assert event_types(job) == before


@pytest.mark.django_db
def test_renew_extends_only_the_leases_this_owner_holds_and_writes_no_event():
    mine, theirs = leased_job("w1"), leased_job("w2")
    assert transitions.renew([mine.id, theirs.id], worker_id="w1", lease_seconds=600) == {mine.id}
    assert Job.objects.get(id=mine.id).lease_expires_at > timezone.now() + timedelta(seconds=300)
    assert Job.objects.get(id=theirs.id).lease_expires_at < timezone.now() + timedelta(seconds=300)
    assert event_types(mine) == event_types(theirs) == [EventType.ENQUEUED, EventType.CLAIMED]


@pytest.mark.django_db
def test_the_fence_as_sql_and_as_a_queryset_match_the_same_rows():
    held, other = leased_job("w1"), leased_job("w1")
    pairs = [(held.id, 1), (other.id, 2)]  # the second names a stale attempt
    sql, params = Fence("w1", pairs).sql()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {rows.JOB_TABLE} WHERE {sql}", params)
        by_sql = {row[0] for row in cursor.fetchall()}
    by_orm = set(Job.objects.filter(Fence("w1", pairs).q()).values_list("id", flat=True))
    assert by_sql == by_orm == {held.id}


# --- flow control ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_leased_per_key_counts_only_the_kinds_leased_jobs_that_have_a_key():
    JobFactory.create_batch(2, kind="echo", concurrency_key="a", leased=True)
    JobFactory(kind="echo", concurrency_key="b", leased=True)
    JobFactory(kind="echo", leased=True)
    JobFactory(kind="echo", concurrency_key="c")
    JobFactory(kind="add", concurrency_key="a", leased=True)
    assert engine().leased_per_key("echo") == {"a": 2, "b": 1}


@pytest.mark.django_db
def test_claim_gates_list_pauses_and_limited_kinds():
    flow.pause(queue="mail")
    flow.pause(kind="add")
    flow.set_limit("echo", concurrency=2)
    flow.set_limit("slow", rate_period=30)  # no limit set: not a limited kind
    flow.set_limit("report", fair=True)  # fair is claimed apart too
    assert sorted(engine().claim_gates()) == [
        ("kind", "add"),
        ("limit", "echo"),
        ("limit", "report"),
        ("queue", "mail"),
    ]


# --- waiting for work --------------------------------------------------------------------


EXPECTED_WAKE_UP = {"postgresql": "listen", "sqlite": "version", "mysql": "version"}


class _Options:
    burst = False
    poll = 1.0
    queues = ("*",)


@pytest.mark.django_db
def test_a_worker_watches_for_new_work_the_way_its_database_can_tell_it():
    how = engine().wake_up()
    watcher = wakeup.Watcher.for_connection(_Options(), WakeUps(multiprocessing.get_context("fork")))
    if EXPECTED_WAKE_UP[connection.vendor] == "listen":
        assert how.channel == queue_settings.NOTIFY_CHANNEL
        assert isinstance(watcher, wakeup.ListenWatcher)
    else:
        assert how.interval > 0 and how.channel is None
        assert isinstance(watcher, wakeup.VersionWatcher)
    burst = type("Burst", (), {"burst": True})()
    assert wakeup.Watcher.for_connection(burst, None) is None
    assert type(wakeup.Waiter.for_connection(burst, watcher.wakeups)) is wakeup.Waiter


def _enqueue_elsewhere():
    """Enqueue from another connection (a thread has its own) and commit."""

    def run():
        try:
            enqueue("echo", {})
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)


@pytest.mark.django_db(transaction=True)
def test_the_wake_up_signal_moves_when_another_connection_enqueues():
    how = engine().wake_up()
    if how.channel:
        listener = engine().listen(how.channel)
        try:
            _enqueue_elsewhere()
            assert [n.payload for n in listener.notifies(timeout=5, stop_after=1)] == ["default"]
        finally:
            listener.close()
    else:
        seen = engine().wake_version()
        _enqueue_elsewhere()
        assert engine().wake_version() != seen


@pytest.mark.django_db
def test_ready_events_since_tells_new_work_from_the_workers_own_claims_and_acks():
    start, ready = engine().ready_events_since(None)
    assert not ready
    enqueue("echo", {})
    after_enqueue, ready = engine().ready_events_since(start)
    assert ready and after_enqueue > start
    (job,) = transitions.claim("w1")
    transitions.complete(job.id, worker_id="w1", attempt=job.attempts)
    newest, ready = engine().ready_events_since(after_enqueue)
    assert (newest, ready) == (Event.objects.latest("id").id, False)
    assert engine().ready_events_since(newest) == (newest, False)  # nothing since


# --- the gates, read by the claim itself ----------------------------------------------------


@pytest.mark.django_db
def test_an_ungated_claim_leases_as_a_plain_one_when_nothing_is_paused_or_limited():
    now = timezone.now()
    insert(now, [{}, {}])
    assert len(claim(now, limit=10, unless_gated=True)) == 2
    assert claim(now, limit=10, unless_gated=True) == []


@pytest.mark.django_db
@pytest.mark.parametrize("gate", ["queue", "kind", "limit", "fair"])
def test_an_ungated_claim_leases_nothing_and_says_so_while_anything_is_paused_or_limited(gate):
    now = timezone.now()
    insert(now, [{}, {"kind": "add"}])
    if gate == "limit":
        flow.set_limit("elsewhere", concurrency=5)
    elif gate == "fair":
        flow.set_limit("elsewhere", fair=True)
    else:
        flow.pause(**{gate: "nothing-that-exists"})

    assert claim(now, limit=10, unless_gated=True) is None
    assert Job.objects.filter(state=State.LEASED).count() == 0
    assert not Event.objects.filter(type=EventType.CLAIMED).exists()
    assert len(claim(now, limit=10)) == 2  # the gate says nothing about these jobs


@pytest.mark.django_db
def test_an_ungated_claim_with_nothing_ready_still_tells_a_gate_from_an_empty_queue():
    assert claim(timezone.now(), unless_gated=True) == []
    flow.pause(queue="mail")
    assert claim(timezone.now(), unless_gated=True) is None


@pytest.mark.django_db
def test_a_batch_of_results_at_the_size_limit_completes_whole_and_intact():
    # Ten results of a megabyte of JSON each, all quotes: MariaDB's driver escapes them to
    # twice that, and one statement for the batch would pass max_allowed_packet (16 MiB).
    enqueue_many = [enqueue("echo") for _ in range(10)]
    jobs = transitions.claim("w", limit=10, now=timezone.now() + timedelta(seconds=1))
    assert {job.id for job in jobs} == {job.id for job in enqueue_many}
    big = {job.id: f"{job.id}:" + '"' * (queue_settings.MAX_PAYLOAD_BYTES // 2 - 16) for job in jobs}
    done = transitions.complete_many([(job.id, job.attempts, big[job.id]) for job in jobs], worker_id="w")
    assert done == set(big)
    stored = dict(Job.objects.filter(id__in=done).values_list("id", "result"))
    assert stored == big
    assert Event.objects.filter(job_id__in=done, type=EventType.COMPLETED).count() == 10


@pytest.mark.django_db
def test_an_older_attempts_acknowledgement_beside_the_current_one_changes_nothing():
    # A worker that lost a job's lease and claimed it again may hold both attempts' acks
    # in one batch: only the attempt the fence lets through gives the result and the event.
    job = enqueue("echo")
    (claimed,) = transitions.claim("w", limit=1, now=timezone.now() + timedelta(seconds=1))
    assert claimed.id == job.id
    stale, current = claimed.attempts - 1, claimed.attempts
    done = transitions.complete_many(
        [(job.id, stale, "the stale attempt's"), (job.id, current, "the current attempt's")], worker_id="w"
    )
    assert done == {job.id}
    job.refresh_from_db()
    assert job.state == State.COMPLETED and job.result == "the current attempt's"
    assert list(
        Event.objects.filter(job=job, type=EventType.COMPLETED).values_list("attempt", flat=True)
    ) == [current]
