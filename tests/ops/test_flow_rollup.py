"""The queues page's flow rollup (ops/flow_rollup.py): folded from the event log by the
metrics fold, read by the windows instead of the events."""

import doctest
from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import given, settings
from hypothesis import strategies as st

from queue_app.core.enqueueing import bulk_enqueue, enqueue
from queue_app.models import Event, EventType, FlowBucket, FlowSpan, Job, MetricsCheckpoint, State
from queue_app.ops import flow_rollup, metrics, reads
from queue_app.worker.execution import run_one
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def test_flow_rollup_doctests_pass():
    result = doctest.testmod(flow_rollup)
    assert result.attempted > 0 and result.failed == 0


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(min_value=0.0, max_value=30 * 86400.0), min_size=1, max_size=60),
    st.sampled_from([0.5, 0.95]),
)
def test_a_sketch_quantile_is_within_ten_percent_of_the_exact_one(values, p):
    exact = reads.percentile(values, p)
    got = flow_rollup.quantile(_sketch(values), p)
    if exact <= flow_rollup.BASE:
        assert got == 0.0
    else:
        assert abs(got - exact) <= 0.1 * exact


def _sketch(values):
    out = {}
    for v in values:
        i = flow_rollup.index(v)
        out[i] = out.get(i, 0) + 1
    return out


def _attempt(job, claimed, ran):
    Event.objects.create(job=job, type=EventType.CLAIMED, attempt=1, at=claimed)
    Event.objects.create(job=job, type=EventType.COMPLETED, attempt=1, at=claimed + timedelta(seconds=ran))


def _flow(window):
    metrics.fold_recent()
    return reads.flow(window)[2]


def test_each_window_counts_the_attempts_inside_it_from_minute_or_hour_rows():
    now = timezone.now()
    for ago in (timedelta(minutes=10), timedelta(hours=5), timedelta(days=3)):
        job = JobFactory(queue_name="q", kind="k", state=State.COMPLETED, attempts=1, run_at=now - ago)
        _attempt(job, now - ago + timedelta(seconds=2), 4)
    done = {w: _flow(w).get(("q", "k"), {}).get("completed", 0) for w in ("15m", "1h", "24h", "7d")}
    assert done == {"15m": 1, "1h": 1, "24h": 2, "7d": 3}
    week = _flow("7d")[("q", "k")]
    assert len(week["completed_series"]) == 28 and sum(week["completed_series"]) == 3
    assert week["run_p50"] == pytest.approx(4, rel=0.1) and week["wait_p95"] == pytest.approx(2, rel=0.1)
    # An attempt three days ago is in no minute row (they are kept two hours).
    assert not FlowBucket.objects.filter(span=FlowSpan.MINUTE, start__lt=now - timedelta(hours=4)).exists()


def test_the_windows_read_the_rollup_not_the_events():
    enqueue("echo", {}, queue_name="fast")
    run_one(worker_id="w-test")
    before = _flow("24h")[("fast", "echo")]
    assert (before["enqueued"], before["completed"], before["failed"], before["sampled"]) == (1, 1, 0, 1)
    Event.objects.all().delete()  # as prune would, long after
    after = _flow("24h")[("fast", "echo")]
    assert {k: after[k] for k in ("enqueued", "completed", "sampled")} == {
        "enqueued": 1,
        "completed": 1,
        "sampled": 1,
    }


def test_failed_attempts_count_in_the_window():
    enqueue("boom", {"message": "no"}, max_attempts=1)
    run_one(worker_id="w-test", kinds=["boom"])
    row = _flow("15m")[("default", "boom")]
    assert (row["completed"], row["failed"]) == (0, 1)


def test_each_fold_forgets_rows_past_their_keeping():
    now = timezone.now()

    def bucket(span, ago):
        return FlowBucket.objects.create(
            span=span, start=flow_rollup.start_of(now - ago, span), queue_name="q", kind="k"
        )

    old_minute = bucket(FlowSpan.MINUTE, timedelta(hours=3))
    kept_minute = bucket(FlowSpan.MINUTE, timedelta(hours=1))
    old_hour = bucket(FlowSpan.HOUR, timedelta(days=9))
    kept_hour = bucket(FlowSpan.HOUR, timedelta(days=6))
    enqueue("echo", {})
    metrics.fold_events()
    left = set(FlowBucket.objects.values_list("id", flat=True))
    assert {kept_minute.id, kept_hour.id} <= left and not {old_minute.id, old_hour.id} & left


def test_rebuild_from_the_event_log_gives_what_the_fold_kept():
    now = timezone.now()
    for n in range(6):
        job = JobFactory(
            queue_name=f"q{n % 2}",
            kind="k",
            state=State.COMPLETED,
            attempts=1,
            run_at=now - timedelta(hours=n),
        )
        Event.objects.create(job=job, type=EventType.ENQUEUED, at=now - timedelta(hours=n, minutes=1))
        _attempt(job, now - timedelta(hours=n) + timedelta(seconds=n), 1 + n)
    metrics.fold_recent()
    kept = _rows()
    assert kept  # the fold wrote them
    read = metrics.rebuild_flow(now - timedelta(days=8))
    assert read == Event.objects.count()
    assert _rows() == kept
    assert MetricsCheckpoint.objects.get().flow_since == now - timedelta(days=8)


def _rows():
    return sorted(
        (r.span, r.start, r.queue_name, r.kind, r.enqueued, r.completed, r.failed, r.waits, r.runs)
        for r in FlowBucket.objects.all()
    )


def test_a_window_that_starts_before_the_rollup_says_so(admin_client):
    metrics.fold_events()
    MetricsCheckpoint.objects.update(flow_since=timezone.now() - timedelta(hours=2))
    page = admin_client.get("/dashboard/queues/?window=24h").content.decode()
    assert "data-counted-since" in page
    page = admin_client.get("/dashboard/queues/?window=1h").content.decode()
    assert "data-counted-since" not in page


def test_a_first_fold_over_the_whole_log_counts_from_the_start_and_an_upgrade_from_now(
    admin_client, settings
):
    # Ids past a fold batch whose rows are gone (a database's sequences outlive its
    # rows): the log is still whole.
    settings.JOBQUEUE = {**settings.JOBQUEUE, "METRICS_FOLD_BATCH": 5}
    Job.objects.filter(id__in=[job.id for job in bulk_enqueue([{"kind": "echo"}] * 10)]).delete()
    enqueue("echo", {})
    assert Event.objects.order_by("-id").values_list("id", flat=True)[0] > 10
    metrics.fold_events()
    assert flow_rollup.since() == flow_rollup.FROM_THE_START
    assert "data-counted-since" not in admin_client.get("/dashboard/queues/?window=7d").content.decode()
    # An upgrade: a checkpoint folded before the rollup existed.
    MetricsCheckpoint.objects.update(flow_since=None)
    enqueue("echo", {})
    before = timezone.now()
    metrics.fold_events()
    assert flow_rollup.since() >= before
    assert "data-counted-since" in admin_client.get("/dashboard/queues/?window=7d").content.decode()
