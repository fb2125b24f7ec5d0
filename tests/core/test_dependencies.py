"""depends_on: a job waits until the jobs it names have ended, then becomes pending in
the transaction of the last one's end; chains and DAGs built with canvas."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queue_app import Workflow, call, chain, enqueue
from queue_app.core import transitions
from queue_app.exceptions import InvalidJob
from queue_app.models import Dependency, Job, State
from queue_app.ops import reads
from queue_app.worker.execution import run_one
from tests import sample_tasks as tasks
from tests.support import drain, event_types, events

pytestmark = pytest.mark.django_db


def test_a_dependent_waits_unleased_and_not_ready_until_its_dependencies_complete():
    a = enqueue("echo", {"n": 1})
    b = enqueue("echo", {"n": 2})
    c = enqueue("echo", {"n": 3}, depends_on=[a.id, b.id])
    assert c.state == State.WAITING and c.waiting_for == 2
    assert not Job.objects.ready().filter(id=c.id).exists()
    assert reads.state_counts()["waiting"] == 1
    assert run_one().id in (a.id, b.id)
    c.refresh_from_db()
    assert c.state == State.WAITING and c.waiting_for == 1
    run_one()
    c.refresh_from_db()
    assert c.state == State.PENDING
    assert event_types(c) == ["enqueued", "unblocked"]
    assert run_one().id == c.id


def test_a_failed_dependency_cancels_its_dependents_by_default_and_down_the_line():
    a = enqueue("boom", max_attempts=1)
    b = enqueue("echo", depends_on=[a.id])
    c = enqueue("echo", depends_on=[b.id])
    drain()
    assert Job.objects.get(id=b.id).state == State.CANCELLED
    assert Job.objects.get(id=c.id).state == State.CANCELLED


def test_run_policy_runs_the_dependent_anyway():
    a = enqueue("boom", max_attempts=1)
    b = enqueue("echo", depends_on=[a.id], on_dependency_failure="run")
    drain()
    assert Job.objects.get(id=b.id).state == State.COMPLETED


def test_hold_policy_keeps_the_dependent_waiting_until_an_operator_requeues_it():
    a = enqueue("boom", max_attempts=1)
    b = enqueue("echo", depends_on=[a.id], on_dependency_failure="hold")
    drain()
    b.refresh_from_db()
    assert b.state == State.WAITING and b.depends["held"] is True
    assert event_types(b) == ["enqueued", "held"]
    transitions.requeue(b.id)
    drain()
    assert Job.objects.get(id=b.id).state == State.COMPLETED


def test_dependencies_already_ended_at_enqueue_count_as_ended():
    a = enqueue("echo")
    run_one()
    b = enqueue("echo", depends_on=[a.id])
    assert b.state == State.PENDING
    dead = enqueue("boom", max_attempts=1)
    drain()
    assert enqueue("echo", depends_on=[dead.id]).state == State.CANCELLED
    assert enqueue("echo", depends_on=[dead.id], on_dependency_failure="hold").state == State.WAITING


def test_unknown_ids_and_bad_options_are_refused_and_write_nothing():
    a = enqueue("echo")
    with pytest.raises(InvalidJob, match="no job with id 999999"):
        enqueue("echo", depends_on=[a.id, 999999])
    with pytest.raises(InvalidJob, match="is not a job id"):
        enqueue("echo", depends_on=["x"])
    with pytest.raises(InvalidJob, match="on_dependency_failure must be one of"):
        enqueue("echo", depends_on=[a.id], on_dependency_failure="later")
    assert Job.objects.count() == 1 and not Dependency.objects.exists()
    assert Job.objects.get(id=a.id).in_workflow is None


def test_a_cycle_is_refused_with_the_cycle_named():
    wf = Workflow()
    wf.add("a", {"kind": "echo"}, after=["c"])
    wf.add("b", {"kind": "echo"}, after=["a"])
    wf.add("c", {"kind": "echo"}, after=["b"])
    with pytest.raises(InvalidJob, match="a cycle: 'a' -> 'c' -> 'b' -> 'a'"):
        wf.enqueue()
    assert not Job.objects.exists()


def test_a_task_chain_passes_each_result_on_as_the_first_argument():
    jobs = chain(call(tasks.add, 1, 2), call(tasks.add, 10), call(tasks.echo))
    assert [j.state for j in jobs] == [State.PENDING, State.WAITING, State.WAITING]
    drain()
    last = Job.objects.get(id=jobs[2].id)
    assert last.state == State.COMPLETED and last.result == {"args": [13], "kwargs": {}}


def test_a_native_chain_passes_results_in_the_payload():
    a, b = chain({"kind": "add", "payload": {"a": 2, "b": 2}}, {"kind": "echo", "payload": {"x": 1}})
    drain()
    b.refresh_from_db()
    assert b.payload == {
        "x": 1,
        "dependencies": [{"id": a.id, "kind": "add", "state": "completed", "result": 4}],
    }


@st.composite
def dags(draw):
    n = draw(st.integers(min_value=1, max_value=8))
    edges = {
        i: sorted(draw(st.sets(st.integers(min_value=0, max_value=i - 1), max_size=3)) if i else [])
        for i in range(n)
    }
    # Names shuffled so the builder, not the order of adding, decides the enqueue order.
    order = draw(st.permutations(list(range(n))))
    return edges, order


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dags())
def test_generated_dags_run_every_node_once_in_an_order_that_respects_the_edges(dag):
    edges, order = dag
    Job.objects.all().delete()
    wf = Workflow()
    for node in order:
        wf.add(node, {"kind": "echo", "payload": {"node": node}}, after=edges[node])
    jobs = wf.enqueue()
    ran = drain()
    position = {job_id: i for i, job_id in enumerate(ran)}
    assert sorted(ran) == sorted(j.id for j in jobs.values())
    for node, ups in edges.items():
        for up in ups:
            assert position[jobs[up].id] < position[jobs[node].id]


def test_results_too_large_to_pass_on_wake_the_dependent_without_them(settings):
    _, b = chain({"kind": "echo", "payload": {"blob": "x" * 1950}}, {"kind": "echo", "payload": {"x": 1}})
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_PAYLOAD_BYTES": 2000}
    assert run_one().state == State.COMPLETED
    b.refresh_from_db()
    assert b.state == State.PENDING and b.payload == {"x": 1}
    (unblocked,) = [e for e in events(b) if e.type == "unblocked"]
    assert "payload" in unblocked.metadata["pass_error"]
