"""An attempt span's outcome is what settling the job recorded: a success the worker
acknowledges later, in a batch, says "completed" only if that acknowledgement committed
its completion, and "lost" if the fence refused it. Loop in this process, the SDK's
in-memory exporter (the ``spans`` fixture)."""

import multiprocessing

import pytest
from opentelemetry import trace

from queue_app import enqueue
from queue_app.core import transitions
from queue_app.handlers import registry
from queue_app.models import Job, State
from queue_app.worker import loop as worker
from queue_app.worker.slots import Budget, Slots
from tests.support import lapse

# Loop closes its thread's connection when it ends: no test-wide transaction to roll back.
pytestmark = pytest.mark.django_db(transaction=True)

THIEF = "thief/0.1"


def _steal(job):
    """Take ``job``'s lease from under its worker: recovered, then claimed by THIEF, as
    when its worker stalled past the lease and another one picked the job up."""
    lapse(job)
    transitions.recover()
    (taken,) = transitions.claim(THIEF, kinds=[job.kind])
    assert taken.id == job.id


def _run_loop(monkeypatch, batch):
    # Loop.run() sets a child's signal handlers: keep pytest's own.
    monkeypatch.setattr(worker.signal, "signal", lambda *args: None)
    options = worker.Options(batch=batch, burst=True, concurrency=1, threads=1, poll=0.01).resolved()
    slots = Slots(1, 2 * (batch + 1), buffered=2 * batch, chunk=batch)
    worker.Loop(options, "in-process/0.1", slots, Budget(multiprocessing.get_context("fork"), None)).run()


def _runs(spans):
    return {
        s.attributes["queue_app.job_id"]: s for s in spans.get_finished_spans() if s.name.startswith("run ")
    }


# batch 1: the acknowledgement rides on the next claim (complete_and_claim); batch 2: the
# next job's timeout flushes it first, on its own (complete_many).
@pytest.mark.parametrize("batch", [1, 2])
def test_a_success_whose_lease_was_taken_before_its_acknowledgement_ends_its_span_lost(
    spans, monkeypatch, batch
):
    registry.register("stolen", lambda payload, job: _steal(job))
    stolen = enqueue("stolen")
    other = enqueue("echo", timeout=30)

    _run_loop(monkeypatch, batch)

    assert Job.objects.get(id=stolen.id).lease_owner == THIEF  # its completion was refused
    assert Job.objects.get(id=other.id).state == State.COMPLETED
    runs = _runs(spans)
    assert runs[stolen.id].attributes["queue_app.outcome"] == "lost"
    assert runs[other.id].attributes["queue_app.outcome"] == "completed"
    for span in runs.values():
        # The handler's run time, whenever the acknowledgement came.
        assert 0 <= span.attributes["queue_app.run_seconds"] <= (span.end_time - span.start_time) / 1e9
        assert span.status.status_code == trace.StatusCode.UNSET


def test_a_success_whose_acknowledgement_fails_ends_its_span_with_that_error_and_no_outcome(
    spans, monkeypatch
):
    first = enqueue("echo")
    real = transitions.complete_many

    def unanswered(done, **kwargs):
        if any(job_id == first.id for job_id, *_ in done):
            raise RuntimeError("injected: the acknowledgement fails")
        return real(done, **kwargs)

    monkeypatch.setattr(transitions, "complete_many", unanswered)
    second = enqueue("echo", timeout=30)  # its timeout flushes the first's acknowledgement

    _run_loop(monkeypatch, 2)

    # Neither completed nor known lost (the commit may have happened, its answer not):
    # left leased, marked run, for recovery.
    assert Job.objects.get(id=first.id).state == State.LEASED
    run = _runs(spans)[first.id]
    assert "queue_app.outcome" not in run.attributes
    assert run.attributes["queue_app.run_seconds"] >= 0
    assert run.status.status_code == trace.StatusCode.ERROR
    assert run.status.description == "RuntimeError: injected: the acknowledgement fails"
    assert [e.name for e in run.events] == ["exception"]
    assert _runs(spans)[second.id].attributes["queue_app.outcome"] == "completed"


def test_a_chunk_member_whose_lease_was_taken_before_its_acknowledgement_ends_its_span_lost(
    spans, monkeypatch
):
    def handle(payloads, jobs):
        _steal(jobs[1])
        return [p["n"] for p in payloads]

    registry.register("mail", handle, chunk=3)
    jobs = [enqueue("mail", {"n": n}) for n in range(3)]

    _run_loop(monkeypatch, 3)

    assert Job.objects.get(id=jobs[1].id).lease_owner == THIEF
    runs = _runs(spans)
    assert [runs[job.id].attributes["queue_app.outcome"] for job in jobs] == [
        "completed",
        "lost",
        "completed",
    ]


def test_a_chunk_member_completed_before_another_members_settle_failed_keeps_completed(spans, monkeypatch):
    from queue_app.worker import execution

    class Bounced(Exception):
        pass

    def unrecorded(*args, **kwargs):
        raise RuntimeError("injected: recording the failure fails")

    registry.register(
        "mail", lambda payloads: [Bounced("no") if p["n"] else p["n"] for p in payloads], chunk=2
    )
    sent, bounced = (enqueue("mail", {"n": n}) for n in range(2))
    monkeypatch.setattr(execution, "settle_failure", unrecorded)

    with pytest.raises(RuntimeError, match="recording the failure"):
        worker.run_once(worker.Options(batch=2), worker_id="w-chunk")

    assert Job.objects.get(id=sent.id).state == State.COMPLETED
    runs = _runs(spans)
    assert runs[sent.id].attributes["queue_app.outcome"] == "completed"
    assert runs[sent.id].status.status_code == trace.StatusCode.UNSET
    assert "queue_app.outcome" not in runs[bounced.id].attributes
    assert runs[bounced.id].status.description == "RuntimeError: injected: recording the failure fails"
