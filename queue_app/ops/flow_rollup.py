"""The queues page's flow, maintained: per queue and kind, per minute and per hour, jobs
enqueued, attempts completed and failed, and sketches of wait and run time
(``FlowBucket``).

Why each window stays fast with 1,000,000 jobs and 10,000,000 events:

- Nothing reads the event log per page. The metrics fold (metrics.fold_events), which
  already reads each new event once and looks up the kind and queue of those that move
  or time a job, adds them here in the same transaction (fold()): a few rows per
  minute and per hour that saw activity, one read and one write per fold.
- A window reads only its own buckets by the (span, start, ...) unique index: 15 minute
  rows per queue and kind for 15 min, 60 for 1 h, 24 hour rows for 24 h, 168 for 7 d,
  whatever the size of the tables. Minute rows are kept two hours and hour rows eight
  days; each fold that has new events deletes what aged out (a range on the same index).
- Percentiles come from the sketches, not from rows: each wait or run time lands in a
  log-scale bucket (index()), buckets add across rows, and p50/p95 is the bucket
  holding that rank, reported at its geometric middle: within 10% of the exact value
  at any scale, from a millisecond to days.
- A window that starts before the rollup did (an upgrade; a first fold that found more
  history than a fold batch and counted it in bulk) says from when it counts
  (MetricsCheckpoint.flow_since; FROM_THE_START when the fold streamed the whole log);
  metrics.rebuild_flow() fills it from the event log once, for a benchmark or after an
  upgrade.
"""

import math
from datetime import UTC, datetime, timedelta

from django.db.models import Q

from queue_app.models import EventType, FlowBucket, FlowSpan, HistogramMetric, MetricsCheckpoint

# The events a window counts as a failed attempt (reads.FAILURE_EVENTS).
FAILURES = frozenset({EventType.FAILED, EventType.DEAD_LETTERED, EventType.RECOVERED})
# Every event type a window counts, and the series it counts in.
_SERIES = {
    EventType.ENQUEUED: "enqueued",
    EventType.COMPLETED: "completed",
    **dict.fromkeys(FAILURES, "failed"),
}
COUNTED = frozenset(_SERIES)
# MetricsCheckpoint.flow_since when the rollup holds every event since the first.
FROM_THE_START = datetime(1970, 1, 1, tzinfo=UTC)
# Each span's length, and how long its rows are kept.
SPANS = {FlowSpan.MINUTE: timedelta(minutes=1), FlowSpan.HOUR: timedelta(hours=1)}
KEPT = {FlowSpan.MINUTE: timedelta(hours=2), FlowSpan.HOUR: timedelta(days=8)}
# The sketch: a value v > BASE lands in the smallest i with v <= BASE * GAMMA**i; up
# to BASE in 0. Neighbouring bounds are 20% apart, so the middle is within 10%.
BASE = 0.001
GAMMA = 1.2
_LOG_GAMMA = math.log(GAMMA)


def index(seconds):
    """The sketch bucket of ``seconds``.

    >>> index(0.0005), index(0.001), index(0.0012), index(3.0), index(86400.0)
    (0, 0, 1, 44, 101)
    """
    if seconds <= BASE:
        return 0
    return max(1, math.ceil(math.log(seconds / BASE) / _LOG_GAMMA - 1e-9))


def value(i):
    """The value sketch bucket ``i`` stands for: its geometric middle (0 for bucket 0).

    >>> value(0), round(value(44), 2), abs(value(index(100.0)) - 100.0) < 10
    (0.0, 2.78, True)
    """
    return 0.0 if i <= 0 else BASE * GAMMA ** (i - 0.5)


def add(sketch, other):
    """Add sketch ``other`` into ``sketch`` (both {index: count}; keys str or int)."""
    for i, n in other.items():
        i = int(i)
        sketch[i] = sketch.get(i, 0) + n
    return sketch


def quantile(sketch, p):
    """The nearest-rank ``p`` quantile (0 < p <= 1) of ``sketch``; None when empty.

    >>> s = add({}, {index(x): 1 for x in (1, 2, 3, 4, 100)})
    >>> [round(quantile(s, p) / x, 2) for p, x in ((0.5, 3), (0.95, 100))]
    [0.93, 1.07]
    """
    n = sum(sketch.values())
    if not n:
        return None
    rank, seen = max(1, math.ceil(p * n)), 0
    for i in sorted(sketch):
        seen += sketch[i]
        if seen >= rank:
            return value(i)
    return value(max(sketch))


