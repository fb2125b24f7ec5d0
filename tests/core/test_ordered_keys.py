"""Ordered keys: jobs sharing an ordering_key run one at a time in enqueue order, each a
dependency of the next (workflows.py, Ordered keys); with ordering_blocks a dead letter
holds the key until it completes or an operator skips it."""

import threading
import time

import pytest
from django.db import connections, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queue_app import bulk_enqueue, enqueue
from queue_app.core import transitions
from queue_app.exceptions import InvalidJob
from queue_app.handlers import registry
from queue_app.models import Dependency, Event, Job, State
from queue_app.ops.why import why
from queue_app.worker.execution import run_one
from tests.support import drain, event_types

pytestmark = pytest.mark.django_db


class Broken(Exception):
    pass


def flaky(payload):
    if payload.get("fail"):
        raise Broken("broken")
    return payload.get("n")


@pytest.fixture(autouse=True)
def _flaky():
    registry.register("flaky", flaky)


def state(job):
    return Job.objects.get(id=job.id).state


def live(key):
    return Job.objects.filter(ordering_key=key, state__in=[State.PENDING, State.LEASED]).count()


def test_jobs_sharing_a_key_run_one_at_a_time_in_enqueue_order_whatever_their_priority():
    # Each later job has a higher priority: without the key the claim would take it first.
    jobs = [enqueue("echo", {"n": n}, ordering_key="acct:1", priority=n) for n in range(5)]
    other = enqueue("echo", ordering_key="acct:2")
    assert [j.state for j in jobs] == [State.PENDING] + [State.WAITING] * 4
    assert other.state == State.PENDING
    assert [j.depends["after"] for j in jobs[1:]] == [j.id for j in jobs[:-1]]
    ran = []
    while (job := run_one()) is not None:
        assert live("acct:1") <= 1
        ran.append(job.id)
    assert [i for i in ran if i != other.id] == [j.id for j in jobs]
    assert event_types(jobs[1]) == ["enqueued", "unblocked", "claimed", "completed"]


def test_a_key_whose_jobs_have_all_ended_takes_the_next_one_at_once_without_a_dependency():
    first = enqueue("echo", ordering_key="k")
    drain()
    second = enqueue("echo", ordering_key="k")
    assert second.state == State.PENDING and second.ordering_key == "k"
    assert not Dependency.objects.filter(job_id=second.id).exists()
    assert Event.objects.get(job_id=second.id, type="enqueued").metadata["ordering_key"] == "k"
    assert first.id != second.id


def test_a_retrying_job_keeps_its_place_and_its_successor_waits_out_the_backoff():
    a = enqueue("flaky", {"fail": True}, ordering_key="k", max_attempts=2)
    b = enqueue("echo", ordering_key="k")
    run_one()
    assert state(a) == State.PENDING and state(b) == State.WAITING
    assert run_one() is None  # a backs off; b may not pass it
    transitions.change_payload(a.id, {"fail": False})
    transitions.retry_now(a.id)
    assert drain() == [a.id, b.id]


def test_by_default_a_dead_letter_passes_the_key_on():
    a = enqueue("flaky", {"fail": True}, ordering_key="k", max_attempts=1)
    b = enqueue("echo", ordering_key="k")
    drain()
    assert (state(a), state(b)) == (State.DEAD_LETTER, State.COMPLETED)
    assert enqueue("echo", ordering_key="k").state == State.PENDING


def test_with_ordering_blocks_a_dead_letter_holds_the_key_until_it_is_requeued_and_completes():
    a = enqueue("flaky", {"fail": True}, ordering_key="k", ordering_blocks=True, max_attempts=1)
    b = enqueue("echo", ordering_key="k", ordering_blocks=True)
    c = enqueue("echo", ordering_key="k", ordering_blocks=True)
    drain()
    b.refresh_from_db()
    assert b.state == State.WAITING and b.depends["held"] is True
    assert state(c) == State.WAITING
    reason = why(b)
    assert reason.code == "held" and f"blocked by job {a.id} on ordering key 'k'" in reason.text
    # A job enqueued now lines up behind them.
    d = enqueue("echo", ordering_key="k", ordering_blocks=True)
    assert d.state == State.WAITING and d.depends["after"] == c.id
    transitions.requeue(a.id, payload={"fail": False})
    assert drain() == [a.id, b.id, c.id, d.id]


def test_a_blocked_key_is_skipped_by_requeueing_the_held_job_and_the_line_goes_on():
    a = enqueue("flaky", {"fail": True}, ordering_key="k", ordering_blocks=True, max_attempts=1)
    dead = enqueue("flaky", {"fail": True}, ordering_key="j", ordering_blocks=True, max_attempts=1)
    drain()
    b = enqueue("echo", ordering_key="k", ordering_blocks=True)
    assert b.state == State.WAITING and b.depends["held"] is True  # blocked at enqueue
    c = enqueue("echo", ordering_key="k", ordering_blocks=True)
    transitions.requeue(b.id)  # skip a
    assert drain() == [b.id, c.id]
    assert state(a) == State.DEAD_LETTER
    # A cancel is not a failure here: cancelling the held job passes the key on as well.
    held = enqueue("echo", ordering_key="j", ordering_blocks=True)
    after = enqueue("echo", ordering_key="j", ordering_blocks=True)
    transitions.cancel(held.id)
    assert drain() == [after.id]
    assert state(dead) == State.DEAD_LETTER


