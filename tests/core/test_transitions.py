"""Every edge of the state machine, each with its event row checked."""

from datetime import timedelta

import pytest
from django.utils import timezone

from queue_app.core import aborting, transitions
from queue_app.exceptions import InvalidJob, InvalidTransition, JobNotFound
from queue_app.models import DeadLetter, Event, EventType, Job, State
from tests.factories import JobFactory
from tests.support import events, lapse, last_event

pytestmark = pytest.mark.django_db


def claim_one(worker="w1", **kw):
    jobs = transitions.claim(worker, limit=1, **kw)
    assert len(jobs) == 1
    return jobs[0]


def test_enqueue_writes_a_pending_job_and_one_enqueued_event(enqueue_job):
    job = enqueue_job("echo", {"x": 1}, priority=7, queue_name="mail")
    job.refresh_from_db()
    assert (job.state, job.priority, job.queue_name, job.payload) == ("pending", 7, "mail", {"x": 1})
    [event] = events(job)
    assert (event.type, event.to_state) == (EventType.ENQUEUED, State.PENDING)


def test_claim_leases_the_job_with_owner_deadline_attempt_and_event(enqueue_job):
    job = enqueue_job("echo", {})
    before = timezone.now()
    claimed = claim_one("w1", lease_seconds=30)
    assert claimed.id == job.id
    claimed.refresh_from_db()
    assert claimed.state == State.LEASED
    assert claimed.lease_owner == "w1"
    assert claimed.attempts == 1
    assert claimed.lease_expires_at >= before + timedelta(seconds=29)
    assert claimed.started_at is not None
    event = last_event(job)
    assert (event.type, event.from_state, event.to_state, event.attempt, event.worker) == (
        "claimed",
        "pending",
        "leased",
        1,
        "w1",
    )


def test_claim_returns_nothing_when_only_scheduled_jobs_exist():
    JobFactory(scheduled=True)
    assert transitions.claim("w1", limit=5) == []
    assert Event.objects.count() == 0


def test_complete_stores_result_and_appends_completed_event(enqueue_job):
    enqueue_job("echo", {})
    job = claim_one()
    assert transitions.complete(job.id, worker_id="w1", attempt=1, result={"ok": True}) is True
    job.refresh_from_db()
    assert (job.state, job.result, job.lease_owner, job.lease_expires_at) == (
        "completed",
        {"ok": True},
        None,
        None,
    )
    assert job.finished_at is not None
    assert [e.type for e in events(job)] == ["enqueued", "claimed", "completed"]


def test_fail_with_attempts_left_returns_job_to_pending_with_backoff(enqueue_job, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "BACKOFF_BASE": 2, "BACKOFF_JITTER": False}
    enqueue_job("echo", {}, max_attempts=3)
    job = claim_one()
    before = timezone.now()
    error = {"type": "Boom", "message": "bad", "traceback": "tb"}
    assert transitions.fail(job.id, worker_id="w1", attempt=1, error=error) == State.PENDING
    job.refresh_from_db()
    assert job.state == State.PENDING
    assert job.last_error == error
    assert before + timedelta(seconds=1.9) <= job.run_at <= timezone.now() + timedelta(seconds=2.1)
    event = last_event(job)
    assert (event.type, event.to_state, event.message) == ("failed", "pending", "bad")
    assert event.metadata["error"] == error
    assert job.status == "retrying"


def test_fail_dead_letters_job_after_last_attempt(enqueue_job):
    enqueue_job("echo", {"a": 1}, max_attempts=1)
    job = claim_one()
    error = {"type": "Boom", "message": "final", "traceback": ""}
    assert transitions.fail(job.id, worker_id="w1", attempt=1, error=error) == State.DEAD_LETTER
    job.refresh_from_db()
    assert job.state == State.DEAD_LETTER
    letter = DeadLetter.objects.get(job=job)
    assert (letter.attempts, letter.error, letter.payload, letter.resolved_at) == (1, error, {"a": 1}, None)
    event = last_event(job)
    assert (event.type, event.to_state) == ("dead_lettered", "dead_letter")
    assert Event.objects.filter(job_id=job.id).count() == 3


