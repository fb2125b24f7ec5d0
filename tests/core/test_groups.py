"""Groups with a callback: counted in each member's terminal transition, the callback
enqueued once, by the group's policy (in-process; tests/worker/test_workflow_workers.py
drains groups with real workers)."""

import pytest

from queue_app import call, chain, group
from queue_app.core import transitions
from queue_app.exceptions import InvalidJob
from queue_app.models import Event, Job, JobGroup, State
from queue_app.worker.execution import run_one
from tests import sample_tasks as tasks

pytestmark = pytest.mark.django_db


def drain(limit=100):
    for _ in range(limit):
        if run_one() is None:
            return


def callbacks(g):
    return list(Job.objects.filter(kind="echo", payload__has_key="group"))


def test_a_group_runs_its_callback_once_with_every_members_outcome_in_member_order():
    g = group(
        [{"kind": "add", "payload": {"a": i, "b": 1}} for i in range(5)],
        callback={"kind": "echo", "payload": {"tag": "done"}, "priority": 5},
    )
    drain()
    g.refresh_from_db()
    assert (g.total, g.completed, g.dead, g.cancelled, g.status) == (5, 5, 0, 0, "succeeded")
    (cb,) = callbacks(g)
    assert cb.id == g.callback_job_id and cb.priority == 5 and cb.state == State.COMPLETED
    info = cb.payload["group"]
    assert cb.payload["tag"] == "done"
    assert info["counts"] == {"total": 5, "completed": 5, "dead_letter": 0, "cancelled": 0}
    assert [m["id"] for m in info["members"]] == g.job_ids
    assert [m["result"] for m in info["members"]] == [1, 2, 3, 4, 5]
    last = Job.objects.get(id=max(g.job_ids))
    ends = Event.objects.filter(job_id__in=g.job_ids, type="completed")
    assert sum("group_callback" in e.metadata for e in ends) == 1
    assert all(e.metadata["group"] == g.id for e in ends)
    decider = next(e for e in ends if "group_callback" in e.metadata)
    assert cb.parent_id == decider.job_id
    assert Event.objects.get(job_id=cb.id, type="enqueued").metadata["parent"] == decider.job_id
    assert last.state == State.COMPLETED


def test_success_policy_closes_failed_without_callback_and_a_requeued_member_reopens_it():
    g = group(
        [{"kind": "add", "payload": {"a": 1, "b": 1}}, {"kind": "boom", "max_attempts": 1}],
        callback={"kind": "echo"},
    )
    drain()
    g.refresh_from_db()
    assert g.status == "failed" and g.dead == 1 and g.callback_job_id is None
    assert callbacks(g) == []
    dead = g.job_ids[1]
    transitions.requeue(dead, payload={"kind": "fixed"})
    g.refresh_from_db()
    assert g.status == "open" and g.dead == 0
    assert Event.objects.get(job_id=dead, type="requeued").metadata["group_reopened"] is True
    # Now it succeeds: the group closes succeeded and the callback runs.
    Job.objects.filter(id=dead).update(kind="echo")
    drain()
    g.refresh_from_db()
    assert g.status == "succeeded" and g.completed == 2
    (cb,) = callbacks(g)
    assert [m["state"] for m in cb.payload["group"]["members"]] == ["completed", "completed"]


def test_always_policy_runs_the_callback_with_the_dead_members_error():
    g = group(
        [{"kind": "boom", "payload": {"message": "no"}, "max_attempts": 1}, {"kind": "echo"}],
        callback={"kind": "echo"},
        policy="always",
    )
    drain()
    (cb,) = callbacks(g)
    members = cb.payload["group"]["members"]
    assert members[0]["state"] == "dead_letter" and members[0]["error"]["message"] == "no"
    assert members[1]["state"] == "completed"
    assert cb.payload["group"]["counts"]["dead_letter"] == 1


def test_first_failure_runs_the_callback_at_once_and_cancels_the_pending_members():
    g = group(
        [{"kind": "boom", "max_attempts": 1, "priority": 10}, {"kind": "echo"}, {"kind": "echo"}],
        callback={"kind": "echo"},
        policy="first_failure",
    )
    run_one()  # the failing member first (priority)
    g.refresh_from_db()
    assert g.status == "failed" and g.dead == 1 and g.cancelled == 2
    (cb,) = callbacks(g)
    assert [m["state"] for m in cb.payload["group"]["members"]] == ["dead_letter", "cancelled", "cancelled"]
    assert Job.objects.get(id=g.job_ids[1]).state == State.CANCELLED
    # Requeue a cancelled member and let it finish: the callback does not run again.
    transitions.requeue(g.job_ids[1])
    drain()
    assert len(callbacks(g)) == 1


