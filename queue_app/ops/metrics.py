"""Queue metrics: snapshot() reads them; QueueCollector renders them for Prometheus.

Why a scrape stays cheap with millions of rows:

- Event totals are maintained, not recounted. Events are append-only with increasing
  ids, so fold_events() keeps ``EventCount(type, count)`` plus a checkpoint (the last
  folded id) and on each scrape adds only events with ``id > checkpoint``: an index
  range on the primary key, as long as the events since the last scrape. The fold runs
  under a lock on the checkpoint row, so two concurrent scrapes never count an event
  twice, and prune (which deletes old events) does not lower the totals. Nothing is
  added to the hot path: transitions still write only their Event row.
- An id can become visible out of order: on PostgreSQL and MariaDB a transaction takes
  its id at INSERT and may commit after a later one. The fold therefore remembers ids
  it passed that were missing (``MetricsCheckpoint.gaps``, only within the top
  METRICS_FOLD_BATCH ids) and counts them if they appear within METRICS_GAP_SECONDS;
  a rolled-back id simply expires.
- Job gauges are one GROUP BY over (state, kind, queue_name), plus one pass over the
  pending rows for their statuses and the oldest ready job (``reads.pending_counts``,
  the dashboard's and the CLI's breakdown too), a count of unresolved dead letters and
  of workers per status (``reads.worker_counts``: the one lost rule).

Label cardinality is bounded: ``state`` and ``type`` come from fixed enums; ``kind``
and ``queue`` keep at most METRICS_MAX_KINDS / METRICS_MAX_QUEUES values (registered
kinds and the default queue first, then the busiest) and report the rest as "_other".
"""

import time
from dataclasses import dataclass
from datetime import datetime

from django.db import connections, router, transaction
from django.db.models import Count, F, Sum
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from queue_app.conf import settings
from queue_app.handlers import registry
from queue_app.models import (
    JOB_STATUSES,
    LATE,
    PENDING_STATUSES,
    WORKER_STATUSES,
    DeadLetter,
    Event,
    EventCount,
    EventType,
    Job,
    JobDuration,
    KindCrashes,
    MetricsCheckpoint,
    State,
    Worker,
)
from queue_app.ops import reads

OTHER = "_other"
# Worker status labels in the exposition's stable order (the one WORKER_STATUSES table).
WORKER_STATES = tuple(WORKER_STATUSES)
# ids a fold looks up in one IN (...): below SQLite's and MariaDB's parameter limits.
_CHUNK = 500
# Ids watched for a late commit, at most (the newest are kept).
_MAX_GAPS = 10_000
# A scrape keeps folding full batches for at most this long, then answers; the rest
# is folded by the next scrape (the totals lag, they never go down).
_FOLD_SECONDS = 2.0


@dataclass(frozen=True)
class Snapshot:
    at: datetime
    jobs: dict  # state -> count
    jobs_by_status: dict  # status (models.JOB_STATUSES) -> count
    late: int  # ready jobs waiting longer than OPS_LATE_SECONDS
    jobs_by_kind: dict  # (kind, state) -> count
    jobs_by_queue: dict  # (queue, state) -> count
    events: dict  # event type -> total ever appended
    oldest_pending_seconds: float
    bounds: tuple  # histogram bucket upper bounds, without +Inf
    durations: dict  # kind -> (per-bucket counts incl. +Inf, count, sum)
    workers: dict  # worker state -> count
    dead_letters: int
    db_reconnects: int = 0  # database outages the workers waited out, over all Worker rows
    crashes: dict = None  # kind -> (attempts that crashed their process, jobs quarantined as poison)


def _db(using):
    return using or router.db_for_write(Event)


def _bounds():
    return tuple(sorted(float(b) for b in settings.METRICS_DURATION_BUCKETS))


def _bucket(bounds, seconds):
    for i, le in enumerate(bounds):
        if seconds <= le:
            return i
    return len(bounds)


class _Raced(Exception):
    """Another fold moved the checkpoint first; this one's work is rolled back."""


def fold_events(*, using=None, now=None):
    """Fold events appended since the last fold into the counters; return how many."""
    db = _db(using)
    now = now or timezone.now()
    try:
        with transaction.atomic(using=db):
            return _fold(db, now)
    except _Raced:
        return 0