def test_fail_without_retry_dead_letters_even_with_attempts_left(enqueue_job):
    enqueue_job("echo", {}, max_attempts=5)
    job = claim_one()
    err = {"type": "X", "message": "m", "traceback": ""}
    assert transitions.fail(job.id, worker_id="w1", attempt=1, error=err, retry=False) == State.DEAD_LETTER
    assert DeadLetter.objects.get(job_id=job.id).reason == "not_retryable"


def test_release_gives_the_job_back_without_consuming_an_attempt(enqueue_job):
    enqueue_job("echo", {})
    job = claim_one()
    assert transitions.release(job.id, worker_id="w1", attempt=1) is True
    job.refresh_from_db()
    assert (job.state, job.attempts, job.lease_owner) == ("pending", 0, None)
    assert last_event(job).type == "released"


def test_release_orphans_gives_back_what_the_owner_does_not_know_it_holds_and_nothing_else(enqueue_job):
    for n in range(4):
        enqueue_job("echo", {"n": n})
    known, orphan = transitions.claim("w1/0.1", limit=2)
    other = transitions.claim("w1/0.2", limit=1)[0]  # the same worker's other child

    assert transitions.release_orphans("w1/0.1", keep={known.id}) == [orphan.id]

    rows = {j.id: j for j in Job.objects.all()}
    assert (rows[orphan.id].state, rows[orphan.id].attempts, rows[orphan.id].lease_owner) == (
        "pending",
        0,
        None,
    )
    assert last_event(rows[orphan.id]).type == "released"
    assert (rows[known.id].state, rows[known.id].lease_owner) == ("leased", "w1/0.1")
    assert (rows[other.id].state, rows[other.id].lease_owner) == ("leased", "w1/0.2")
    assert transitions.release_orphans("w1/0.1", keep={known.id}) == []


def test_renew_extends_only_this_workers_leases():
    mine = JobFactory(leased=True, lease_owner="w1")
    theirs = JobFactory(leased=True, lease_owner="w2")
    old = theirs.lease_expires_at
    assert transitions.renew([mine.id, theirs.id], worker_id="w1", lease_seconds=600) == {mine.id}
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert mine.lease_expires_at > timezone.now() + timedelta(seconds=500)
    assert theirs.lease_expires_at == old


def test_recover_returns_expired_lease_to_pending_and_consumes_the_attempt():
    job = JobFactory(expired=True, attempts=1, max_attempts=3)
    live = JobFactory(leased=True)
    assert transitions.recover() == [(job.id, State.PENDING)]
    job.refresh_from_db()
    live.refresh_from_db()
    assert (job.state, job.attempts, job.lease_owner) == ("pending", 1, None)
    assert live.state == State.LEASED
    event = last_event(job)
    assert (event.type, event.to_state, event.worker) == ("recovered", "pending", "worker-1")
    assert event.metadata["error"]["type"] == "LeaseExpired"


def test_recover_dead_letters_when_no_attempts_are_left():
    job = JobFactory(expired=True, attempts=3, max_attempts=3)
    assert transitions.recover() == [(job.id, State.DEAD_LETTER)]
    job.refresh_from_db()
    assert job.state == State.DEAD_LETTER
    assert DeadLetter.objects.get(job=job).reason == "lease_expired"
    assert [e.type for e in events(job)] == ["recovered"]


def test_recover_gives_back_the_attempt_of_a_job_never_seen_started_even_its_last():
    # Claimed, then lost with its whole worker before it started: the row never showed
    # the attempt running, so it is not spent (not even a max_attempts=1 job's only one).
    job = JobFactory(expired=True, attempts=1, max_attempts=1, started_attempt=None)

    assert transitions.recover() == [(job.id, State.PENDING)]

    job.refresh_from_db()
    assert (job.state, job.attempts, job.returned_attempts, job.lease_owner) == ("pending", 0, 1, None)
    event = last_event(job)
    assert (event.type, event.to_state, event.attempt) == ("recovered", "pending", 1)
    assert event.metadata["attempt_returned"] is True
    assert "never seen started" in event.message
    assert not DeadLetter.objects.filter(job=job).exists()


