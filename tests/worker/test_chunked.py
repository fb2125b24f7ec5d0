"""Chunked handlers (registry.chunking): several jobs of a kind in one handler call, each
job settling on its own. In this process through run_once() and execute(); then real
workers on every database: 100 jobs with per-job failures, a chunk's one deadline, an
abort of one member, and kill -9 in the middle of a chunk."""

import json
import os
import signal
import time
from pathlib import Path

import pytest
from django.tasks import task
from django.tasks.signals import task_finished, task_started

from queue_app import Snooze, bulk_enqueue, enqueue
from queue_app.core import aborting, transitions
from queue_app.handlers import registry
from queue_app.models import DeadLetter, Event, EventType, Job, State
from queue_app.worker import execution
from queue_app.worker import loop as worker
from queue_app.worker.slots import Slots
from tests.support import event_types
from tests.worker_support import join, run_worker, start_worker, stop, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

DONE = [EventType.ENQUEUED, EventType.CLAIMED, EventType.COMPLETED]


class Bounced(Exception):
    """One address the batch API refused."""


def recording(outcome):
    """A chunk handler that records each call's ``n``s and returns outcome(payload) per job."""
    calls = []

    def handle(payloads):
        calls.append([p["n"] for p in payloads])
        return [outcome(p) for p in payloads]

    return handle, calls


def numbered(kind, ns, **options):
    return bulk_enqueue([{"kind": kind, "payload": {"n": n}, **options} for n in ns])


def run_batch(batch):
    return dict(worker.run_once(worker.Options(batch=batch)))


# --- in this process ---------------------------------------------------------------------


def test_chunked_handler_gets_its_jobs_in_one_call_and_each_settles_on_its_own():
    handle, calls = recording(lambda p: Bounced(f"no {p['n']}") if p["n"] % 3 == 0 else {"sent": p["n"]})
    registry.register("mail", handle, chunk=5)
    jobs = numbered("mail", range(1, 6), max_attempts=2)

    outcomes = run_batch(5)

    assert calls == [[1, 2, 3, 4, 5]]
    assert [outcomes[j.id] for j in jobs] == ["completed", "completed", "pending", "completed", "completed"]
    for job in jobs:
        job.refresh_from_db()
        if job.payload["n"] == 3:
            # Its own failure, on its own retry path: the others are not touched by it.
            assert (job.state, job.attempts) == (State.PENDING, 1)
            assert event_types(job) == [EventType.ENQUEUED, EventType.CLAIMED, EventType.FAILED]
            assert job.last_error["type"].endswith("Bounced") and job.last_error["message"] == "no 3"
        else:
            assert (job.state, job.result) == (State.COMPLETED, {"sent": job.payload["n"]})
            assert event_types(job) == DONE


def test_chunks_hold_at_most_their_size_and_other_kinds_run_one_by_one_beside_them():
    handle, calls = recording(lambda p: p["n"])
    registry.register("mail", handle, chunk=3)
    mail = numbered("mail", range(7))
    other = enqueue("add", {"a": 1, "b": 2})

    outcomes = run_batch(8)

    assert calls == [[0, 1, 2], [3, 4, 5], [6]]
    assert {outcomes[j.id] for j in [*mail, other]} == {"completed"}
    assert Job.objects.get(id=other.id).result == 3


def test_a_dict_by_job_id_settles_each_job_and_one_it_leaves_out_fails():
    def by_id(payloads, jobs):
        return {job.id: payload["n"] * 10 for job, payload in zip(jobs, payloads) if payload["n"] != 2}

    registry.register("mail", by_id, chunk=3)
    jobs = numbered("mail", [1, 2, 3], max_attempts=1)

    run_batch(3)

    states = {j.payload["n"]: (j.state, j.result) for j in Job.objects.filter(id__in=[j.id for j in jobs])}
    assert states[1] == (State.COMPLETED, 10) and states[3] == (State.COMPLETED, 30)
    left_out = Job.objects.get(id=jobs[1].id)
    assert left_out.state == State.DEAD_LETTER
    assert left_out.last_error["type"].endswith("ChunkOutcomeError")
    assert f"no outcome for job {left_out.id}" in left_out.last_error["message"]


