"""Debounce: enqueues sharing a debounce_key while its job is pending and never leased
update that job (run_at pushed, capped by max_wait; the newest or the first payload)
instead of inserting one, each with a debounced event; race-free through the key's row."""

import itertools
import multiprocessing
import threading
import time
from datetime import datetime, timedelta

import pytest
from django.db import connections, transaction
from django.utils import timezone

from queue_app import bulk_enqueue, enqueue
from queue_app.core import transitions
from queue_app.exceptions import InvalidJob
from queue_app.models import AdmissionKey, Event, Job, State
from tests.conftest import run_processes
from tests.support import event_types


def age(job, seconds):
    """Move ``job``'s first enqueue ``seconds`` into the past."""
    Job.objects.filter(id=job.id).update(created_at=timezone.now() - timedelta(seconds=seconds))


@pytest.mark.django_db
def test_a_second_enqueue_updates_the_pending_job_with_the_newest_payload_and_a_later_run_at():
    before = timezone.now()
    first = enqueue("echo", {"n": 1}, debounce_key="sync:42", debounce_for=30)
    assert first.was_created and first.run_at >= before + timedelta(seconds=30)
    time.sleep(0.01)
    again = enqueue("echo", {"n": 2}, debounce_key="sync:42", debounce_for=30)
    assert again.id == first.id and again.was_created is False
    job = Job.objects.get()
    assert job.payload == {"n": 2} and job.run_at == again.run_at and job.run_at > first.run_at
    assert event_types(job) == ["enqueued", "debounced"]
    event = Event.objects.get(job_id=job.id, type="debounced")
    assert event.from_state == event.to_state == State.PENDING
    assert event.metadata["old_run_at"] == first.run_at.isoformat()
    assert event.metadata["new_run_at"] == job.run_at.isoformat()
    assert event.metadata["payload_replaced"] is True and event.metadata["capped"] is False


@pytest.mark.django_db
def test_keep_mode_keeps_the_first_payload_and_still_pushes_run_at():
    first = enqueue("echo", {"n": 1}, debounce_key="k", debounce_for="1m", debounce_mode="keep")
    time.sleep(0.01)
    enqueue("echo", {"n": 2}, debounce_key="k", debounce_for="1m", debounce_mode="keep")
    job = Job.objects.get()
    assert job.payload == {"n": 1} and job.run_at > first.run_at
    assert Event.objects.get(type="debounced").metadata["payload_replaced"] is False


@pytest.mark.django_db
def test_max_wait_caps_run_at_at_the_first_enqueue_plus_max_wait():
    first = enqueue("echo", {}, debounce_key="k", debounce_for=60, debounce_max_wait=100)
    age(first, 90)
    job = enqueue("echo", {}, debounce_key="k", debounce_for=60, debounce_max_wait=100)
    created = Job.objects.get().created_at
    assert job.run_at == created + timedelta(seconds=100) == Job.objects.get().run_at
    assert Event.objects.get(type="debounced").metadata["capped"] is True
    # Past the cap the job is due now: a steady stream still runs.
    age(first, 200)
    job = enqueue("echo", {}, debounce_key="k", debounce_for=60, debounce_max_wait=100)
    assert job.run_at <= timezone.now() and Job.objects.ready().filter(id=job.id).exists()


@pytest.mark.django_db
def test_once_the_job_is_leased_the_next_enqueue_with_the_key_creates_a_new_job():
    first = enqueue("echo", {"n": 1}, debounce_key="k", debounce_for=0.001)
    time.sleep(0.01)
    (claimed,) = transitions.claim("w", limit=1)
    assert claimed.id == first.id
    second = enqueue("echo", {"n": 2}, debounce_key="k", debounce_for=30)
    assert second.was_created and second.id != first.id
    assert Job.objects.get(id=first.id).payload == {"n": 1}
    assert AdmissionKey.objects.get(id="debounce:k").job_id == second.id
    # A job that was leased and went back to pending (a retry) is not debounced either.
    transitions.fail(first.id, worker_id="w", attempt=claimed.attempts, error={"message": "no"})
    assert Job.objects.get(id=first.id).state == State.PENDING
    third = enqueue("echo", {"n": 3}, debounce_key="k", debounce_for=30)
    assert third.id == second.id and Job.objects.count() == 2