def test_first_failure_with_no_failure_runs_the_callback_when_all_completed():
    g = group([{"kind": "echo"}, {"kind": "echo"}], callback={"kind": "echo"}, policy="first_failure")
    drain()
    (cb,) = callbacks(g)
    assert cb.payload["group"]["counts"]["completed"] == 2


def test_a_cancelled_member_counts_as_ended():
    g = group([{"kind": "echo"}, {"kind": "echo"}], callback={"kind": "echo"}, policy="always")
    transitions.cancel(g.job_ids[0])
    drain()
    g.refresh_from_db()
    assert (g.completed, g.cancelled, g.status) == (1, 1, "failed")
    assert len(callbacks(g)) == 1


def test_batched_acks_count_each_member_and_fire_once():
    g = group([{"kind": "echo", "payload": {"n": i}} for i in range(4)], callback={"kind": "echo"})
    jobs = transitions.claim("w1", limit=10)
    transitions.complete_many([(j.id, j.attempts, j.payload) for j in jobs], worker_id="w1")
    g.refresh_from_db()
    assert g.completed == 4
    (cb,) = callbacks(g)
    assert [m["result"] for m in cb.payload["group"]["members"]] == [{"n": i} for i in range(4)]


def test_a_recovered_member_that_dead_letters_is_counted_with_its_new_state():
    from tests.support import lapse

    g = group([{"kind": "echo", "max_attempts": 1}], callback={"kind": "echo"}, policy="always")
    (job,) = transitions.claim("w1", limit=1)
    lapse(job)
    transitions.recover()
    (cb,) = callbacks(g)
    assert cb.payload["group"]["members"][0]["state"] == "dead_letter"


def test_task_calls_join_a_group_and_a_task_callback_gets_the_group_as_a_keyword():
    g = group(
        [call(tasks.add, 1, 2), {"kind": "add", "payload": {"a": 3, "b": 4}}], callback=call(tasks.echo, 9)
    )
    drain()
    cb = Job.objects.get(id=JobGroup.objects.get(id=g.id).callback_job_id)
    assert cb.kind == "tests.sample_tasks.echo"
    assert cb.payload["args"] == [9]
    assert [m["result"] for m in cb.payload["kwargs"]["group"]["members"]] == [3, 7]
    assert cb.state == State.COMPLETED


def test_a_bad_member_or_policy_refuses_the_whole_group_and_writes_nothing():
    with pytest.raises(InvalidJob, match="member 1: kind is required"):
        group([{"kind": "echo"}, {"payload": {}}])
    with pytest.raises(InvalidJob, match="policy must be one of"):
        group([{"kind": "echo"}], policy="sometimes")
    with pytest.raises(InvalidJob, match="callback"):
        group([{"kind": "echo"}], callback={"payload": {}})
    with pytest.raises(InvalidJob, match="at least one member"):
        group([])
    assert not Job.objects.exists() and not JobGroup.objects.exists()


def test_a_callback_too_large_to_enqueue_is_recorded_on_the_group_and_the_members_still_end(settings):
    g = group([{"kind": "echo", "payload": {"blob": "x" * 600}} for _ in range(4)], callback={"kind": "echo"})
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_PAYLOAD_BYTES": 2000}
    drain()
    g.refresh_from_db()
    assert g.completed == 4 and g.callback_job_id is None
    assert "payload" in g.callback_error
    last = Event.objects.filter(job_id__in=g.job_ids, metadata__has_key="group_callback_error")
    assert last.count() == 1


def test_an_operator_cancel_under_first_failure_cancels_the_rest_and_fires_once():
    g = group([{"kind": "echo"} for _ in range(3)], callback={"kind": "echo"}, policy="first_failure")
    transitions.cancel(g.job_ids[1])
    g.refresh_from_db()
    assert g.cancelled == 3 and g.status == "failed"
    (cb,) = callbacks(g)
    assert [m["state"] for m in cb.payload["group"]["members"]] == ["cancelled"] * 3


def test_task_members_send_task_enqueued_on_commit_as_enqueue_does(django_capture_on_commit_callbacks):
    from django.tasks.signals import task_enqueued

    heard = []

    def receiver(sender, task_result, **kwargs):
        heard.append(task_result.id)

    task_enqueued.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            g = group([call(tasks.add, 1, 2), {"kind": "echo"}, call(tasks.noop)])
            jobs = chain(call(tasks.add, 1, 2), call(tasks.echo))
            assert heard == []  # not before the commit
    finally:
        task_enqueued.disconnect(receiver)
    assert heard == [str(g.job_ids[0]), str(g.job_ids[2]), str(jobs[0].id), str(jobs[1].id)]