def start_of(at, span):
    """The start of the ``span`` bucket holding ``at`` (UTC)."""
    step = int(SPANS[span].total_seconds())
    return datetime.fromtimestamp(int(at.timestamp()) // step * step, tz=UTC)


# Each span's length in whole seconds, for the fold's per-event arithmetic.
_STEPS = {span: int(length.total_seconds()) for span, length in SPANS.items()}
_START = {}  # (span, bucket number) -> its start as a datetime, made once per bucket


def _cells(delta, at, now, queue, kind):
    """The delta counters of ``at``'s bucket in each span that still keeps it (an old
    event goes to hour rows only). Integer arithmetic per event, a datetime per bucket."""
    stamp, out = int(at.timestamp()), []
    for span, kept in KEPT.items():
        if at < now - kept:
            continue
        number = stamp // _STEPS[span]
        start = _START.get((span, number))
        if start is None:
            start = _START[(span, number)] = datetime.fromtimestamp(number * _STEPS[span], tz=UTC)
            if len(_START) > 100_000:
                _START.clear()
        key = (span, start, queue, kind)
        if key not in delta:
            delta[key] = _new()
        out.append(delta[key])
    return out


def _new():
    return {"enqueued": 0, "completed": 0, "failed": 0, "waits": {}, "runs": {}}


def _stored(d):
    """A delta's counters as FlowBucket's fields (JSON keys are strings)."""
    return {
        **d,
        "waits": {str(i): n for i, n in d["waits"].items()},
        "runs": {str(i): n for i, n in d["runs"].items()},
    }


def fold(db, events, jobs, observed, now):
    """Add folded ``events`` [(type, job_id, at)] and ``observed`` durations [(metric,
    at, job_id, seconds)] to FlowBucket (collect()), then forget rows past their span's
    keeping. Runs inside the fold's transaction, under its lock."""
    _write(db, collect({}, events, jobs, observed, now))
    for span, kept in KEPT.items():
        FlowBucket.objects.using(db).filter(span=span, start__lt=start_of(now - kept, span)).delete()


def collect(delta, events, jobs, observed, now):
    """Add ``events`` and ``observed`` (as fold() takes them) to ``delta`` {(span, start,
    queue, kind): counters}, in each span that still keeps their time; ``jobs`` {id:
    (kind, queue, ...)} names their kind and queue (a job deleted meanwhile is left
    out). Return ``delta``."""
    for type_, job_id, at in events:
        job = jobs.get(job_id)
        if job is None:
            continue
        name = _SERIES.get(type_)
        if name is None:
            continue
        for cell in _cells(delta, at, now, job[1], job[0]):
            cell[name] += 1
    for metric, at, job_id, seconds in observed:
        job = jobs.get(job_id)
        if job is None:
            continue
        field = "waits" if metric == HistogramMetric.WAIT else "runs"
        i = index(seconds)
        for cell in _cells(delta, at, now, job[1], job[0]):
            cell[field][i] = cell[field].get(i, 0) + 1
    return delta


def _write(db, delta, *, fresh=False):
    """Add ``delta`` {(span, start, queue, kind): counters} to its rows: one read, then
    the rows it touches deleted and inserted with their new counts (under the fold's
    lock nothing else writes them; a DELETE and an INSERT per 500 rows cost far less
    than Django's bulk_update, a CASE per row and field). ``fresh``: the table was just
    emptied, so only the insert."""
    if not delta:
        return
    old = {}
    if not fresh:
        wanted = Q()
        for span in SPANS:
            starts = {start for s, start, _, _ in delta if s == span}
            if starts:
                wanted |= Q(span=span, start__in=starts)
        old = {
            (r.span, r.start, r.queue_name, r.kind): r
            for r in FlowBucket.objects.using(db).filter(wanted).filter(queue_name__in={k[2] for k in delta})
        }
    rows = []
    for key, d in delta.items():
        was = old.get(key)
        if was is not None:
            d = {
                "enqueued": was.enqueued + d["enqueued"],
                "completed": was.completed + d["completed"],
                "failed": was.failed + d["failed"],
                "waits": add(add({}, was.waits), d["waits"]),
                "runs": add(add({}, was.runs), d["runs"]),
            }
        rows.append(FlowBucket(span=key[0], start=key[1], queue_name=key[2], kind=key[3], **_stored(d)))
    gone = sorted(r.id for key, r in old.items() if key in delta)
    for i in range(0, len(gone), 500):
        FlowBucket.objects.using(db).filter(id__in=gone[i : i + 500]).delete()
    FlowBucket.objects.using(db).bulk_create(rows, batch_size=500)


def since(using=None):
    """When the rollup began counting (None: not yet)."""
    return MetricsCheckpoint.objects.using(using).filter(id=1).values_list("flow_since", flat=True).first()


def window(start, bucket, buckets, *, using=None):
    """Per (queue, kind): the flow from ``start`` over ``buckets`` chart buckets of
    ``bucket`` each: totals, a series per chart bucket, and merged wait and run sketches.
    Read from minute rows for buckets under an hour, else from hour rows."""
    span = FlowSpan.MINUTE if bucket < timedelta(hours=1) else FlowSpan.HOUR
    out = {}
    rows = (
        FlowBucket.objects.using(using)
        .filter(span=span, start__gte=start)
        .values_list("queue_name", "kind", "start", "enqueued", "completed", "failed", "waits", "runs")
    )
    for queue, kind, at, enqueued, completed, failed, waits, runs in rows:
        row = out.get((queue, kind))
        if row is None:
            row = out[(queue, kind)] = {
                **dict.fromkeys(("enqueued", "completed", "failed"), 0),
                **{f"{name}_series": [0] * buckets for name in ("enqueued", "completed", "failed")},
                "waits": {},
                "runs": {},
            }
        i = int((at - start) / bucket)
        for name, n in (("enqueued", enqueued), ("completed", completed), ("failed", failed)):
            row[name] += n
            if 0 <= i < buckets:
                row[f"{name}_series"][i] += n
        add(row["waits"], waits)
        add(row["runs"], runs)
    return out


def write_fresh(db, delta):
    """Write ``delta`` (collect()) into an emptied FlowBucket: inserts only."""
    _write(db, delta, fresh=True)