@pytest.mark.django_db
def test_an_ended_job_gives_its_key_to_a_new_job():
    first = enqueue("echo", {}, debounce_key="k", debounce_for=30)
    transitions.cancel(first.id)
    assert enqueue("echo", {}, debounce_key="k", debounce_for=30).id != first.id


@pytest.mark.django_db
def test_different_keys_and_a_debounce_key_equal_to_a_unique_key_do_not_meet():
    a = enqueue("echo", {}, debounce_key="a", debounce_for=30)
    b = enqueue("echo", {}, debounce_key="b", debounce_for=30)
    c = enqueue("echo", {}, unique_key="a")
    assert len({a.id, b.id, c.id}) == 3


@pytest.mark.django_db
def test_a_key_of_the_full_length_is_taken_and_the_key_table_passes_every_databases_checks():
    from django.core import checks

    assert enqueue("echo", {}, debounce_key="k" * 240, debounce_for=30).was_created
    assert enqueue("echo", {}, unique_key="k" * 240).was_created
    found = checks.run_checks(databases=["default"])
    assert not [m for m in found if "AdmissionKey" in str(m.obj)]


@pytest.mark.django_db
def test_keys_are_exact_strings_on_every_database():
    jobs = [enqueue("echo", {}, debounce_key=k, debounce_for=30) for k in ("Key", "key", "key ")]
    assert len({j.id for j in jobs}) == 3


@pytest.mark.django_db(transaction=True)
def test_a_claim_holding_the_job_makes_a_racing_debounce_wait_then_start_a_new_job(vendor):
    if vendor == "sqlite":
        pytest.skip("SQLite serialises writers with the database lock; there are no row locks to race")
    first = enqueue("echo", {"n": 1}, debounce_key="k", debounce_for=0.001)
    time.sleep(0.01)
    claimed, done = threading.Event(), {}

    def debounce():
        claimed.wait(10)
        try:
            done["job"] = enqueue("echo", {"n": 2}, debounce_key="k", debounce_for=30)
        finally:
            connections.close_all()

    racer = threading.Thread(target=debounce)
    racer.start()
    with transaction.atomic():
        (job,) = transitions.claim("w", limit=1)
        claimed.set()
        time.sleep(0.5)  # the debounce waits on the job's row lock meanwhile
        assert "job" not in done
    racer.join(10)
    assert done["job"].was_created and done["job"].id != job.id == first.id
    assert Job.objects.get(id=first.id).payload == {"n": 1}
    assert not Event.objects.filter(type="debounced").exists()


@pytest.mark.django_db
def test_bulk_enqueue_debounces_within_the_batch_and_against_earlier_jobs():
    first = enqueue("echo", {"n": 0}, debounce_key="k", debounce_for=30)
    jobs = bulk_enqueue(
        [{"kind": "echo", "payload": {"n": i}, "debounce_key": "k", "debounce_for": 30} for i in (1, 2)]
        + [{"kind": "echo", "payload": {"n": 3}}]
    )
    assert [j.id for j in jobs[:2]] == [first.id, first.id] and jobs[2].id != first.id
    assert Job.objects.get(id=first.id).payload == {"n": 2}
    assert Event.objects.filter(type="debounced").count() == 2


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"debounce_key": "k"}, "debounce_for"),
        ({"debounce_for": 30}, "debounce_for"),
        ({"debounce_key": "k", "debounce_for": 0}, "debounce_for"),
        ({"debounce_key": "k", "debounce_for": "soon"}, "debounce_for"),
        ({"debounce_key": "k", "debounce_for": 30, "debounce_mode": "merge"}, "debounce_mode"),
        ({"debounce_key": "k", "debounce_for": 30, "debounce_max_wait": -1}, "debounce_max_wait"),
        ({"debounce_key": "", "debounce_for": 30}, "debounce_key"),
        ({"debounce_key": "k" * 241, "debounce_for": 30}, "debounce_key"),
        ({"debounce_key": "k", "debounce_for": 30, "run_after": 5}, "debounce_key"),
        ({"debounce_key": "k", "debounce_for": 30, "idempotency_key": "i"}, "debounce_key"),
        ({"debounce_key": "k", "debounce_for": 30, "unique_key": "u"}, "unique_key"),
    ],
)
def test_bad_debounce_options_are_refused_and_nothing_is_written(options, field):
    with pytest.raises(InvalidJob) as exc:
        enqueue("echo", {}, **options)
    assert exc.value.field == field
    assert not Job.objects.exists() and not AdmissionKey.objects.exists()