def test_recover_spends_the_attempt_an_earlier_renewal_saw_running():
    job = JobFactory(expired=True, attempts=2, max_attempts=2, started_attempt=1)
    transitions.renew([job.id], worker_id="worker-1", lease_seconds=-1, started={job.id: 2})

    assert transitions.recover() == [(job.id, State.DEAD_LETTER)]
    job.refresh_from_db()
    assert (job.attempts, job.started_attempt, job.returned_attempts) == (2, 2, None)
    assert "attempt_returned" not in last_event(job).metadata


def test_recover_gives_an_attempt_back_at_most_recovery_returns_times(settings):
    # A job that kills its whole worker as soon as it starts looks unstarted every time:
    # the bound makes it spend its attempts after RECOVERY_RETURNS give-backs.
    settings.JOBQUEUE = {"RECOVERY_RETURNS": 2}
    job = JobFactory(expired=True, attempts=1, max_attempts=1, started_attempt=None)
    outcomes = []
    for _ in range(3):
        Job.objects.filter(id=job.id).update(
            state=State.LEASED,
            attempts=1,
            lease_owner="worker-1",
            lease_expires_at=timezone.now() - timedelta(seconds=1),
        )
        outcomes += [to for _, to in transitions.recover()]

    assert outcomes == [State.PENDING, State.PENDING, State.DEAD_LETTER]
    job.refresh_from_db()
    assert (job.state, job.returned_attempts) == (State.DEAD_LETTER, 2)


def test_renew_marks_only_the_running_attempt_of_a_job_this_worker_holds():
    mine = JobFactory(leased=True, lease_owner="w1", attempts=3, started_attempt=2)
    stale = JobFactory(leased=True, lease_owner="w1", attempts=3, started_attempt=2)
    theirs = JobFactory(leased=True, lease_owner="w2", attempts=1, started_attempt=None)

    transitions.renew(
        [mine.id, stale.id, theirs.id],
        worker_id="w1",
        lease_seconds=60,
        started={mine.id: 3, stale.id: 2, theirs.id: 1},
    )

    marked = dict(Job.objects.values_list("id", "started_attempt"))
    assert marked == {mine.id: 3, stale.id: 2, theirs.id: None}


def test_mark_started_notes_a_given_up_jobs_attempt_for_recovery_to_spend():
    job = JobFactory(expired=True, attempts=1, max_attempts=2, started_attempt=None)

    transitions.mark_started({job.id: 1}, worker_id="worker-1")

    assert transitions.recover() == [(job.id, State.PENDING)]
    job.refresh_from_db()
    assert (job.attempts, job.returned_attempts) == (1, None)


def test_stale_worker_cannot_complete_after_its_lease_was_recovered(enqueue_job):
    enqueue_job("echo", {})
    job = claim_one("w1", lease_seconds=30)
    lapse(job)
    transitions.recover()
    again = claim_one("w2")
    assert again.id == job.id and again.attempts == 2
    before = list(Event.objects.values_list("id", flat=True))
    assert transitions.complete(job.id, worker_id="w1", attempt=1, result="stale") is False
    assert transitions.fail(job.id, worker_id="w1", attempt=1, error={"message": "x"}) is None
    assert transitions.release(job.id, worker_id="w1", attempt=1) is False
    again.refresh_from_db()
    assert (again.state, again.lease_owner, again.result) == ("leased", "w2", None)
    assert list(Event.objects.values_list("id", flat=True)) == before


def test_same_worker_reclaiming_cannot_settle_with_the_old_attempt_number(enqueue_job):
    enqueue_job("echo", {})
    job = claim_one("w1")
    lapse(job)
    transitions.recover()
    claim_one("w1")  # same worker id, attempt 2: the attempt number is the fencing token
    assert transitions.complete(job.id, worker_id="w1", attempt=1) is False
    assert transitions.complete(job.id, worker_id="w1", attempt=2) is True


