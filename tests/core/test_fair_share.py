"""Fair share between tenants (flow.py, Fair share): a fair kind's concurrency keys are
leased round-robin, one job per tenant per round, resuming where the last claim stopped."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from queue_app import bulk_enqueue, enqueue
from queue_app.core import flow, transitions
from queue_app.exceptions import InvalidJob
from queue_app.models import Event, EventType, Job, KindLimit, State
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def keys(jobs):
    return sorted((j.concurrency_key or "-") for j in jobs)


def test_a_single_job_of_one_tenant_is_in_the_first_batch_behind_another_tenants_50000():
    flow.set_limit("echo", fair=True)
    bulk_enqueue([{"kind": "echo", "concurrency_key": "big"}] * 50_000)
    small = enqueue("echo", concurrency_key="small")
    jobs = transitions.claim("w1", limit=10, now=timezone.now() + timedelta(seconds=1))
    assert len(jobs) == 10
    assert small.pk in {j.id for j in jobs}
    assert keys(jobs) == ["big"] * 9 + ["small"]
    assert Job.objects.get(pk=small.pk).state == State.LEASED
    # The claimed event, as every claim writes it.
    assert Event.objects.filter(job_id=small.pk, type=EventType.CLAIMED, attempt=1).count() == 1


def test_without_fair_the_single_job_waits_behind_the_burst():
    # The control: the test above fails without fair (the same seed, the usual order).
    bulk_enqueue([{"kind": "echo", "concurrency_key": "big"}] * 50)
    small = enqueue("echo", concurrency_key="small")
    jobs = transitions.claim("w1", limit=10, now=timezone.now() + timedelta(seconds=1))
    assert small.pk not in {j.id for j in jobs}


def test_batches_smaller_than_the_tenants_go_round_the_cycle_and_resume_where_they_stopped():
    flow.set_limit("echo", fair=True)
    for key in ("a", "b", "c", None):
        JobFactory.create_batch(3, kind="echo", concurrency_key=key)
    later = timezone.now() + timedelta(seconds=1)
    served = [keys(transitions.claim("w1", limit=3, now=later)) for _ in range(4)]
    # The cycle: the keyless jobs, then the keys in order; each claim resumes after the
    # tenant the previous one served last.
    assert served == [["-", "a", "b"], ["-", "a", "c"], ["-", "b", "c"], ["a", "b", "c"]]
    assert KindLimit.objects.get(kind="echo").fair_after == "c"


def test_a_batch_larger_than_the_tenants_takes_them_in_rounds():
    flow.set_limit("echo", fair=True)
    JobFactory.create_batch(10, kind="echo", concurrency_key="a")
    JobFactory.create_batch(2, kind="echo", concurrency_key="b")
    later = timezone.now() + timedelta(seconds=1)
    # Rounds a b, a b, then a alone: b has no more.
    assert keys(transitions.claim("w1", limit=6, now=later)) == ["a"] * 4 + ["b"] * 2


def test_priority_and_age_still_order_each_tenants_own_jobs():
    flow.set_limit("echo", fair=True)
    now = timezone.now()
    low_old = JobFactory(kind="echo", concurrency_key="a", priority=0, run_at=now - timedelta(hours=1))
    high = JobFactory(kind="echo", concurrency_key="a", priority=5, run_at=now)
    other = JobFactory(kind="echo", concurrency_key="b", priority=-10, run_at=now)
    later = now + timedelta(seconds=1)
    # Without aging tenant a's best is its highest priority; b still gets its turn.
    assert {j.id for j in transitions.claim("w1", limit=2, now=later, aging=0)} == {high.pk, other.pk}
    Job.objects.filter(pk__in=[high.pk, other.pk]).update(
        state=State.PENDING, lease_owner=None, lease_expires_at=None
    )
    KindLimit.objects.filter(kind="echo").update(fair_after=None)
    # With aging (a point a minute), the hour-old job outranks priority 5 within a.
    assert {j.id for j in transitions.claim("w1", limit=2, now=later, aging=60)} == {low_old.pk, other.pk}


def test_a_fair_kind_leaves_scheduled_jobs_and_paused_queues_alone():
    flow.set_limit("echo", fair=True)
    now = timezone.now()
    JobFactory(kind="echo", concurrency_key="a", run_at=now + timedelta(hours=1))
    JobFactory(kind="echo", concurrency_key="b", queue_name="held")
    ready = JobFactory(kind="echo", concurrency_key="c")
    flow.pause(queue="held")
    assert [j.id for j in transitions.claim("w1", limit=5, now=now + timedelta(seconds=1))] == [ready.pk]


def test_fair_kinds_keep_their_concurrency_limit():
    flow.set_limit("echo", fair=True, concurrency=2)
    for key in "abc":
        JobFactory.create_batch(2, kind="echo", concurrency_key=key)
    later = timezone.now() + timedelta(seconds=1)
    assert keys(transitions.claim("w1", limit=10, now=later)) == ["a", "b"]
    assert transitions.claim("w1", limit=10, now=later) == []


def test_fair_with_per_key_is_refused_and_nothing_is_written():
    flow.set_limit("echo", per_key=1)
    with pytest.raises(InvalidJob, match="fair and per_key"):
        flow.set_limit("echo", fair=True)
    assert KindLimit.objects.get(kind="echo").fair is False


def test_other_kinds_are_claimed_as_before_beside_a_fair_kind():
    flow.set_limit("echo", fair=True)
    JobFactory.create_batch(2, kind="echo", concurrency_key="a")
    plain = JobFactory.create_batch(3, kind="add")
    jobs = transitions.claim("w1", limit=10, now=timezone.now() + timedelta(seconds=1))
    assert sorted(j.kind for j in jobs) == ["add"] * 3 + ["echo"] * 2
    assert {p.pk for p in plain} <= {j.id for j in jobs}


def test_the_fair_setting_reaches_the_limit_row(settings):
    settings.JOBQUEUE = {**getattr(settings, "JOBQUEUE", {}), "LIMITS": {"echo": {"fair": True}}}
    flow.sync_limits()
    assert KindLimit.objects.get(kind="echo").fair is True
    assert "echo" in flow.active_limits()


def test_manage_py_limits_turns_fair_on_and_off_and_lists_it():
    out = StringIO()
    call_command("limits", "report", "--fair", "on", stdout=out)
    assert KindLimit.objects.get(kind="report").fair is True
    assert "fair (round-robin by key)" in out.getvalue()
    out = StringIO()
    call_command("limits", "report", "--weights", "gold=3,silver=2", stdout=out)
    assert KindLimit.objects.get(kind="report").fair_weights == {"gold": 3, "silver": 2}
    assert "weights gold=3,silver=2" in out.getvalue()
    call_command("limits", "report", "--fair", "off", stdout=StringIO())
    assert KindLimit.objects.get(kind="report").fair is False
    with pytest.raises(CommandError):
        call_command("limits", "report", "--fair", "maybe", stdout=StringIO(), stderr=StringIO())


def test_a_weighted_tenant_gets_its_weight_in_jobs_each_round():
    flow.set_limit("echo", fair=True, fair_weights={"gold": 3})
    for key in ("gold", "free"):
        JobFactory.create_batch(10, kind="echo", concurrency_key=key)
    later = timezone.now() + timedelta(seconds=1)
    # free (turn 1) then gold (turn 2) with three a round: f g g g, f g g g.
    assert keys(transitions.claim("w1", limit=8, now=later)) == ["free"] * 2 + ["gold"] * 6
    # The second round ended with gold: the next claim starts at free.
    assert KindLimit.objects.get(kind="echo").fair_after == "gold"
    assert keys(transitions.claim("w1", limit=2, now=later)) == ["free", "gold"]


@pytest.mark.parametrize(
    "bad", [[("a", 3)], {"a": 0}, {"a": True}, {"": 2}, {"a": 1001}, "a=3"], ids=lambda v: repr(v)
)
def test_bad_weights_are_refused_and_nothing_is_written(bad):
    with pytest.raises(InvalidJob):
        flow.set_limit("echo", fair=True, fair_weights=bad)
    assert not KindLimit.objects.exists()