def _fold(db, now):
    MetricsCheckpoint.objects.using(db).get_or_create(id=1)
    # The row lock serialises folds on PostgreSQL and MariaDB; SQLite's IMMEDIATE
    # transactions serialise them already. The versioned UPDATE below is the backstop.
    cp = MetricsCheckpoint.objects.using(db).select_for_update().get(id=1)
    last, batch = cp.last_event_id, settings.METRICS_FOLD_BATCH
    gaps = {int(k): v for k, v in (cp.gaps or {}).items()}
    fields = ("id", "type", "job_id", "attempt", "at")
    rows = []
    if gaps:
        ids = list(gaps)
        for i in range(0, len(ids), _CHUNK):
            rows += Event.objects.using(db).filter(id__in=ids[i : i + _CHUNK]).values_list(*fields)
        for row in rows:
            gaps.pop(row[0], None)
    counts = {}
    if last == 0:
        # First fold on a database with history: count the old part in the database
        # once instead of streaming it; only the newest batch goes row by row.
        top = Event.objects.using(db).order_by("-id").values_list("id", flat=True).first() or 0
        if top > batch:
            old = Event.objects.using(db).filter(id__lte=top - batch)
            for type_, n in old.values_list("type").annotate(n=Count("id")).order_by():
                counts[type_] = counts.get(type_, 0) + n
            last = top - batch
    new = list(Event.objects.using(db).filter(id__gt=last).order_by("id").values_list(*fields)[:batch])
    if new:
        seen = {row[0] for row in new}
        hi = new[-1][0]
        # Before the first fold, ids below the first one seen are history (pruned or
        # rolled back long ago), not transactions still in flight.
        low = last + 1 if last else new[0][0]
        for missing in range(max(low, hi - batch + 1), hi):
            if missing not in seen:
                gaps.setdefault(missing, now.timestamp())
        last = hi
    rows += new
    for row in rows:
        counts[row[1]] = counts.get(row[1], 0) + 1
    horizon = now.timestamp() - settings.METRICS_GAP_SECONDS
    gaps = dict(sorted((k, v) for k, v in gaps.items() if v >= horizon)[-_MAX_GAPS:])
    changed = (
        MetricsCheckpoint.objects.using(db)
        .filter(id=1, last_event_id=cp.last_event_id, folded_at=cp.folded_at)
        .update(last_event_id=last, gaps={str(k): v for k, v in gaps.items()}, folded_at=now)
    )
    if not changed:
        raise _Raced
    for type_, n in counts.items():
        if not EventCount.objects.using(db).filter(type=type_).update(count=F("count") + n):
            EventCount.objects.using(db).create(type=type_, count=n)
    _fold_durations(db, [row for row in rows if row[1] == EventType.COMPLETED])
    return sum(counts.values())


def _fold_durations(db, completed):
    """A completed attempt ran from its claimed event to its completed event."""
    if not completed:
        return
    job_ids = sorted({row[2] for row in completed})
    started, kinds = {}, {}
    for i in range(0, len(job_ids), _CHUNK):
        chunk = job_ids[i : i + _CHUNK]
        claimed = Event.objects.using(db).filter(job_id__in=chunk, type=EventType.CLAIMED)
        for job_id, attempt, at in claimed.values_list("job_id", "attempt", "at").order_by("id"):
            started[(job_id, attempt)] = at
        kinds.update(Job.objects.using(db).filter(id__in=chunk).values_list("id", "kind"))
    bounds = _bounds()
    known = set(JobDuration.objects.using(db).values_list("kind", flat=True))
    adds = {}
    for _, _, job_id, attempt, at in completed:
        begun, kind = started.get((job_id, attempt)), kinds.get(job_id)
        if begun is None or kind is None:
            continue  # pruned meanwhile, or written without a claim
        if kind not in known and len(known) >= settings.METRICS_MAX_KINDS:
            kind = OTHER
        known.add(kind)
        seconds = max((at - begun).total_seconds(), 0.0)
        buckets, n, total = adds.setdefault(kind, ([0] * (len(bounds) + 1), [0], [0.0]))
        buckets[_bucket(bounds, seconds)] += 1
        n[0] += 1
        total[0] += seconds
    for kind, (buckets, n, total) in adds.items():
        row, _ = JobDuration.objects.using(db).get_or_create(kind=kind)
        if len(row.buckets) != len(buckets):
            # The bucket bounds changed in settings: this kind's histogram restarts.
            row.buckets, row.count, row.sum = [0] * len(buckets), 0, 0.0
        row.buckets = [a + b for a, b in zip(row.buckets, buckets)]
        row.count += n[0]
        row.sum += total[0]
        row.save(using=db)