def test_cancelling_a_job_in_the_middle_of_the_line_hands_its_place_on_without_letting_anyone_overtake():
    a, b, c = (enqueue("echo", {"n": n}, ordering_key="k") for n in range(3))
    transitions.cancel(b.id)
    c.refresh_from_db()
    assert (c.state, c.waiting_for, c.depends["after"]) == (State.WAITING, 1, a.id)
    assert run_one().id == a.id
    assert drain() == [c.id]
    # Cancelling the head hands the key to the next at once.
    d, e = enqueue("echo", ordering_key="k"), enqueue("echo", ordering_key="k")
    transitions.cancel(d.id)
    assert state(e) == State.PENDING


def test_bad_ordering_options_are_refused_and_write_nothing():
    a = enqueue("echo")
    for options, message in [
        ({"ordering_blocks": True}, "ordering_blocks needs an ordering_key"),
        ({"ordering_key": "k", "ordering_blocks": "yes"}, "ordering_blocks must be true or false"),
        ({"ordering_key": ""}, "ordering_key must be a non-empty string"),
        ({"ordering_key": "k", "unique_key": "u"}, "ordering_key does not go with unique_key"),
        ({"ordering_key": "k", "depends_on": [a.id]}, "ordering_key does not go with depends_on"),
    ]:
        with pytest.raises(InvalidJob, match=message):
            enqueue("echo", **options)
    with pytest.raises(InvalidJob, match="job 1: ordering_blocks"):
        bulk_enqueue([{"kind": "echo", "ordering_key": "k"}, {"kind": "echo", "ordering_blocks": False}])
    assert Job.objects.count() == 1


def test_bulk_enqueue_lines_a_batchs_jobs_up_in_list_order():
    jobs = bulk_enqueue([{"kind": "echo", "payload": {"n": n}, "ordering_key": "b"} for n in range(4)])
    assert drain() == [j.id for j in jobs]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(st.sampled_from(["x", "y"]), st.booleans(), st.integers(-5, 5)),
        min_size=1,
        max_size=10,
    ),
    st.booleans(),
    st.lists(st.integers(0, 9), max_size=3),
)
def test_each_keys_jobs_complete_in_enqueue_order_never_two_at_once(specs, blocks, cancels):
    """The property: whatever the priorities, failures and cancels in the middle of the
    line, each key's jobs start in enqueue order, at most one of a key is ever pending or
    leased, and after fixing and requeueing the dead (with ordering_blocks) every job that
    was not cancelled has completed."""
    Job.objects.all().delete()
    jobs = [
        enqueue(
            "flaky", {"fail": fail}, ordering_key=key, ordering_blocks=blocks, priority=prio, max_attempts=1
        )
        for key, fail, prio in specs
    ]
    for i in sorted(set(cancels)):
        if i < len(jobs):
            transitions.cancel(jobs[i].id)
    for _ in range(len(jobs) + 1):
        while run_one() is not None:
            assert live("x") <= 1 and live("y") <= 1
        if not blocks:
            break
        dead = list(Job.objects.filter(state=State.DEAD_LETTER))
        if not dead:
            break
        for job in dead:
            transitions.requeue(job.id, payload={"fail": False})
    for key in ("x", "y"):
        mine = [j.id for j in jobs if j.ordering_key == key]
        started = list(
            Event.objects.filter(job_id__in=mine, type="claimed")
            .order_by("id")
            .values_list("job_id", flat=True)
        )
        first_starts = list(dict.fromkeys(started))
        assert first_starts == sorted(first_starts, key=mine.index)
    left = Job.objects.filter(id__in=[j.id for j in jobs]).exclude(state=State.CANCELLED)
    expected = {State.COMPLETED} if blocks else {State.COMPLETED, State.DEAD_LETTER}
    assert set(left.values_list("state", flat=True)) <= expected


def test_a_job_handed_on_past_a_cancel_is_revived_when_the_dead_job_it_was_blocked_by_is_requeued():
    a = enqueue("flaky", {"fail": True}, ordering_key="k", ordering_blocks=True, max_attempts=1)
    b = enqueue("echo", ordering_key="k", ordering_blocks=True)
    c = enqueue("echo", ordering_key="k", ordering_blocks=True)
    transitions.cancel(b.id)
    drain()
    assert Job.objects.get(id=c.id).depends["held"] is True
    transitions.requeue(a.id, payload={"fail": False})
    assert drain() == [a.id, c.id]


@pytest.mark.django_db(transaction=True)
def test_a_cancel_in_the_line_racing_the_end_of_the_job_ahead_never_strands_the_next_one(vendor):
    if vendor == "sqlite":
        pytest.skip("SQLite serialises writers with the database lock; there are no row locks to race")
    a, b, c = (enqueue("echo", {"n": n}, ordering_key="race") for n in range(3))
    (leased,) = transitions.claim("w", limit=1)
    assert leased.id == a.id
    done = {}

    def complete_a():
        try:
            done["ok"] = transitions.complete(a.id, worker_id="w", attempt=leased.attempts, result=1)
        finally:
            connections.close_all()

    racer = threading.Thread(target=complete_a)
    with transaction.atomic():
        transitions.cancel(b.id)  # c now waits for a instead (the hand-on's new Dependency)
        racer.start()
        time.sleep(0.5)
        # The cancel locked a first: a's end waits, and then sees the new link.
        assert "ok" not in done
    racer.join(10)
    assert done["ok"] is True
    c.refresh_from_db()
    assert (c.state, c.waiting_for) == (State.PENDING, 0)
