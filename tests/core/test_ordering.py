"""Lease order: priority, tie-breakers, scheduling and aging, checked against the
plain-Python model in queue_app.core.ordering, on each database's real claim query."""

from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from queue_app.core import ordering, transitions
from queue_app.models import Job
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def drain(now, aging=0, **kw):
    """Claim one job at a time (so the database, not Python, picks each) until none is ready."""
    out = []
    while jobs := transitions.claim("w", limit=1, now=now, aging=aging, **kw):
        out.append(jobs[0].id)
    return out


def test_higher_priority_leases_first():
    now = timezone.now()
    low = JobFactory(priority=-5, created_at=now - timedelta(seconds=3))
    mid = JobFactory(priority=0, created_at=now - timedelta(seconds=2))
    high = JobFactory(priority=20, created_at=now - timedelta(seconds=1))
    assert drain(now) == [high.id, mid.id, low.id]


def test_equal_priority_ties_break_on_run_at_then_created_at_then_id():
    now = timezone.now()
    t = now - timedelta(minutes=1)
    late_ready = JobFactory(created_at=t - timedelta(seconds=9), run_at=t)
    early_ready = JobFactory(created_at=t, run_at=t - timedelta(seconds=5))
    same_a = JobFactory(created_at=t - timedelta(seconds=20), run_at=t - timedelta(seconds=1))
    same_b = JobFactory(created_at=t - timedelta(seconds=20), run_at=t - timedelta(seconds=1))
    assert drain(now) == [early_ready.id, same_a.id, same_b.id, late_ready.id]


def test_scheduled_job_is_invisible_until_run_at_passes():
    now = timezone.now()
    job = JobFactory(priority=100, run_at=now + timedelta(seconds=10))
    assert drain(now) == []
    assert drain(now + timedelta(seconds=10)) == [job.id]


def test_low_priority_job_overtakes_fresher_high_priority_one_after_enough_aging_intervals():
    now = timezone.now()
    old_low = JobFactory(
        priority=0, created_at=now - timedelta(seconds=60), run_at=now - timedelta(seconds=60)
    )
    fresh_high = JobFactory(priority=5, created_at=now, run_at=now)
    # 60s waited at 15s per point = +4: not yet past priority 5.
    assert transitions.claim("w", limit=1, now=now, aging=15)[0].id == fresh_high.id
    Job.objects.update(state="pending", lease_owner=None, lease_expires_at=None, attempts=0)
    # At 10s per point it has earned +6 and overtakes.
    assert transitions.claim("w", limit=1, now=now, aging=10)[0].id == old_low.id


def test_aging_off_keeps_strict_priority():
    now = timezone.now()
    JobFactory(priority=0, created_at=now - timedelta(days=1), run_at=now - timedelta(days=1))
    high = JobFactory(priority=1, created_at=now, run_at=now)
    assert transitions.claim("w", limit=1, now=now, aging=0)[0].id == high.id


def test_scheduled_job_starts_aging_only_when_its_run_at_passes():
    now = timezone.now()
    # Created long ago but only ready 5s ago: earns nothing at a 10s interval.
    scheduled = JobFactory(priority=0, created_at=now - timedelta(hours=1), run_at=now - timedelta(seconds=5))
    other = JobFactory(priority=1, created_at=now, run_at=now)
    assert drain(now, aging=10) == [other.id, scheduled.id]


def test_claim_serves_only_the_named_queues_and_kinds():
    now = timezone.now()
    a = JobFactory(queue_name="a", priority=1)
    b = JobFactory(queue_name="b", priority=5)
    c = JobFactory(queue_name="c", kind="add", priority=9)
    assert drain(now + timedelta(seconds=1), queues=["a", "b"]) == [b.id, a.id]
    assert drain(now + timedelta(seconds=1), kinds=["echo"]) == []
    assert drain(now + timedelta(seconds=1), queues=["*"], kinds=["add"]) == [c.id]


def test_batch_claim_takes_the_top_n_in_order():
    now = timezone.now()
    jobs = [
        JobFactory(priority=p, created_at=now - timedelta(seconds=i))
        for i, p in enumerate([1, 9, 3, 9, -2, 0])
    ]
    got = transitions.claim("w", limit=3, now=now + timedelta(seconds=1), aging=0)
    expected = ordering.lease_order(jobs, now + timedelta(seconds=1), 0)[:3]
    assert [j.id for j in got] == [j.id for j in expected]


offsets_ms = st.sampled_from([0, 1, 999, 1000, 1001, 15_000, 29_999, 30_000, 60_000, 300_000])
job_specs = st.lists(
    st.tuples(
        st.sampled_from([-100, -1, 0, 0, 1, 2, 100]),  # priority (few levels, many ties)
        offsets_ms,  # how long ago it became ready (run_at), ms
        offsets_ms,  # how much earlier than run_at it was created, ms
        st.booleans(),  # scheduled in the future instead
    ),
    min_size=1,
    max_size=10,
)


@hsettings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(specs=job_specs, aging=st.sampled_from([0, 1, 15, 30]))
def test_database_lease_order_matches_the_python_model(specs, aging):
    Job.objects.all().delete()
    now = timezone.now().replace(microsecond=500_000)
    jobs = []
    for priority, ready_ms, created_ms, future in specs:
        run_at = (
            now + timedelta(milliseconds=ready_ms + 1) if future else now - timedelta(milliseconds=ready_ms)
        )
        jobs.append(
            JobFactory(
                priority=priority, run_at=run_at, created_at=run_at - timedelta(milliseconds=created_ms)
            )
        )
    expected = [j.id for j in ordering.lease_order(jobs, now, aging)]
    # One at a time, the claim query's own order must be the model's.
    assert drain(now, aging=aging) == expected