def test_a_handler_that_raises_fails_every_job_of_its_chunk_by_its_retry_policy():
    def down(payloads):
        raise ConnectionError("the mail API is down")

    registry.register("mail", down, chunk=4, discard_on=(ConnectionError,))
    jobs = numbered("mail", range(4), max_attempts=3)

    assert set(run_batch(4).values()) == {"dead_letter"}

    for job in Job.objects.filter(id__in=[j.id for j in jobs]):
        assert (job.state, job.attempts) == (State.DEAD_LETTER, 1)  # discard_on: no retry
        assert job.last_error["message"] == "the mail API is down"
        assert DeadLetter.objects.get(job=job).reason == "discarded: ConnectionError"
        # The handler's own traceback, not one grown by a frame per job it failed.
        assert job.last_error["traceback"].count('raise ConnectionError("the mail API is down")') == 1
        assert job.last_error["traceback"].count("settle_chunk") == 1


@pytest.mark.parametrize(
    ("returned", "completed"),
    [(None, True), ([1, 2], False), ("sent", False)],
    ids=["none-all-done", "wrong-length", "not-a-list"],
)
def test_a_chunk_returns_none_for_all_done_and_any_other_shape_fails_them_all(returned, completed):
    registry.register("mail", lambda payloads: returned, chunk=3)
    jobs = numbered("mail", range(3), max_attempts=1)

    run_batch(3)

    for job in Job.objects.filter(id__in=[j.id for j in jobs]):
        if completed:
            assert (job.state, job.result) == (State.COMPLETED, None)
        else:
            assert job.state == State.DEAD_LETTER
            assert job.last_error["type"].endswith("ChunkOutcomeError")


def test_one_unstorable_result_or_snooze_in_a_chunk_touches_only_its_own_job():
    def handle(payloads):
        return [object(), Snooze(60), "fine"]

    registry.register("mail", handle, chunk=3)
    bad, snoozed, fine = numbered("mail", range(3), max_attempts=3)

    run_batch(3)

    bad.refresh_from_db(), snoozed.refresh_from_db(), fine.refresh_from_db()
    assert (bad.state, bad.attempts) == (State.DEAD_LETTER, 1)  # the same value again: no retry
    assert snoozed.state == State.PENDING and event_types(snoozed)[-1] == EventType.SNOOZED
    assert (fine.state, fine.result) == (State.COMPLETED, "fine")


def test_what_a_chunk_prints_is_kept_on_each_of_its_jobs_events():
    def loud(payloads):
        print(f"sending {len(payloads)}")
        return [True] * len(payloads)

    registry.register("mail", loud, chunk=2)
    jobs = numbered("mail", range(2))

    run_batch(2)

    for job in jobs:
        event = Event.objects.get(job_id=job.id, type=EventType.COMPLETED)
        assert "sending 2" in json.dumps(event.metadata)


def test_a_job_of_a_chunked_kind_run_on_its_own_is_a_chunk_of_one():
    seen = []

    def handle(payloads, jobs):
        seen.append([job.id for job in jobs])
        return [Bounced("no") if p["n"] else "ok" for p in payloads]

    registry.register("mail", handle, chunk=10)
    ok, failing = numbered("mail", [0, 1], max_attempts=1)

    for job in transitions.claim("w/0.1", limit=2):
        execution.execute(job, "w/0.1")

    assert seen == [[ok.id], [failing.id]]
    assert Job.objects.get(id=ok.id).state == State.COMPLETED
    assert Job.objects.get(id=failing.id).state == State.DEAD_LETTER


def test_an_async_chunked_handler_is_awaited():
    async def handle(payloads):
        return [p["n"] + 1 for p in payloads]

    registry.register("mail", handle, chunk=2)
    jobs = numbered("mail", [1, 2])

    run_batch(2)

    assert [Job.objects.get(id=j.id).result for j in jobs] == [2, 3]


