"""Requeueing a failed job undoes what its failure did to the workflow: the dependents it
cancelled or held wait for it again (down the line), and a requeued group member re-opens
its group with the callback re-armed (workflows.py, Revival)."""

import threading
import time

import pytest
from django.db import connections, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queue_app import enqueue, group
from queue_app.core import transitions
from queue_app.handlers import registry
from queue_app.models import Event, Job, JobGroup, State
from queue_app.ops.why import why
from queue_app.worker.execution import run_one
from tests.support import drain, event_types

pytestmark = pytest.mark.django_db


class Broken(Exception):
    pass


def flaky(payload):
    """Fails while its payload says so: a requeue with a fixed payload makes it pass."""
    if payload.get("fail"):
        raise Broken(f"node {payload.get('node')} is broken")
    return payload.get("node")


@pytest.fixture(autouse=True)
def _flaky():
    registry.register("flaky", flaky)


def broken(**options):
    return enqueue("flaky", {"fail": True}, max_attempts=1, **options)


def fix(job):
    return transitions.requeue(job.id, payload={"fail": False})


def state(job):
    return Job.objects.get(id=job.id).state


def test_requeueing_a_dead_dependency_revives_the_dependents_it_cancelled_down_the_line():
    a = broken()
    b = enqueue("echo", depends_on=[a.id])
    c = enqueue("echo", depends_on=[b.id])
    drain()
    assert (state(a), state(b), state(c)) == (State.DEAD_LETTER, State.CANCELLED, State.CANCELLED)
    assert f"requeueing job {a.id} makes it wait" in why(Job.objects.get(id=b.id)).text
    fix(a)
    for job, after, left in ((b, a, 1), (c, b, 1)):
        job.refresh_from_db()
        assert job.state == State.WAITING and job.waiting_for == left and job.finished_at is None
        assert "cancelled_by" not in job.depends
        revived = Event.objects.get(job_id=job.id, type="revived")
        assert (revived.from_state, revived.to_state, revived.metadata["after"]) == (
            "cancelled",
            "waiting",
            after.id,
        )
    assert not Job.objects.ready().filter(id__in=[b.id, c.id]).exists()
    assert drain() == [a.id, b.id, c.id]
    assert event_types(c) == ["enqueued", "cancelled", "revived", "unblocked", "claimed", "completed"]


def test_requeue_revives_a_held_dependent_which_then_waits_for_the_requeued_job():
    a = broken()
    b = enqueue("echo", depends_on=[a.id], on_dependency_failure="hold")
    drain()
    b.refresh_from_db()
    assert b.state == State.WAITING and b.depends["held"] is True and b.waiting_for == 0
    fix(a)
    b.refresh_from_db()
    assert b.state == State.WAITING and b.depends["held"] is False and b.waiting_for == 1
    assert drain() == [a.id, b.id]
    assert event_types(b) == ["enqueued", "held", "revived", "unblocked", "claimed", "completed"]


def test_a_dependent_another_failed_dependency_still_keeps_is_revived_only_by_that_ones_requeue():
    a, x = broken(), broken()
    b = enqueue("echo", depends_on=[a.id, x.id])
    h = enqueue("echo", depends_on=[a.id, x.id], on_dependency_failure="hold")
    drain()
    fix(a)
    assert state(b) == State.CANCELLED
    h.refresh_from_db()
    assert h.depends["held"] is True and h.waiting_for == 1
    assert not Event.objects.filter(type="revived").exists()
    fix(x)
    b.refresh_from_db()
    h.refresh_from_db()
    assert (b.state, b.waiting_for) == (State.WAITING, 2)
    assert (h.state, h.depends["held"], h.waiting_for) == (State.WAITING, False, 2)
    drain()
    assert state(b) == state(h) == State.COMPLETED


