"""Pauses, concurrency limits (per kind and per key) and rate limits at claim time (flow.py), one process."""

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from queue_app import engines
from queue_app.core import flow, transitions
from queue_app.engines import rows
from queue_app.exceptions import InvalidJob
from queue_app.models import Job, KindLimit, Pause, State
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def claimed_kinds(jobs):
    return sorted(job.kind for job in jobs)


def test_paused_queue_keeps_its_jobs_pending_while_other_queues_lease():
    JobFactory.create_batch(3, queue_name="mail")
    other = JobFactory(queue_name="default")
    flow.pause(queue="mail", actor="ops", reason="provider down")
    jobs = transitions.claim("w1", limit=10)
    assert [j.id for j in jobs] == [other.id]
    assert Job.objects.filter(queue_name="mail", state=State.PENDING).count() == 3
    assert flow.resume(queue="mail") is True
    assert len(transitions.claim("w1", limit=10)) == 3


def test_paused_kind_is_never_leased_even_when_a_worker_asks_for_it():
    JobFactory.create_batch(2, kind="echo")
    flow.pause(kind="echo")
    assert transitions.claim("w1", limit=10, kinds=["echo"]) == []
    assert transitions.claim("w1", limit=10) == []
    flow.resume(kind="echo")
    assert len(transitions.claim("w1", limit=10, kinds=["echo"])) == 2


def test_pause_twice_is_one_row_and_resume_of_unpaused_says_so():
    assert flow.pause(kind="echo")[1] is True
    assert flow.pause(kind="echo")[1] is False
    assert Pause.objects.count() == 1
    assert flow.resume(queue="nothing") is False


@pytest.mark.parametrize("kwargs", [{}, {"queue": "a", "kind": "b"}, {"queue": "bad name"}])
def test_pause_refuses_unclear_targets_and_writes_nothing(kwargs):
    with pytest.raises(InvalidJob):
        flow.pause(**kwargs)
    assert not Pause.objects.exists()


def test_concurrency_limit_caps_leased_jobs_of_a_kind_and_the_rest_wait():
    flow.set_limit("echo", concurrency=2)
    JobFactory.create_batch(5, kind="echo")
    JobFactory.create_batch(3, kind="add")
    jobs = transitions.claim("w1", limit=10)
    assert claimed_kinds(jobs) == ["add"] * 3 + ["echo"] * 2
    assert transitions.claim("w2", limit=10) == []
    first = next(j for j in jobs if j.kind == "echo")
    transitions.complete(first.id, worker_id="w1", attempt=first.attempts)
    assert claimed_kinds(transitions.claim("w2", limit=10)) == ["echo"]
    assert Job.objects.filter(kind="echo", state=State.PENDING).count() == 2


def test_a_dead_workers_slot_frees_when_its_lease_is_recovered():
    flow.set_limit("echo", concurrency=1)
    lost = JobFactory(kind="echo", expired=True)
    waiting = JobFactory(kind="echo")
    assert transitions.claim("w2", limit=5) == []
    transitions.recover()
    got = transitions.claim("w2", limit=5)
    # The freed slot takes one job: the one that waited (recovery sets the lost one's
    # run_at to now, behind it).
    assert [j.id for j in got] == [waiting.id]
    assert list(Job.objects.filter(kind="echo", state=State.PENDING).values_list("id", flat=True)) == [
        lost.id
    ]


def test_rate_limit_caps_starts_per_window_then_opens_a_new_window():
    flow.set_limit("echo", rate_limit=3, rate_period=60)
    JobFactory.create_batch(8, kind="echo", created_at=timezone.now() - timedelta(seconds=5))
    now = timezone.now()
    first = transitions.claim("w1", limit=10, now=now)
    assert len(first) == 3
    for job in first:
        transitions.complete(job.id, worker_id="w1", attempt=job.attempts)
    # Finishing does not give starts back: the window counts starts, not running jobs.
    assert transitions.claim("w1", limit=10, now=now + timedelta(seconds=30)) == []
    assert len(transitions.claim("w1", limit=10, now=now + timedelta(seconds=61))) == 3
    row = KindLimit.objects.get(kind="echo")
    assert row.window_count == 3