@task(chunk=4)
def send_all(results):
    """A chunked django.tasks function: it gets its jobs' TaskResults."""
    return [
        Bounced(r.kwargs["to"]) if r.kwargs["to"].startswith("bad") else r.kwargs["to"].upper()
        for r in results
    ]


def test_a_chunked_task_gets_its_jobs_task_results_and_each_finishes_on_its_own():
    started, finished = [], []
    on_start = lambda sender, task_result, **kw: started.append(task_result.id)  # noqa: E731
    on_finish = lambda sender, task_result, **kw: finished.append((task_result.id, task_result.status))  # noqa: E731
    task_started.connect(on_start)
    task_finished.connect(on_finish)
    try:
        results = [send_all.using(max_attempts=1).enqueue(to=to) for to in ("a@x", "bad@x", "c@x")]
        run_batch(3)
    finally:
        task_started.disconnect(on_start)
        task_finished.disconnect(on_finish)

    assert started == [r.id for r in results]
    assert dict(finished) == {
        results[0].id: "SUCCESSFUL",
        results[1].id: "FAILED",
        results[2].id: "SUCCESSFUL",
    }
    for r in results:
        r.refresh()
    assert [r.return_value for r in (results[0], results[2])] == ["A@X", "C@X"]
    assert results[1].errors[0].exception_class_path.endswith("Bounced")


def test_a_job_of_a_chunked_task_run_on_its_own_is_a_chunk_of_one():
    result = send_all.enqueue(to="b@x")
    (job,) = transitions.claim("w/0.1", limit=1)

    assert execution.execute(job, "w/0.1") == "completed"

    result.refresh()
    assert result.return_value == "B@X"


def test_slots_show_a_chunks_members_running_under_its_first_jobs_start_and_timeout():
    slots = Slots(threads=2, acks=4, buffered=4, chunk=2)
    slots.start(0, 7, 1, 0)
    slots.start_chunk(1, [(10, 1), (11, 2), (12, 1)], 5.0)

    running = {job_id: (attempt, timeout) for job_id, attempt, _, timeout in slots.running()}
    assert running == {7: (1, 0.0), 10: (1, 5.0), 11: (2, 5.0), 12: (1, 5.0)}
    assert slots.companions(11) == [(10, 1), (11, 2), (12, 1)] and slots.companions(7) == [(7, 1)]
    assert slots.held() == {7: 1, 10: 1, 11: 2, 12: 1}
    # The dashboard's thread column: a chunk's members run on its thread.
    assert slots.threads_running() == {7: 0, 10: 1, 11: 1, 12: 1}
    # An abort lands on the member's own cell, read by its own probe only.
    assert slots.request_abort(12)
    assert [slots.chunk_abort_requested(1, k, job_id) for k, job_id in enumerate([10, 11, 12])] == [
        False,
        False,
        True,
    ]
    assert slots.buffered() == []  # the chunk cells are not the buffer's

    slots.clear_chunk(1)
    assert [job_id for job_id, *_ in slots.running()] == [7]
    assert not slots.is_running(11)


def test_chunk_options_are_checked_where_they_are_written():
    with pytest.raises(TypeError, match="chunk must be a positive integer"):
        registry.register("mail", lambda payloads: None, chunk=0)
    with pytest.raises(TypeError, match="chunk_wait_ms needs chunk"):
        registry.handler("mail", chunk_wait_ms=10)
    with pytest.raises(TypeError, match="chunk_wait_ms must be"):
        registry.handler("mail", chunk=5, chunk_wait_ms=-1)
    with pytest.raises(TypeError, match="cannot take a context"):
        task(chunk=2, takes_context=True)(lambda context, results: None)
    assert registry.chunking("mail") is None


# --- real workers ---------------------------------------------------------------------------


