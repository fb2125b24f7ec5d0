"""Groups and dependencies drained by real worker processes sharing one database."""

import os
import signal

import pytest

from queue_app import Workflow, group
from queue_app.core import transitions
from queue_app.models import Event, Job, JobGroup, State
from tests import worker_support

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# The callbacks go to a queue the workers do not serve: they stay pending to be counted.
CALLBACK = {"kind": "noop", "queue_name": "callbacks"}


def ended(ids):
    return lambda: (
        not Job.objects.filter(id__in=ids)
        .exclude(state__in=["completed", "dead_letter", "cancelled"])
        .exists()
    )


def workers(n=2, **options):
    options = {"concurrency": 2, "batch": 5, "poll": 0.02, "queues": ("default",), **options}
    return [worker_support.start_worker(**options) for _ in range(n)]


def stop_all(procs):
    for proc in procs:
        assert worker_support.stop(proc, within=60) == 0


def test_a_thousand_member_group_drained_by_four_processes_gives_one_callback_with_every_outcome():
    g = group([{"kind": "echo", "payload": {"n": i}} for i in range(1000)], callback=CALLBACK)
    procs = workers()  # two supervisors of two children each: two hosts' worth
    worker_support.wait_for(ended(g.job_ids), timeout=240, what="the group's members to end")
    stop_all(procs)
    g.refresh_from_db()
    assert (g.completed, g.dead, g.cancelled, g.status) == (1000, 0, 0, "succeeded")
    (cb,) = Job.objects.filter(queue_name="callbacks")
    assert cb.id == g.callback_job_id
    members = cb.payload["group"]["members"]
    assert [m["id"] for m in members] == g.job_ids
    assert [m["result"] for m in members] == [{"n": i} for i in range(1000)]
    assert Event.objects.filter(job_id__in=g.job_ids, metadata__has_key="group_callback").count() == 1


def test_two_members_finishing_at_the_same_instant_on_two_workers_still_give_one_callback(tmp_path):
    groups = []
    for n in range(6):
        path = str(tmp_path / f"g{n}")
        member = {"kind": "rendezvous", "payload": {"path": path, "expected": 2, "patience": 10}}
        groups.append(group([member, member], callback=CALLBACK, policy="always"))
    ids = [i for g in groups for i in g.job_ids]
    procs = workers(concurrency=1, batch=1)
    worker_support.wait_for(ended(ids), timeout=180, what="every member to end")
    stop_all(procs)
    together = 0
    for g in groups:
        g.refresh_from_db()
        assert g.completed == 2 and g.callback_job_id is not None
        assert Job.objects.filter(queue_name="callbacks", payload__group__id=g.id).count() == 1
        # Both met at the barrier: they returned at the same moment, on two processes.
        together += [j.result for j in Job.objects.filter(id__in=g.job_ids)] == [2, 2]
    assert together >= 1
    assert Job.objects.filter(queue_name="callbacks").count() == len(groups)


@pytest.mark.parametrize(
    ("policy", "callbacks", "states"),
    [
        ("success", 0, {"completed": 3, "dead_letter": 1}),
        ("always", 1, {"completed": 3, "dead_letter": 1}),
        ("first_failure", 1, None),
    ],
)
def test_a_dead_lettered_member_with_each_policy(policy, callbacks, states):
    members = [{"kind": "echo"} for _ in range(3)] + [{"kind": "boom", "max_attempts": 1}]
    g = group(members, callback=CALLBACK, policy=policy)
    procs = workers(n=1)
    worker_support.wait_for(ended(g.job_ids), timeout=120, what="the group's members to end")
    stop_all(procs)
    g.refresh_from_db()
    assert g.dead == 1 and g.status == "failed"
    assert Job.objects.filter(queue_name="callbacks").count() == callbacks
    if states is not None:
        got = {}
        for job in Job.objects.filter(id__in=g.job_ids):
            got[job.state] = got.get(job.state, 0) + 1
        assert got == states
    if callbacks:
        (cb,) = Job.objects.filter(queue_name="callbacks")
        assert cb.payload["group"]["members"][3]["state"] == "dead_letter"
    # Requeue the dead member (it now succeeds): the group re-opens and closes again.
    dead = Job.objects.get(id=g.job_ids[3])
    Job.objects.filter(id=dead.id).update(kind="echo")
    transitions.requeue(dead.id)
    assert JobGroup.objects.get(id=g.id).status == "open"
    procs = workers(n=1)
    worker_support.wait_for(ended([dead.id]), timeout=60, what="the requeued member")
    stop_all(procs)
    g.refresh_from_db()
    assert g.closed_at is not None and g.dead == 0
    # The requeue re-armed the callback: the policy decided once more. success runs it
    # now that every member completed, always once per closing, first_failure again only
    # if no member is left cancelled (then every one completed).
    again = {"success": 1, "always": 2, "first_failure": 1 + (g.completed == 4)}[policy]
    assert Job.objects.filter(queue_name="callbacks").count() == again