def test_limited_kinds_are_not_starved_by_a_large_higher_priority_backlog():
    flow.set_limit("echo", concurrency=1)
    JobFactory.create_batch(20, kind="add", priority=50)
    JobFactory(kind="echo", priority=-50)
    jobs = transitions.claim("w1", limit=5)
    assert claimed_kinds(jobs) == ["add"] * 4 + ["echo"]


def test_a_worker_serving_only_limited_kinds_gets_them_within_the_limit():
    flow.set_limit("echo", concurrency=2)
    JobFactory.create_batch(4, kind="echo")
    JobFactory.create_batch(4, kind="add")
    assert claimed_kinds(transitions.claim("w1", limit=10, kinds=["echo"])) == ["echo"] * 2


def test_limits_respect_the_queues_a_worker_serves():
    flow.set_limit("echo", concurrency=5)
    JobFactory.create_batch(2, kind="echo", queue_name="other")
    JobFactory(kind="echo", queue_name="default")
    assert len(transitions.claim("w1", limit=10, queues=["default"])) == 1


def test_clearing_a_limit_lets_the_kind_run_freely_again():
    flow.set_limit("echo", concurrency=1)
    JobFactory.create_batch(3, kind="echo")
    assert len(transitions.claim("w1", limit=10)) == 1
    flow.set_limit("echo", concurrency=None)
    assert len(transitions.claim("w1", limit=10)) == 2


@pytest.mark.parametrize(
    "kwargs", [{"concurrency": 0}, {"rate_limit": -1}, {"rate_period": 0}, {"concurrency": "2"}]
)
def test_bad_limits_are_refused_and_nothing_is_written(kwargs):
    with pytest.raises(InvalidJob):
        flow.set_limit("echo", **kwargs)
    assert not KindLimit.objects.exists()


def test_limits_from_settings_are_synced_and_dropped_when_removed(settings):
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "LIMITS": {"echo": {"concurrency": 2}, "add": {"rate_limit": 5, "rate_period": 1}},
    }
    flow.sync_limits()
    assert {(r.kind, r.concurrency, r.rate_limit) for r in KindLimit.objects.all()} == {
        ("echo", 2, None),
        ("add", None, 5),
    }
    flow.set_limit("manual", concurrency=3)
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LIMITS": {"echo": {"concurrency": 4}}}
    flow.sync_limits()
    assert {(r.kind, r.concurrency) for r in KindLimit.objects.all()} == {("echo", 4), ("manual", 3)}


# --- per-key limits -----------------------------------------------------------------------


def claimed_keys(jobs):
    return sorted((job.concurrency_key or "-") for job in jobs)


def test_keys_at_their_limit_wait_while_other_keys_and_unkeyed_jobs_lease():
    flow.set_limit("echo", per_key=1)
    JobFactory(kind="echo", concurrency_key="a", leased=True)
    JobFactory(kind="echo", concurrency_key="b", leased=True)
    for key in ("a", "b", "c", None, None):
        JobFactory(kind="echo", concurrency_key=key)
    jobs = transitions.claim("w1", limit=10)
    assert claimed_keys(jobs) == ["-", "-", "c"]
    assert sorted(Job.objects.filter(state=State.PENDING).values_list("concurrency_key", flat=True)) == [
        "a",
        "b",
    ]


def test_jobs_without_a_key_are_not_held_by_per_key():
    flow.set_limit("echo", per_key=1)
    JobFactory.create_batch(5, kind="echo")
    assert len(transitions.claim("w1", limit=10)) == 5


def test_a_batch_claim_never_takes_more_than_per_key_of_one_key():
    flow.set_limit("echo", per_key=2)
    JobFactory(kind="echo", concurrency_key="a", leased=True)
    # Key a is first in line (highest priority): a batch must stop at its limit and
    # take the next best jobs of other keys instead.
    JobFactory.create_batch(4, kind="echo", concurrency_key="a", priority=10)
    JobFactory.create_batch(4, kind="echo", concurrency_key="b", priority=5)
    JobFactory.create_batch(4, kind="echo", concurrency_key="c")
    jobs = transitions.claim("w1", limit=10)
    assert claimed_keys(jobs) == ["a", "b", "b", "c", "c"]
    assert [j.priority for j in jobs] == [10, 5, 5, 0, 0]
    assert transitions.claim("w2", limit=10) == []


