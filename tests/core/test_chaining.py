"""on_success / on_failure follow-ups, enqueued by the terminal transition itself."""

from datetime import timedelta

import pytest
from django.utils import timezone

from queue_app import enqueue
from queue_app.core import transitions
from queue_app.exceptions import InvalidJob
from queue_app.models import Event, Job, State
from queue_app.worker.execution import run_one

pytestmark = pytest.mark.django_db


def test_success_enqueues_the_follow_up_with_the_parents_result_and_both_timelines_show_it():
    parent = enqueue("add", {"a": 2, "b": 3}, on_success={"kind": "echo", "payload": {"x": 1}, "priority": 7})
    run_one()
    child = Job.objects.get(parent_id=parent.id)
    assert child.kind == "echo" and child.priority == 7 and child.state == State.PENDING
    assert child.payload == {
        "x": 1,
        "parent": {"id": parent.id, "kind": "add", "state": "completed", "result": 5, "error": None},
    }
    assert Event.objects.get(job_id=parent.id, type="completed").metadata == {"chained": child.id}
    assert Event.objects.get(job_id=child.id, type="enqueued").metadata["parent"] == parent.id


def test_failure_chains_only_when_the_job_is_dead_lettered_not_on_a_retry():
    parent = enqueue("boom", {"message": "no"}, max_attempts=2, on_failure={"kind": "echo"})
    run_one()
    assert not Job.objects.filter(parent_id=parent.id).exists()
    Job.objects.filter(id=parent.id).update(run_at=timezone.now())
    run_one()
    child = Job.objects.get(parent_id=parent.id)
    assert child.payload["parent"]["state"] == "dead_letter"
    assert child.payload["parent"]["error"]["message"] == "no"
    assert Event.objects.get(job_id=parent.id, type="dead_lettered").metadata["chained"] == child.id


def test_success_does_not_run_the_failure_template_and_vice_versa():
    ok = enqueue("echo", on_failure={"kind": "echo"})
    bad = enqueue("boom", max_attempts=1, on_success={"kind": "echo"})
    run_one()
    run_one()
    assert not Job.objects.filter(parent_id__in=[ok.id, bad.id]).exists()


def test_batched_acks_chain_each_completed_job():
    a = enqueue("echo", {"n": 1}, on_success={"kind": "echo"})
    b = enqueue("echo", {"n": 2})
    jobs = transitions.claim("w1", limit=5)
    held = transitions.complete_many([(j.id, j.attempts, j.payload) for j in jobs], worker_id="w1")
    assert held == {a.id, b.id}
    child = Job.objects.get(parent_id=a.id)
    assert child.payload["parent"]["result"] == {"n": 1}
    assert not Job.objects.filter(parent_id=b.id).exists()


def test_a_lease_recovered_into_the_dead_letter_queue_runs_the_failure_template():
    parent = enqueue("sleepy", max_attempts=1, on_failure={"kind": "echo"})
    [job] = transitions.claim("w1", limit=1, lease_seconds=1)
    transitions.mark_started({job.id: 1}, worker_id="w1")  # it ran: a lease renewal saw it
    transitions.recover(now=timezone.now() + timedelta(seconds=5))
    child = Job.objects.get(parent_id=parent.id)
    assert child.payload["parent"]["error"]["type"] == "LeaseExpired"


def test_chains_chain_further():
    enqueue(
        "echo",
        {"n": 1},
        on_success={"kind": "echo", "on_success": {"kind": "echo", "payload": {"last": True}}},
    )
    for _ in range(3):
        run_one()
    assert Job.objects.filter(state=State.COMPLETED).count() == 3
    assert Job.objects.get(payload__last=True).parent.parent.parent is None


@pytest.mark.parametrize(
    "template",
    [
        {"payload": {}},
        {"kind": "bad kind"},
        {"kind": "echo", "payload": [1]},
        {"kind": "echo", "colour": "red"},
        "echo",
    ],
)
def test_a_bad_template_is_refused_at_enqueue_and_nothing_is_written(template):
    with pytest.raises(InvalidJob) as exc:
        enqueue("echo", on_success=template)
    assert exc.value.field == "on_success"
    assert not Job.objects.exists()


def test_a_result_too_large_to_pass_on_still_completes_the_parent(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_PAYLOAD_BYTES": 200}
    parent = enqueue("echo", {"blob": "x" * 150}, on_success={"kind": "echo"})
    run_one()
    parent.refresh_from_db()
    assert parent.state == State.COMPLETED
    assert "chain_error" in Event.objects.get(job_id=parent.id, type="completed").metadata
    assert not Job.objects.filter(parent_id=parent.id).exists()