def test_a_diamond_runs_in_dependency_order_on_real_workers():
    wf = Workflow()
    wf.add("a", {"kind": "echo", "payload": {"step": "a"}})
    wf.add("b", {"kind": "echo", "payload": {"step": "b"}}, after=["a"])
    wf.add("c", {"kind": "echo", "payload": {"step": "c"}}, after=["a"])
    wf.add("d", {"kind": "echo", "payload": {"step": "d"}}, after=["b", "c"], pass_result=True)
    jobs = wf.enqueue()
    ids = [j.id for j in jobs.values()]
    procs = workers()
    worker_support.wait_for(ended(ids), timeout=120, what="the diamond")
    stop_all(procs)
    claimed = {e.job_id: e.id for e in Event.objects.filter(type="claimed", job_id__in=ids)}
    done = {e.job_id: e.id for e in Event.objects.filter(type="completed", job_id__in=ids)}
    for up, down in [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]:
        assert done[jobs[up].id] < claimed[jobs[down].id]
    d = Job.objects.get(id=jobs["d"].id)
    assert d.state == State.COMPLETED
    assert [x["result"]["step"] for x in d.result["dependencies"]] == ["b", "c"]
    assert Event.objects.filter(job_id__in=ids, type="claimed").count() == 4


def test_a_worker_killed_in_the_middle_of_a_group_loses_nothing_and_the_callback_fires_once():
    g = group([{"kind": "sleepy", "payload": {"seconds": 0.01}} for _ in range(200)], callback=CALLBACK)
    doomed = worker_support.start_worker(
        name="doomed", concurrency=2, batch=5, lease=30.0, heartbeat=0.1, poll=0.02, queues=("default",)
    )
    worker_support.wait_for(
        lambda: Job.objects.filter(group_id=g.id, state=State.COMPLETED).count() >= 40,
        timeout=120,
        what="some members done",
    )
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.join(10)
    # Its children die with it (they watch their parent); nobody settles their leases.
    worker_support.wait_for(
        lambda: transitions.recover(owned_by="doomed/") or not Job.objects.leased().exists(),
        timeout=30,
        what="the dead worker's leases taken back",
    )
    procs = workers()
    worker_support.wait_for(ended(g.job_ids), timeout=180, what="the rest of the group")
    stop_all(procs)
    g.refresh_from_db()
    assert (g.completed, g.dead, g.cancelled) == (200, 0, 0)
    (cb,) = Job.objects.filter(queue_name="callbacks")
    assert [m["state"] for m in cb.payload["group"]["members"]] == ["completed"] * 200
    assert Event.objects.filter(job_id__in=g.job_ids, metadata__has_key="group_callback").count() == 1


def test_two_dependencies_ending_at_the_same_instant_unblock_their_dependent_once(tmp_path):
    dependents = []
    for n in range(4):
        path = str(tmp_path / f"d{n}")
        member = {"kind": "rendezvous", "payload": {"path": path, "expected": 2, "patience": 10}}
        wf = Workflow()
        wf.add("a", member)
        wf.add("b", member)
        wf.add("d", {"kind": "echo", "payload": {"n": n}}, after=["a", "b"])
        dependents.append(wf.enqueue()["d"])
    procs = workers(concurrency=1, batch=1)
    worker_support.wait_for(ended([d.id for d in dependents]), timeout=180, what="every dependent to end")
    stop_all(procs)
    for d in dependents:
        assert Event.objects.filter(job_id=d.id, type="unblocked").count() == 1
        assert Event.objects.filter(job_id=d.id, type="claimed").count() == 1
        assert Job.objects.get(id=d.id).state == State.COMPLETED