def mail_api(payloads):
    """A batch API: one line per call (the ``n``s) in the payloads' ``path``; ``n`` a
    multiple of 7 bounces, ``stall`` (present on the first call only) sleeps a minute."""
    path = Path(payloads[0]["path"])
    with open(path, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "ns": [p["n"] for p in payloads]}) + "\n")
    stall = Path(payloads[0].get("stall", "/nonexistent"))
    if "stall" in payloads[0] and not stall.exists():
        stall.write_text("stalled")
        time.sleep(60)
    go = payloads[0].get("go")
    while go and not Path(go).exists():
        time.sleep(0.01)
    return [Bounced(f"bounced {p['n']}") if p["n"] % 7 == 0 else {"sent": p["n"]} for p in payloads]


def calls(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_workers_run_a_chunked_kind_in_chunks_with_each_jobs_outcome_and_events_exact(tmp_path):
    registry.register("mail", mail_api, chunk=10, chunk_wait_ms=100)
    path = str(tmp_path / "calls")
    jobs = bulk_enqueue(
        [{"kind": "mail", "payload": {"n": n, "path": path}, "max_attempts": 1} for n in range(1, 101)]
    )

    # Claims of 4 fill chunks of 10 (Loop._fill), in two processes at once.
    assert run_worker(within=60, burst=True, concurrency=2, batch=4) == 0

    made = [call["ns"] for call in calls(Path(path))]
    assert all(1 <= len(ns) <= 10 for ns in made)
    assert max(len(ns) for ns in made) == 10  # filled past the batch of 4
    assert sorted(n for ns in made for n in ns) == list(range(1, 101))  # each job in one call
    for job in Job.objects.filter(id__in=[j.id for j in jobs]):
        n = job.payload["n"]
        if n % 7 == 0:
            assert (job.state, job.attempts) == (State.DEAD_LETTER, 1)
            assert job.last_error["message"] == f"bounced {n}"
            assert event_types(job) == [EventType.ENQUEUED, EventType.CLAIMED, EventType.DEAD_LETTERED]
        else:
            assert (job.state, job.attempts, job.result) == (State.COMPLETED, 1, {"sent": n})
            assert event_types(job) == DONE
    # One claimed and one ending event per job, written under the one owner that ran it.
    for job_id, owners in _owners_by_job(jobs).items():
        assert len(owners) == 1, (job_id, owners)


def _owners_by_job(jobs):
    owners = {}
    for job_id, worker_id in Event.objects.filter(
        job_id__in=[j.id for j in jobs],
        type__in=[EventType.CLAIMED, EventType.COMPLETED, EventType.DEAD_LETTERED],
    ).values_list("job_id", "worker"):
        owners.setdefault(job_id, set()).add(worker_id)
    return owners


def test_a_chunk_has_one_deadline_and_every_job_of_it_fails_as_timed_out(tmp_path):
    registry.register("mail", mail_api, chunk=3)
    payload = {"path": str(tmp_path / "calls"), "stall": str(tmp_path / "stall")}
    # The chunk's deadline is the longest of its jobs' timeouts: 2 s for both.
    jobs = bulk_enqueue(
        [
            {"kind": "mail", "payload": {"n": n, **payload}, "timeout": timeout, "max_attempts": 1}
            for n, timeout in ((1, 1), (2, 2))
        ]
    )

    assert run_worker(within=30, burst=True, concurrency=1, batch=2) == 0

    assert len(calls(tmp_path / "calls")) == 1
    for job in Job.objects.filter(id__in=[j.id for j in jobs]):
        assert job.state == State.DEAD_LETTER
        assert job.last_error["type"] == "TimeoutError"
        assert "2s timeout" in job.last_error["message"]


def test_an_abort_of_one_job_in_a_running_chunk_cancels_it_when_the_call_returns(settings, tmp_path):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "ABORT_CHECK_INTERVAL": 0.05}
    registry.register("mail", mail_api, chunk=3)
    go = tmp_path / "go"
    path = tmp_path / "calls"
    jobs = numbered_with("mail", [1, 2, 3], path=str(path), go=str(go))
    proc = start_worker(concurrency=1, batch=3)
    wait_for(lambda: path.exists(), what="the chunk to start")

    aborting.cancel(jobs[1].id, reason="operator")
    # 120 looks of the supervisor (nothing outside the child shows its flag): it has
    # flagged the job by then; the handler is not killed, its call goes on.
    time.sleep(120 * 0.05)
    go.write_text("go")
    wait_for(
        lambda: (
            Job.objects.filter(
                id__in=[j.id for j in jobs], state__in=[State.COMPLETED, State.CANCELLED]
            ).count()
            == 3
        ),
        what="the chunk to settle",
    )
    assert stop(proc) == 0

    assert len(calls(path)) == 1
    states = [Job.objects.get(id=j.id).state for j in jobs]
    assert states == [State.COMPLETED, State.CANCELLED, State.COMPLETED]
    assert event_types(jobs[1])[-2:] == [EventType.ABORT_REQUESTED, EventType.CANCELLED]