def test_a_dependent_cancelled_at_enqueue_is_revived_and_an_operators_cancel_is_not():
    a = broken()
    by_operator = enqueue("echo", depends_on=[a.id])
    transitions.cancel(by_operator.id, actor="ops")
    drain()
    at_enqueue = enqueue("echo", depends_on=[a.id])
    assert at_enqueue.state == State.CANCELLED
    fix(a)
    assert state(at_enqueue) == State.WAITING
    assert state(by_operator) == State.CANCELLED


def test_an_operators_requeue_of_a_dropped_dependent_clears_its_mark_so_a_later_cancel_stays():
    a = broken()
    b = enqueue("echo", depends_on=[a.id])
    drain()
    assert Job.objects.get(id=b.id).depends["cancelled_by"] == a.id
    transitions.requeue(b.id)  # run it anyway
    b.refresh_from_db()
    assert b.state == State.PENDING and "cancelled_by" not in b.depends
    transitions.cancel(b.id, actor="ops")
    fix(a)
    assert state(b) == State.CANCELLED


def test_the_run_policy_dependent_is_left_alone_by_the_requeue():
    a = broken()
    b = enqueue("echo", depends_on=[a.id], on_dependency_failure="run")
    drain()
    fix(a)
    drain()
    assert state(b) == State.COMPLETED
    assert Event.objects.filter(job_id=b.id, type="completed").count() == 1
    assert not Event.objects.filter(job_id=b.id, type="revived").exists()


def callbacks():
    return list(Job.objects.filter(kind="echo", payload__has_key="group").order_by("id"))


def test_a_requeued_member_reopens_its_always_group_and_the_callback_runs_once_more_when_it_ends_again():
    g = group(
        [{"kind": "flaky", "payload": {"fail": True}, "max_attempts": 1}, {"kind": "echo"}],
        callback={"kind": "echo"},
        policy="always",
    )
    drain()
    (first,) = callbacks()
    assert first.payload["group"]["counts"]["dead_letter"] == 1
    requeued = transitions.requeue(g.job_ids[0], payload={"fail": False})
    meta = Event.objects.get(job_id=requeued.id, type="requeued").metadata
    assert meta["group_reopened"] is True and meta["group_callback_rearmed"] is True
    g.refresh_from_db()
    assert g.status == "open" and g.fired_at is None
    drain()
    g.refresh_from_db()
    first_again, second = callbacks()
    assert first_again.id == first.id and g.callback_job_id == second.id
    assert [m["state"] for m in second.payload["group"]["members"]] == ["completed", "completed"]
    assert g.status == "succeeded"


def test_a_group_member_cancelled_because_of_a_dependency_is_revived_and_reopens_its_group():
    a = broken()
    g = group([{"kind": "echo", "depends_on": [a.id]}, {"kind": "echo"}], callback={"kind": "echo"})
    drain()
    g.refresh_from_db()
    assert (g.status, g.cancelled, g.completed) == ("failed", 1, 1) and callbacks() == []
    fix(a)
    g.refresh_from_db()
    assert (g.status, g.cancelled) == ("open", 0)
    assert Event.objects.get(job_id=g.job_ids[0], type="revived").metadata["group_reopened"] is True
    drain()
    g.refresh_from_db()
    assert g.status == "succeeded"
    assert len(callbacks()) == 1