def test_requeue_resets_attempts_replaces_payload_resolves_dead_letter_and_keeps_history(enqueue_job):
    enqueue_job("echo", {"bad": True}, max_attempts=1)
    job = claim_one()
    transitions.fail(job.id, worker_id="w1", attempt=1, error={"message": "x"})
    job = transitions.requeue(job.id, payload={"bad": False}, max_attempts=4, actor="ops")
    assert (job.state, job.attempts, job.max_attempts, job.payload) == ("pending", 0, 4, {"bad": False})
    letter = DeadLetter.objects.get(job=job)
    assert (letter.resolution, letter.payload) == ("requeued", {"bad": True})
    assert letter.resolved_at is not None
    event = last_event(job)
    assert (event.type, event.from_state, event.worker) == ("requeued", "dead_letter", "ops")
    assert event.metadata["previous_payload"] == {"bad": True}
    assert [e.type for e in events(job)] == ["enqueued", "claimed", "dead_lettered", "requeued"]


def test_requeue_refuses_a_completed_job_and_writes_nothing():
    job = JobFactory(state=State.COMPLETED)
    with pytest.raises(InvalidTransition, match="completed"):
        transitions.requeue(job.id)
    assert Event.objects.count() == 0


def test_requeue_with_a_bad_payload_writes_nothing():
    job = JobFactory(dead=True)
    with pytest.raises(InvalidJob, match="JSON"):
        transitions.requeue(job.id, payload={"when": object()})
    job.refresh_from_db()
    assert job.state == State.DEAD_LETTER
    assert Event.objects.count() == 0


def test_cancel_pending_job_releases_its_idempotency_key(enqueue_job):
    job = enqueue_job("echo", {}, idempotency_key="k1")
    transitions.cancel(job.id, actor="ops", reason="not needed")
    job.refresh_from_db()
    assert (job.state, job.idempotency_key) == ("cancelled", None)
    event = last_event(job)
    assert (event.type, event.message, event.metadata["idempotency_key"]) == ("cancelled", "not needed", "k1")
    assert enqueue_job("echo", {}, idempotency_key="k1").id != job.id


def test_cancel_of_a_leased_job_is_refused_and_writes_nothing(enqueue_job):
    enqueue_job("echo", {})
    job = claim_one("w1")
    with pytest.raises(InvalidTransition, match="leased"):
        transitions.cancel(job.id)
    job.refresh_from_db()
    assert (job.state, job.lease_owner) == (State.LEASED, "w1")
    assert [e.type for e in events(job)] == [EventType.ENQUEUED, EventType.CLAIMED]


def test_an_aborted_leased_job_fences_out_its_worker(enqueue_job):
    enqueue_job("echo", {})
    job = claim_one("w1")
    aborting.cancel(job.id)  # leased: its abort is requested
    assert transitions.abort(job.id, worker_id="w1", attempt=1, how="handler stopped") is True
    assert transitions.complete(job.id, worker_id="w1", attempt=1, result=1) is False
    job.refresh_from_db()
    assert (job.state, job.result) == ("cancelled", None)
    assert [e.type for e in events(job)] == [
        EventType.ENQUEUED,
        EventType.CLAIMED,
        EventType.ABORT_REQUESTED,
        EventType.CANCELLED,
    ]


def test_cancel_of_a_completed_job_is_refused():
    job = JobFactory(state=State.COMPLETED)
    with pytest.raises(InvalidTransition):
        transitions.cancel(job.id)


def test_cancel_of_a_missing_job_says_so():
    with pytest.raises(JobNotFound, match="999999"):
        transitions.cancel(999999)


def test_retry_now_makes_a_scheduled_job_ready_with_an_event():
    job = JobFactory(scheduled=True)
    assert transitions.claim("w1") == []
    transitions.retry_now(job.id, actor="ops")
    assert last_event(job).type == "rescheduled"
    assert claim_one().id == job.id