def test_keys_are_exact_strings_on_every_database():
    """MariaDB compares by collation ("A" = "a" = "a "); keys must not."""
    flow.set_limit("echo", per_key=1)
    JobFactory(kind="echo", concurrency_key="A", leased=True)
    for key in ("a", "a ", "A"):
        JobFactory(kind="echo", concurrency_key=key)
    assert flow.leased_per_key("echo") == {"A": 1}
    jobs = transitions.claim("w1", limit=10)
    assert claimed_keys(jobs) == ["a", "a "]  # "A" is at its limit; the others are other keys
    assert transitions.claim("w2", limit=10) == []


def test_per_key_and_concurrency_hold_together():
    flow.set_limit("echo", concurrency=3, per_key=1)
    for key in "abcd":
        JobFactory.create_batch(3, kind="echo", concurrency_key=key)
    jobs = transitions.claim("w1", limit=10)
    assert len(jobs) == 3 and len(set(claimed_keys(jobs))) == 3
    assert transitions.claim("w2", limit=10) == []


def test_a_keys_slot_frees_when_its_job_completes_or_its_lease_is_recovered():
    flow.set_limit("echo", per_key=1)
    lost = JobFactory(kind="echo", concurrency_key="a", expired=True)
    JobFactory.create_batch(2, kind="echo", concurrency_key="a")
    assert transitions.claim("w1", limit=5) == []
    transitions.recover()
    [job] = transitions.claim("w1", limit=5)
    assert job.concurrency_key == "a" and job.id != lost.id
    assert transitions.claim("w1", limit=5) == []
    transitions.complete(job.id, worker_id="w1", attempt=job.attempts)
    assert claimed_keys(transitions.claim("w1", limit=5)) == ["a"]


def test_reserve_locks_the_row_and_leased_per_key_counts_only_keyed_leased_jobs():
    flow.set_limit("echo", per_key=2)
    JobFactory.create_batch(2, kind="echo", concurrency_key="a", leased=True)
    JobFactory(kind="echo", concurrency_key="b", leased=True)
    JobFactory(kind="echo", leased=True)
    JobFactory(kind="echo", concurrency_key="c")
    JobFactory(kind="add", concurrency_key="a", leased=True)
    with transaction.atomic():
        row, free = flow.reserve("echo", 10, timezone.now())
    assert (row.per_key, free) == (2, 10)
    assert flow.leased_per_key("echo") == {"a": 2, "b": 1}


def test_exclude_keys_never_leaves_out_jobs_without_a_key():
    JobFactory(kind="echo", concurrency_key="a")
    JobFactory(kind="echo", concurrency_key="b")
    unkeyed = JobFactory(kind="echo")
    now = timezone.now()
    at_db = connection.ops.adapt_datetimefield_value(now)
    event = rows.event_params(connection, None, "claimed", at_db, None, "w1", "pending", "leased", "", {})
    with transaction.atomic():
        found = engines.of(connection).claim(
            owner="w1",
            limit=10,
            now=now,
            expires=now + timedelta(seconds=30),
            event=event,
            exclude_keys=["a"],
        )
    leased = Job.objects.filter(state=State.LEASED)
    assert len(found) == 2 and sorted(j.concurrency_key or "-" for j in leased) == ["-", "b"]
    assert leased.filter(id=unkeyed.id).exists()


def test_a_kind_with_only_per_key_set_is_a_limited_kind():
    flow.set_limit("echo", per_key=1)
    flow.set_limit("add", rate_period=30)
    assert flow.claim_gates()[1] == {"echo"}
    assert set(flow.active_limits()) == {"echo"}
    flow.set_limit("echo", per_key=None)
    assert flow.claim_gates()[1] == set()


@pytest.mark.parametrize("value", [0, -1, "1", 1.5, True])
def test_a_bad_per_key_is_refused_and_nothing_is_written(value):
    with pytest.raises(InvalidJob, match="per_key"):
        flow.set_limit("echo", per_key=value)
    assert not KindLimit.objects.exists()


def test_per_key_from_settings_is_synced(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LIMITS": {"echo": {"per_key": 1, "concurrency": 4}}}
    flow.sync_limits()
    assert KindLimit.objects.values_list("kind", "concurrency", "per_key").get() == ("echo", 4, 1)