@pytest.mark.django_db
def test_a_bad_entry_in_a_batch_writes_no_key_row():
    with pytest.raises(InvalidJob):
        bulk_enqueue(
            [
                {"kind": "echo", "debounce_key": "k", "debounce_for": 30},
                {"kind": "echo", "debounce_key": "k", "debounce_for": -1},
            ]
        )
    assert not Job.objects.exists() and not AdmissionKey.objects.exists()


PROCESSES = 8
ROUNDS = 6


def _debounce_rounds(barrier, n, out):
    for r in range(ROUNDS):
        barrier.wait(timeout=60)
        job = enqueue(
            "echo",
            {"process": n, "round": r},
            debounce_key="burst",
            debounce_for=2,
            debounce_max_wait=3,
        )
        out.put(job.id)
        time.sleep(0.3)


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_eight_processes_debouncing_one_key_at_once_make_one_job_with_the_last_payload():
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(PROCESSES)
    out = ctx.SimpleQueue()  # writes synchronously: children leave with os._exit
    codes = run_processes(_debounce_rounds, [(barrier, n, out) for n in range(PROCESSES)])
    assert codes == [0] * PROCESSES
    ids = {out.get() for _ in range(PROCESSES * ROUNDS)}
    job = Job.objects.get()
    assert ids == {job.id}
    # One insert, every other enqueue a debounce: none lost, none doubled.
    assert event_types(job).count("enqueued") == 1
    debounced = list(Event.objects.filter(job_id=job.id, type="debounced").order_by("id"))
    assert len(debounced) == PROCESSES * ROUNDS - 1
    # Each debounce saw the run_at the one before it wrote: they took turns.
    for before, after in itertools.pairwise(debounced):
        assert after.metadata["old_run_at"] == before.metadata["new_run_at"]
    # And none moved run_at back.
    for e in debounced:
        assert e.metadata["new_run_at"] >= e.metadata["old_run_at"]
    # The newest payload won: one of the last round's (each round starts once every
    # process has finished the one before).
    assert job.payload["round"] == ROUNDS - 1
    # Pushed past the first run_at, then capped at the first enqueue + max_wait.
    first_run_at = datetime.fromisoformat(debounced[0].metadata["old_run_at"])
    assert datetime.fromisoformat(debounced[0].metadata["new_run_at"]) > first_run_at
    # (or, for a debounce that came after the cap, its own time: due now, never earlier).
    assert job.run_at == max(job.created_at + timedelta(seconds=3), debounced[-1].at)
    assert debounced[-1].metadata["capped"] is True


@pytest.mark.django_db
@pytest.mark.parametrize("key", [{"debounce_key": "k", "debounce_for": 5}, {"unique_key": "k"}])
def test_a_key_does_not_go_with_depends_on_and_nothing_is_written(key):
    upstream = enqueue("echo", {})
    before = Job.objects.count()
    with pytest.raises(InvalidJob, match="does not go with depends_on"):
        enqueue("echo", {}, depends_on=[upstream.id], **key)
    assert Job.objects.count() == before