def test_change_priority_and_payload_write_their_events():
    job = JobFactory(priority=1, payload={"v": 1})
    transitions.change_priority(job.id, 50)
    transitions.change_payload(job.id, {"v": 2})
    job.refresh_from_db()
    assert (job.priority, job.payload) == (50, {"v": 2})
    prio, payload = events(job)
    assert (prio.type, prio.metadata) == ("priority_changed", {"from": 1, "to": 50})
    assert (payload.type, payload.metadata) == ("payload_changed", {"previous_payload": {"v": 1}})


def test_change_priority_out_of_range_is_refused_and_writes_nothing():
    job = JobFactory(priority=1)
    with pytest.raises(InvalidJob, match="out of range"):
        transitions.change_priority(job.id, 101)
    job.refresh_from_db()
    assert job.priority == 1
    assert Event.objects.count() == 0


def test_every_transition_of_a_full_life_appends_exactly_one_event(enqueue_job):
    job = enqueue_job("echo", {}, max_attempts=2)
    transitions.claim("w1")
    transitions.fail(job.id, worker_id="w1", attempt=1, error={"message": "1"}, retry_delay=0)
    transitions.claim("w1")
    transitions.fail(job.id, worker_id="w1", attempt=2, error={"message": "2"})
    transitions.requeue(job.id)
    transitions.claim("w1")
    transitions.complete(job.id, worker_id="w1", attempt=1)
    assert [e.type for e in events(job)] == [
        "enqueued",
        "claimed",
        "failed",
        "claimed",
        "dead_lettered",
        "requeued",
        "claimed",
        "completed",
    ]
    assert [e.attempt for e in events(job)] == [0, 1, 1, 2, 2, 0, 1, 1]


def test_complete_and_claim_appends_one_event_per_attempt_edge():
    """Acknowledging a batch as the next is claimed: one completed event per acknowledged
    attempt and one claimed event per new lease, each job's in order."""
    from queue_app import bulk_enqueue

    bulk_enqueue([{"kind": "noop", "payload": {"n": i}} for i in range(6)])
    first = transitions.claim("w1", limit=3)
    done, second = transitions.complete_and_claim(
        [(j.id, j.attempts, {"n": j.payload["n"]}, None) for j in first], "w1", limit=3
    )
    assert done == {j.id for j in first} and len(second) == 3
    for job in first:
        assert [(e.type, e.attempt) for e in events(job)] == [
            (EventType.ENQUEUED, 0),
            (EventType.CLAIMED, 1),
            (EventType.COMPLETED, 1),
        ]
    for job in second:
        assert [(e.type, e.attempt) for e in events(job)] == [(EventType.ENQUEUED, 0), (EventType.CLAIMED, 1)]
    assert Job.objects.get(id=first[0].id).result == {"n": first[0].payload["n"]}


def test_complete_and_claim_writes_no_event_when_the_claim_fails(monkeypatch):
    """One transaction: a claim that raises rolls back the acknowledgements made with it,
    and leaves no event behind (the worker then acknowledges them on their own)."""
    from queue_app import bulk_enqueue

    bulk_enqueue([{"kind": "noop", "payload": {}} for _ in range(4)])
    first = transitions.claim("w1", limit=2)
    before = Event.objects.count()

    def broken(*args, **kwargs):
        raise RuntimeError("claim failed")

    monkeypatch.setattr(transitions, "_claim", broken)
    with pytest.raises(RuntimeError):
        transitions.complete_and_claim([(j.id, j.attempts, None, None) for j in first], "w1", limit=2)
    assert Event.objects.count() == before
    assert set(Job.objects.filter(id__in=[j.id for j in first]).values_list("state", flat=True)) == {"leased"}
    monkeypatch.undo()
    done, _ = transitions.complete_and_claim([(j.id, j.attempts, None, None) for j in first], "w1", limit=2)
    assert done == {j.id for j in first}
    assert Event.objects.filter(type=EventType.COMPLETED).count() == 2