@st.composite
def broken_dags(draw):
    n = draw(st.integers(min_value=1, max_value=7))
    edges = {
        i: sorted(draw(st.sets(st.integers(min_value=0, max_value=i - 1), max_size=3)) if i else [])
        for i in range(n)
    }
    broken = draw(st.sets(st.integers(min_value=0, max_value=n - 1), min_size=1))
    policies = [draw(st.sampled_from(["cancel", "hold"])) for _ in range(n)]
    return edges, broken, policies


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(broken_dags())
def test_fixing_and_requeueing_every_dead_job_runs_the_whole_dag_once_in_edge_order(dag):
    """The property: however failures cancelled or held a DAG, requeueing each dead job
    (fixed) until none is left completes every node exactly once, each after its
    dependencies, with nothing left waiting or cancelled."""
    edges, broken_nodes, policies = dag
    Job.objects.all().delete()
    jobs = {}
    for node in range(len(edges)):
        options = {"max_attempts": 1}
        if edges[node]:
            options.update(depends_on=[jobs[u].id for u in edges[node]], on_dependency_failure=policies[node])
        jobs[node] = enqueue("flaky", {"node": node, "fail": node in broken_nodes}, **options)
    drain()
    for _ in range(len(edges) + 1):
        dead = list(Job.objects.filter(state=State.DEAD_LETTER).order_by("id"))
        if not dead:
            break
        for job in dead:
            transitions.requeue(job.id, payload={"node": job.payload["node"], "fail": False})
        drain()
    ids = [j.id for j in jobs.values()]
    assert sorted(Job.objects.filter(id__in=ids).values_list("state", flat=True)) == [State.COMPLETED] * len(
        ids
    )
    completions = list(
        Event.objects.filter(job_id__in=ids, type="completed").order_by("id").values_list("job_id", flat=True)
    )
    assert sorted(completions) == sorted(ids)
    position = {job_id: i for i, job_id in enumerate(completions)}
    for node, ups in edges.items():
        for up in ups:
            assert position[jobs[up].id] < position[jobs[node].id]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.booleans(), min_size=1, max_size=6),
    st.sampled_from(["always", "success"]),
)
def test_a_group_runs_its_callback_once_per_decision_however_many_members_are_requeued(failing, policy):
    """The property: requeueing the dead members one at a time, each re-closing the
    group, gives with ``always`` one callback per closing (each with that closing's
    outcomes) and with ``success`` exactly one, once every member has completed."""
    Job.objects.all().delete()
    JobGroup.objects.all().delete()
    members = [{"kind": "flaky", "payload": {"fail": f}, "max_attempts": 1} for f in failing]
    g = group(members, callback={"kind": "echo"}, policy=policy)
    drain()
    closings = 1
    for job_id in [i for i, f in zip(g.job_ids, failing) if f]:
        transitions.requeue(job_id, payload={"fail": False})
        drain()
        closings += 1
    runs = callbacks()
    if policy == "always":
        assert len(runs) == closings
        dead = [sum(m["state"] == "dead_letter" for m in cb.payload["group"]["members"]) for cb in runs]
        assert dead == list(range(sum(failing), -1, -1))
    else:
        assert len(runs) == 1
        assert [m["state"] for m in runs[0].payload["group"]["members"]] == ["completed"] * len(failing)


@pytest.mark.django_db(transaction=True)
def test_a_revival_racing_the_end_of_the_revived_jobs_other_dependency_counts_it_once(vendor):
    if vendor == "sqlite":
        pytest.skip("SQLite serialises writers with the database lock; there are no row locks to race")
    x = broken()
    y = enqueue("echo", {"n": "y"}, priority=-1)
    d = enqueue("echo", depends_on=[x.id, y.id])
    assert run_one().id == x.id  # dead: d is cancelled
    (leased,) = transitions.claim("w", limit=1)
    assert leased.id == y.id and state(d) == State.CANCELLED
    done = {}

    def complete_y():
        try:
            done["ok"] = transitions.complete(y.id, worker_id="w", attempt=leased.attempts, result=1)
        finally:
            connections.close_all()

    racer = threading.Thread(target=complete_y)
    with transaction.atomic():
        fix(x)  # d waits again, for x and y
        racer.start()
        time.sleep(0.5)
        # The requeue locked y first: y's end waits, then sees d waiting and counts it down.
        assert "ok" not in done
    racer.join(10)
    assert done["ok"] is True
    d.refresh_from_db()
    assert (d.state, d.waiting_for) == (State.WAITING, 1)
    assert drain() == [x.id, d.id]