def _keep(values, first, limit):
    """The label values to report: ``first`` ones, then the busiest, at most ``limit``."""
    ranked = sorted(values.items(), key=lambda kv: (kv[0] not in first, -kv[1], kv[0]))
    return {name for name, _ in ranked[:limit]}


def snapshot(*, using=None, now=None):
    """Fold new events and read every metric the queue exports."""
    db = _db(using)
    started = time.monotonic()
    while fold_events(using=db, now=now) >= settings.METRICS_FOLD_BATCH:
        if time.monotonic() - started > _FOLD_SECONDS:
            break
    now = now or timezone.now()
    groups = list(
        Job.objects.using(db).order_by().values_list("state", "kind", "queue_name").annotate(n=Count("id"))
    )
    kind_totals, queue_totals = dict.fromkeys(registry.kinds(), 0), {settings.DEFAULT_QUEUE: 0}
    for _, kind, queue, n in groups:
        kind_totals[kind] = kind_totals.get(kind, 0) + n
        queue_totals[queue] = queue_totals.get(queue, 0) + n
    durations = {d.kind: (d.buckets, d.count, d.sum) for d in JobDuration.objects.using(db).all()}
    for kind in durations:
        kind_totals.setdefault(kind, 0)
    crashed = {k.kind: (k.crashes, k.poisoned) for k in KindCrashes.objects.using(db).all()}
    for kind in crashed:
        kind_totals.setdefault(kind, 0)
    kinds = _keep(kind_totals, set(registry.kinds()) | {OTHER}, settings.METRICS_MAX_KINDS)
    queues = _keep(queue_totals, {settings.DEFAULT_QUEUE}, settings.METRICS_MAX_QUEUES)
    jobs = dict.fromkeys(State.values, 0)
    by_kind, by_queue = {}, {}
    for state, kind, queue, n in groups:
        kind = kind if kind in kinds else OTHER
        queue = queue if queue in queues else OTHER
        jobs[state] = jobs.get(state, 0) + n
        by_kind[(kind, state)] = by_kind.get((kind, state), 0) + n
        by_queue[(queue, state)] = by_queue.get((queue, state), 0) + n
    if any(k == OTHER for k, _ in by_kind):
        kinds.add(OTHER)
    if any(q == OTHER for q, _ in by_queue):
        queues.add(OTHER)
    for kind in kinds:
        for state in State.values:
            by_kind.setdefault((kind, state), 0)
    for queue in queues:
        for state in State.values:
            by_queue.setdefault((queue, state), 0)
    events = dict.fromkeys(EventType.values, 0)
    events.update(EventCount.objects.using(db).values_list("type", "count"))
    pending = reads.pending_counts(Job.objects.using(db).all(), now)
    oldest = pending["oldest"]
    by_status = {
        name: pending[name] if name in PENDING_STATUSES else jobs.get(name, 0) for name in JOB_STATUSES
    }
    bounds = _bounds()
    folded = {}
    for kind, (buckets, count, total) in durations.items():
        if len(buckets) != len(bounds) + 1:
            continue
        key = kind if kind in kinds else OTHER
        prev = folded.get(key, ([0] * (len(bounds) + 1), 0, 0.0))
        folded[key] = ([a + b for a, b in zip(prev[0], buckets)], prev[1] + count, prev[2] + total)
    for kind in kinds:
        folded.setdefault(kind, ([0] * (len(bounds) + 1), 0, 0.0))
    crashes = dict.fromkeys(kinds, (0, 0))
    for kind, (n, poisoned) in crashed.items():
        key = kind if kind in kinds else OTHER
        prev = crashes.get(key, (0, 0))
        crashes[key] = (prev[0] + n, prev[1] + poisoned)
    return Snapshot(
        at=now,
        jobs=jobs,
        jobs_by_status=by_status,
        late=pending[LATE],
        jobs_by_kind=by_kind,
        jobs_by_queue=by_queue,
        events=events,
        oldest_pending_seconds=max((now - oldest).total_seconds(), 0.0) if oldest else 0.0,
        bounds=bounds,
        durations=folded,
        workers={s: n for s, n in reads.worker_counts(using=db, now=now).items() if s in WORKER_STATES},
        dead_letters=DeadLetter.objects.using(db).unresolved().count(),
        db_reconnects=Worker.objects.using(db).aggregate(n=Sum("db_reconnects"))["n"] or 0,
        crashes=crashes,
    )