def numbered_with(kind, ns, **payload):
    return bulk_enqueue([{"kind": kind, "payload": {"n": n, **payload}} for n in ns])


def test_a_child_killed_mid_chunk_loses_no_job_and_each_completes_once(tmp_path):
    registry.register("mail", mail_api, chunk=10)
    path, stall = tmp_path / "calls", tmp_path / "stall"
    jobs = bulk_enqueue(
        [
            {"kind": "mail", "payload": {"n": n, "path": str(path), "stall": str(stall)}, "backoff_base": 1}
            for n in (1, 2, 3, 4, 5, 6, 8, 9, 10, 11)  # none bounces
        ]
    )
    proc = start_worker(concurrency=1, batch=10)
    wait_for(lambda: stall.exists(), what="the chunk to start")
    child = calls(path)[0]["pid"]

    os.kill(child, signal.SIGKILL)  # kill -9 in the middle of the chunk

    wait_for(
        lambda: Job.objects.filter(id__in=[j.id for j in jobs], state=State.COMPLETED).count() == 10,
        timeout=20,
        what="the chunk's jobs to come back and complete",
    )
    assert stop(proc) == 0
    made = calls(path)
    assert [sorted(c["ns"]) for c in made[:1]] == [[1, 2, 3, 4, 5, 6, 8, 9, 10, 11]]
    assert sorted(n for c in made[1:] for n in c["ns"]) == [1, 2, 3, 4, 5, 6, 8, 9, 10, 11]
    for job in Job.objects.filter(id__in=[j.id for j in jobs]):
        assert job.attempts == 2
        assert event_types(job) == [
            EventType.ENQUEUED,
            EventType.CLAIMED,
            EventType.FAILED,  # the supervisor's: its process died running it
            EventType.CLAIMED,
            EventType.COMPLETED,
        ]
        failed = Event.objects.get(job_id=job.id, type=EventType.FAILED)
        assert "WorkerCrashed" in failed.message + json.dumps(failed.metadata)


def test_a_whole_worker_killed_mid_chunk_has_every_job_recovered_and_completed_once(tmp_path):
    registry.register("mail", mail_api, chunk=5)
    path, stall = tmp_path / "calls", tmp_path / "stall"
    jobs = numbered_with("mail", [1, 2, 3, 4, 5], path=str(path), stall=str(stall))
    proc = start_worker(name="doomed", lease=30.0, heartbeat=0.1, concurrency=1, batch=5)
    # A renewal saw every job of the chunk running, not only its first.
    wait_for(
        lambda: Job.objects.filter(id__in=[j.id for j in jobs], started_attempt=1).count() == 5,
        what="a renewal to see the chunk's jobs running",
    )

    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    assert len(transitions.recover(owned_by="doomed/")) == 5
    assert join(start_worker(name="after", burst=True, batch=5), 30) == 0

    assert [sorted(c["ns"]) for c in calls(path)] == [[1, 2, 3, 4, 5], [1, 2, 3, 4, 5]]
    for job in Job.objects.filter(id__in=[j.id for j in jobs]):
        assert (job.state, job.attempts) == (State.COMPLETED, 2)
        assert event_types(job) == [
            EventType.ENQUEUED,
            EventType.CLAIMED,
            EventType.RECOVERED,
            EventType.CLAIMED,
            EventType.COMPLETED,
        ]