def families(snap):
    """The Prometheus metric families of a snapshot, in a stable order."""
    states = State.values
    f = GaugeMetricFamily("jobqueue_jobs", "Jobs in each state.", labels=["state"])
    for state in states:
        f.add_metric([state], snap.jobs.get(state, 0))
    yield f
    f = GaugeMetricFamily(
        "jobqueue_jobs_by_status",
        "Jobs in each status: the state, with pending split into ready, scheduled, retrying, paused.",
        labels=["status"],
    )
    for status in JOB_STATUSES:
        f.add_metric([status], snap.jobs_by_status.get(status, 0))
    yield f
    yield GaugeMetricFamily(
        "jobqueue_late_jobs",
        "Ready jobs that have waited longer than OPS_LATE_SECONDS (never paused ones).",
        value=snap.late,
    )
    f = GaugeMetricFamily("jobqueue_jobs_by_kind", "Jobs per kind and state.", labels=["kind", "state"])
    for (kind, state), n in sorted(
        snap.jobs_by_kind.items(),
        key=lambda kv: (kv[0][0], states.index(kv[0][1]) if kv[0][1] in states else 99),
    ):
        f.add_metric([kind, state], n)
    yield f
    f = GaugeMetricFamily("jobqueue_jobs_by_queue", "Jobs per queue and state.", labels=["queue", "state"])
    for (queue, state), n in sorted(
        snap.jobs_by_queue.items(),
        key=lambda kv: (kv[0][0], states.index(kv[0][1]) if kv[0][1] in states else 99),
    ):
        f.add_metric([queue, state], n)
    yield f
    f = CounterMetricFamily("jobqueue_events", "Events appended to the job log, by type.", labels=["type"])
    for type_ in [*EventType.values, *sorted(set(snap.events) - set(EventType.values))]:
        f.add_metric([type_], snap.events.get(type_, 0))
    yield f
    yield GaugeMetricFamily(
        "jobqueue_oldest_pending_seconds",
        "Seconds the oldest ready job (due, not paused) has waited since its run_at; 0 when none.",
        value=snap.oldest_pending_seconds,
    )
    f = HistogramMetricFamily(
        "jobqueue_job_duration_seconds", "Run time of completed attempts, by kind.", labels=["kind"]
    )
    for kind, (buckets, _count, total) in sorted(snap.durations.items()):
        cumulative, acc = [], 0
        for le, n in zip([*map(_le, snap.bounds), "+Inf"], buckets):
            acc += n
            cumulative.append((le, acc))
        f.add_metric([kind], cumulative, sum_value=total)
    yield f
    f = GaugeMetricFamily(
        "jobqueue_workers",
        "Registered workers by status (lost: not stopped, silent for longer than LEASE_SECONDS).",
        labels=["state"],
    )
    for state in WORKER_STATES:
        f.add_metric([state], snap.workers.get(state, 0))
    yield f
    yield GaugeMetricFamily("jobqueue_dead_letters", "Unresolved dead letters.", value=snap.dead_letters)
    f = CounterMetricFamily(
        "jobqueue_job_crashes",
        "Attempts whose worker process died or was killed for its timeout, by kind.",
        labels=["kind"],
    )
    g = CounterMetricFamily(
        "jobqueue_poison_jobs",
        "Jobs dead-lettered as poison (MAX_CRASHES crashes), by kind.",
        labels=["kind"],
    )
    for kind, (n, poisoned) in sorted((snap.crashes or {}).items()):
        f.add_metric([kind], n)
        g.add_metric([kind], poisoned)
    yield f
    yield g
    yield CounterMetricFamily(
        "jobqueue_db_reconnects",
        "Database outages workers waited out (each one a lost connection or refused writes, then a"
        " reconnect), summed over the registered workers.",
        value=snap.db_reconnects,
    )


def _le(bound):
    return repr(float(bound))


class QueueCollector(Collector):
    """Reads a fresh snapshot on every collect()."""

    def __init__(self, using=None):
        self.using = using

    def collect(self):
        yield from families(snapshot(using=self.using))

    def describe(self):
        # No collect() at registration time: that would query the database.
        return []


def render(*, using=None):
    """The Prometheus text exposition of a fresh snapshot."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(QueueCollector(using))
    return generate_latest(reg)


def close_connections():
    """Close this thread's connections (for servers outside Django's request cycle)."""
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close()
