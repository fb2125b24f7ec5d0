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
- Job gauges read ``JobCount`` (state, kind, queue), maintained by the same fold: an
  event whose from_state and to_state differ moves its job from one row to the other
  (the job's kind and queue read by id, one IN per chunk; the rows written once per
  batch). Jobs deleted without events (prune, the admin's delete) are taken out by
  forget_jobs() in the deleting transaction, after folding their last events under
  the checkpoint lock; a checkpoint without ``counts_from`` (a new installation, an
  upgrade) is recounted once. verify() recounts the job table and reports drift.
- The pending breakdown (ready, scheduled, retrying, paused, late) and the oldest ready
  job per queue come from JobCount and index seeks (_pending; Engine.oldest_ready), never
  a pass over the ready backlog; unresolved dead letters are the kept dead_letter count;
  workers per status come from ``reads.worker_counts`` (the one lost rule).
- Exactness of JobCount rests on each event being folded once: an event whose
  transaction stays open longer than METRICS_GAP_SECONDS after a later id was folded is
  missed (its gap expires), as it is by EventCount. ``manage.py metrics --verify``
  shows such drift and ``--repair`` recounts.
- The wait (ready to claimed) and run (claimed to completed) histograms are folded per
  kind and queue into ``JobHistogram``, bucket bounds from settings.
- The same pass adds the queues page's flow per minute and per hour (``FlowBucket``,
  ops/flow_rollup.py): the events and durations it has already looked up, nothing more.

Label cardinality is bounded: ``state`` and ``type`` come from fixed enums; ``kind``
and ``queue`` keep at most METRICS_MAX_KINDS / METRICS_MAX_QUEUES values (registered
kinds and the default queue first, then the busiest) and report the rest as "_other".
"""

import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connections, router, transaction
from django.db.models import Count, F, Sum
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from queue_app import engines
from queue_app.conf import settings
from queue_app.handlers import registry
from queue_app.models import (
    JOB_STATUSES,
    LATE,
    PAUSED,
    PENDING_STATUSES,
    READY,
    RETRYING,
    SCHEDULED,
    WORKER_STATUSES,
    Event,
    EventCount,
    EventType,
    FlowBucket,
    HistogramMetric,
    Job,
    JobCount,
    JobHistogram,
    KindCrashes,
    KindLimit,
    MetricsCheckpoint,
    Pause,
    PauseScope,
    State,
    Worker,
    late_before,
    status_q,
)
from queue_app.ops import flow_rollup, reads

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
    oldest_ready_by_queue: dict  # queue (not paused) -> seconds its oldest ready job has waited
    held: dict  # "pause", "limit", "dependencies" -> jobs held back by it
    bounds: tuple  # run-time histogram bucket upper bounds, without +Inf
    durations: dict  # (kind, queue) -> (per-bucket counts incl. +Inf, count, sum)
    wait_bounds: tuple  # the wait histogram's
    waits: dict  # (kind, queue) -> as durations, for the wait from ready to claimed
    workers: dict  # worker state -> count
    dead_letters: int
    db_reconnects: int = 0  # database outages the workers waited out, over all Worker rows
    crashes: dict = None  # kind -> (attempts that crashed their process, jobs quarantined as poison)


def _db(using):
    return using or router.db_for_write(Event)


# Each histogram's bucket bounds, by setting.
_BUCKETS = {"run": "METRICS_DURATION_BUCKETS", "wait": "METRICS_WAIT_BUCKETS"}


def _bounds(metric="run"):
    return tuple(sorted(float(b) for b in getattr(settings, _BUCKETS[metric])))


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


# Event columns a fold reads.
_FIELDS = ("id", "type", "job_id", "attempt", "at", "from_state", "to_state")
ID, TYPE, JOB, ATTEMPT, AT, FROM, TO = range(len(_FIELDS))


def _fold(db, now):
    MetricsCheckpoint.objects.using(db).get_or_create(id=1)
    # The row lock serialises folds on PostgreSQL and MariaDB; SQLite's IMMEDIATE
    # transactions serialise them already. The versioned UPDATE below is the backstop.
    # Deleting jobs takes this lock too (forget_jobs): a fold never meets a job
    # deleted between its reading the events and reading their jobs.
    cp = MetricsCheckpoint.objects.using(db).select_for_update().get(id=1)
    last, batch = cp.last_event_id, settings.METRICS_FOLD_BATCH
    gaps = {int(k): v for k, v in (cp.gaps or {}).items()}
    rows = []
    if gaps:
        ids = list(gaps)
        for i in range(0, len(ids), _CHUNK):
            rows += Event.objects.using(db).filter(id__in=ids[i : i + _CHUNK]).values_list(*_FIELDS)
        for row in rows:
            gaps.pop(row[ID], None)
    counts = {}
    first = last == 0
    if first:
        # First fold on a database with history: count the old part in the database
        # once instead of streaming it; only the newest batch goes row by row.
        top = Event.objects.using(db).order_by("-id").values_list("id", flat=True).first() or 0
        if top > batch:
            old = Event.objects.using(db).filter(id__lte=top - batch)
            for type_, n in old.values_list("type").annotate(n=Count("id")).order_by():
                counts[type_] = counts.get(type_, 0) + n
            last = top - batch
    # The rollup counts from now (an upgrade; a history too long to stream, counted in
    # bulk above), or from the start when this fold streams the whole log: also when the
    # ids run past the batch but the rows below it are gone (pruned, rolled back).
    flow_since = cp.flow_since or (flow_rollup.FROM_THE_START if first and not counts else now)
    counts_from = cp.counts_from
    if counts_from is None:
        counts_from = _recount(db)
    new = list(Event.objects.using(db).filter(id__gt=last).order_by("id").values_list(*_FIELDS)[:batch])
    if new:
        seen = {row[ID] for row in new}
        hi = new[-1][ID]
        # Before the first fold, ids below the first one seen are history (pruned or
        # rolled back long ago), not transactions still in flight; also when the old part
        # was just counted in bulk above (``last`` moved, the checkpoint's did not).
        low = last + 1 if cp.last_event_id else new[0][ID]
        for missing in range(max(low, hi - batch + 1), hi):
            if missing not in seen:
                gaps.setdefault(missing, now.timestamp())
        last = hi
    rows += new
    for row in rows:
        counts[row[TYPE]] = counts.get(row[TYPE], 0) + 1
    horizon = now.timestamp() - settings.METRICS_GAP_SECONDS
    gaps = dict(sorted((k, v) for k, v in gaps.items() if v >= horizon)[-_MAX_GAPS:])
    changed = (
        MetricsCheckpoint.objects.using(db)
        .filter(id=1, last_event_id=cp.last_event_id, folded_at=cp.folded_at)
        .update(
            last_event_id=last,
            gaps={str(k): v for k, v in gaps.items()},
            folded_at=now,
            counts_from=counts_from,
            flow_since=flow_since,
        )
    )
    if not changed:
        raise _Raced
    for type_, n in counts.items():
        if not EventCount.objects.using(db).filter(type=type_).update(count=F("count") + n):
            EventCount.objects.using(db).create(type=type_, count=n)
    # Only the events that move a job, time it or count in its flow need the job's kind
    # and queue.
    rows = [
        row
        for row in rows
        if (row[FROM] != row[TO] and row[ID] > counts_from)
        or row[TYPE] in (EventType.CLAIMED, EventType.COMPLETED)
        or row[TYPE] in flow_rollup.COUNTED
    ]
    jobs = _jobs(db, {row[JOB] for row in rows})
    _fold_counts(db, [row for row in rows if row[ID] > counts_from], jobs)
    observed = _fold_histograms(db, rows, jobs)
    if rows:  # a fold with nothing new leaves the rollup (and its retention) alone
        flow_rollup.fold(db, [(row[TYPE], row[JOB], row[AT]) for row in rows], jobs, observed, now)
    return sum(counts.values())


def _jobs(db, job_ids):
    """{job id: (kind, queue, run_at)} of those jobs still there."""
    ids, out = sorted(job_ids), {}
    for i in range(0, len(ids), _CHUNK):
        found = Job.objects.using(db).filter(id__in=ids[i : i + _CHUNK])
        out.update((r[0], r[1:]) for r in found.values_list("id", "kind", "queue_name", "run_at"))
    return out


def _recount(db):
    """Write JobCount afresh from the job table; return the newest event id it includes."""
    JobCount.objects.using(db).all().delete()
    JobCount.objects.using(db).bulk_create(
        [JobCount(state=s, kind=k, queue_name=q, count=n) for s, k, q, n in _counted_groups(db)],
        batch_size=_CHUNK,
    )
    return Event.objects.using(db).order_by("-id").values_list("id", flat=True).first() or 0


def _fold_counts(db, rows, jobs):
    """Each event that changed a job's state moves it from one JobCount row to another."""
    delta = {}
    for row in rows:
        job = jobs.get(row[JOB])
        if row[FROM] == row[TO] or job is None:
            continue  # an edit, not a move; or a job deleted without forget_jobs
        kind, queue, _ = job
        if row[FROM]:
            delta[(row[FROM], kind, queue)] = delta.get((row[FROM], kind, queue), 0) - 1
        if row[TO]:
            delta[(row[TO], kind, queue)] = delta.get((row[TO], kind, queue), 0) + 1
    _add_counts(db, delta)


def _add_counts(db, delta):
    """Add ``delta`` {(state, kind, queue): n} to JobCount: one read, one update, one insert."""
    delta = {key: n for key, n in delta.items() if n}
    if not delta:
        return
    kinds = {kind for _, kind, _ in delta}
    rows = {
        (r.state, r.kind, r.queue_name): r
        for r in JobCount.objects.using(db).filter(kind__in=kinds, state__in={s for s, _, _ in delta})
    }
    changed, created = [], []
    for key, n in delta.items():
        row = rows.get(key)
        if row is None:
            created.append(JobCount(state=key[0], kind=key[1], queue_name=key[2], count=n))
        else:
            row.count += n
            changed.append(row)
    JobCount.objects.using(db).bulk_update(changed, ["count"], batch_size=_CHUNK)
    JobCount.objects.using(db).bulk_create(created, batch_size=_CHUNK)


def catch_up(*, using=None, now=None):
    """Fold every event committed so far (inside the caller's transaction, if any)."""
    db = _db(using)
    with transaction.atomic(using=db):
        while _fold(db, now or timezone.now()) >= settings.METRICS_FOLD_BATCH:
            pass


def forget_jobs(job_ids, *, using=None):
    """Take jobs out of JobCount: call it in the transaction that deletes them, with
    their rows locked, before the delete.

    Their events are folded first (a deleted job's events go with it, unfolded ones
    too); the fold's checkpoint lock stays held until the caller commits, so no fold
    runs between this and the delete."""
    db = _db(using)
    ids = sorted(job_ids)
    with transaction.atomic(using=db):
        catch_up(using=db)
        delta = {}
        for i in range(0, len(ids), _CHUNK):
            gone = (
                Job.objects.using(db)
                .filter(id__in=ids[i : i + _CHUNK])
                .order_by()
                .values_list("state", "kind", "queue_name")
                .annotate(n=Count("id"))
            )
            for state, kind, queue, n in gone:
                delta[(state, kind, queue)] = delta.get((state, kind, queue), 0) - n
        _add_counts(db, delta)


@dataclass(frozen=True)
class Drift:
    state: str
    kind: str
    queue: str
    kept: int  # what JobCount says
    actual: int  # what the job table says

    def __str__(self):
        return f"{self.state} {self.kind} {self.queue}: kept {self.kept}, counted {self.actual}"


def _actual(db):
    return {(s, k, q): n for s, k, q, n in _counted_groups(db)}


def _kept_groups(db):
    """[(state, kind, queue, n)] from JobCount: what a scrape reads, a few rows."""
    rows = JobCount.objects.using(db).values_list("state", "kind", "queue_name", "count")
    return [row for row in rows if row[3]]


def _counted_groups(db):
    """[(state, kind, queue, n)] counted over the job table (verify; the benchmark's before)."""
    return list(
        Job.objects.using(db).order_by().values_list("state", "kind", "queue_name").annotate(n=Count("id"))
    )


def verify(*, using=None, repair=False):
    """Recount the job table against JobCount; return the rows that differ (with
    ``repair``, then rewrite JobCount from the recount).

    Exact on a quiet queue; while workers run, a transition committed between the
    fold and the recount shows as drift that the next verify does not repeat."""
    db = _db(using)
    with transaction.atomic(using=db):
        catch_up(using=db)
        kept = {
            (s, k, q): n
            for s, k, q, n in JobCount.objects.using(db).values_list("state", "kind", "queue_name", "count")
        }
        actual = _actual(db)
        drift = [
            Drift(*key, kept.get(key, 0), actual.get(key, 0))
            for key in sorted(set(kept) | set(actual))
            if kept.get(key, 0) != actual.get(key, 0)
        ]
        if repair and drift:
            MetricsCheckpoint.objects.using(db).filter(id=1).update(counts_from=_recount(db))
    return drift


def _observations(db, rows, jobs):
    """What ``rows`` time, [(metric, at, job_id, seconds)]: claimed events the wait (ready
    to claimed), completed ones the run (claimed to completed, of the same attempt)."""
    observed = []
    for row in rows:
        job = jobs.get(row[JOB])
        if row[TYPE] != EventType.CLAIMED or job is None:
            continue
        # A run_at after the claim was moved since (a retry, a snooze): that wait is unknown.
        if job[2] is not None and job[2] <= row[AT]:
            observed.append((HistogramMetric.WAIT, row[AT], row[JOB], (row[AT] - job[2]).total_seconds()))
    completed = [row for row in rows if row[TYPE] == EventType.COMPLETED and row[JOB] in jobs]
    started = {}
    job_ids = sorted({row[JOB] for row in completed})
    for i in range(0, len(job_ids), _CHUNK):
        claimed = Event.objects.using(db).filter(job_id__in=job_ids[i : i + _CHUNK], type=EventType.CLAIMED)
        for job_id, attempt, at in claimed.values_list("job_id", "attempt", "at").order_by("id"):
            started[(job_id, attempt)] = at
    for row in completed:
        begun = started.get((row[JOB], row[ATTEMPT]))
        if begun is not None:  # else written without a claim
            observed.append(
                (HistogramMetric.RUN, row[AT], row[JOB], max((row[AT] - begun).total_seconds(), 0.0))
            )
    return observed


def _fold_histograms(db, rows, jobs):
    """Add what ``rows`` time (_observations) to JobHistogram; return it, for the flow rollup."""
    adds, observed = {}, _observations(db, rows, jobs)
    bounds = {
        HistogramMetric.WAIT: _bounds(HistogramMetric.WAIT),
        HistogramMetric.RUN: _bounds(HistogramMetric.RUN),
    }
    for metric, _, job_id, seconds in observed:
        _observe(adds, metric, jobs[job_id], seconds, bounds[metric])
    if not adds:
        return observed
    known = {m: set() for m in HistogramMetric.values}
    for metric, kind, queue in JobHistogram.objects.using(db).values_list("metric", "kind", "queue_name"):
        known[metric].add((kind, queue))
    for (metric, kind, queue), (buckets, n, total) in adds.items():
        kinds = {k for k, _ in known[metric]}
        queues = {q for _, q in known[metric]}
        # Labels are capped where they are stored: a histogram per new kind or queue
        # past the cap goes to _other.
        if kind not in kinds and len(kinds) >= settings.METRICS_MAX_KINDS:
            kind = OTHER
        if queue not in queues and len(queues) >= settings.METRICS_MAX_QUEUES:
            queue = OTHER
        known[metric].add((kind, queue))
        row, _ = JobHistogram.objects.using(db).get_or_create(metric=metric, kind=kind, queue_name=queue)
        if len(row.buckets) != len(buckets):
            # The bucket bounds changed in settings: this histogram restarts.
            row.buckets, row.count, row.sum = [0] * len(buckets), 0, 0.0
        row.buckets = [a + b for a, b in zip(row.buckets, buckets)]
        row.count += n
        row.sum += total
        row.save(using=db)
    return observed


def _observe(adds, metric, job, seconds, bounds):
    kind, queue, _ = job
    seconds = max(seconds, 0.0)
    buckets, n, total = adds.get((metric, kind, queue), ([0] * (len(bounds) + 1), 0, 0.0))
    buckets[_bucket(bounds, seconds)] += 1
    adds[(metric, kind, queue)] = (buckets, n + 1, total + seconds)


def _keep(values, first, limit):
    """The label values to report: ``first`` ones, then the busiest, at most ``limit``."""
    ranked = sorted(values.items(), key=lambda kv: (kv[0] not in first, -kv[1], kv[0]))
    return {name for name, _ in ranked[:limit]}


def _histograms(db, metric, bounds, kinds, queues, pairs):
    """{(kind, queue): (per-bucket counts incl. +Inf, count, sum)} of ``metric``, labels
    capped to ``kinds`` and ``queues``, with zeros for ``pairs``."""
    out = {}
    empty = ([0] * (len(bounds) + 1), 0, 0.0)
    rows = JobHistogram.objects.using(db).filter(metric=metric)
    for kind, queue, buckets, count, total in rows.values_list(
        "kind", "queue_name", "buckets", "count", "sum"
    ):
        if len(buckets) != len(bounds) + 1:
            continue  # bounds changed in settings; the next fold restarts it
        key = (kind if kind in kinds else OTHER, queue if queue in queues else OTHER)
        prev = out.get(key, empty)
        out[key] = ([a + b for a, b in zip(prev[0], buckets)], prev[1] + count, prev[2] + total)
    for key in pairs:
        out.setdefault(key, empty)
    return out


def _levels(pending):
    """The priority levels that have pending jobs: one index seek each (jq_ready_prio)."""
    levels, qs = [], pending
    while (level := qs.order_by("priority").values_list("priority", flat=True).first()) is not None:
        levels.append(level)
        qs = pending.filter(priority__gt=level)
    return levels


def _pending(db, groups, pauses, now):
    """The pending jobs per (queue, kind) by status, and the oldest ready job's run_at per
    queue, without a pass over the pending rows (a backlog of millions is normal).

    JobCount gives the pending jobs; a paused queue's or kind's are all paused. Of the
    rest, the not-yet-due ones (scheduled, retrying) and the ready ones due within
    OPS_LATE_SECONDS (not late) are counted by range seeks per priority level on
    jq_ready_prio (priority, run_at): they cost the jobs not due and the recently due,
    never the ready backlog. The remainder is ready, and late; the oldest ready job of a
    queue is one seek per level on jq_ready_queue (queue_name, priority, run_at)."""
    out = {}
    for state, kind, queue, n in groups:
        if state != State.PENDING:
            continue
        row = out[(queue, kind)] = dict.fromkeys(reads.PENDING_COUNTS, 0)
        held = (PauseScope.QUEUE, queue) in pauses or (PauseScope.KIND, kind) in pauses
        row[PAUSED if held else READY] = n
        row[LATE] = 0 if held else n
    rows = Job.objects.using(db).filter(state=State.PENDING).order_by()
    levels = _levels(rows)
    if not levels:
        return out, {}
    # One statement: a range seek per level over the jobs due after late_before(now).
    near = rows.filter(priority__in=levels, run_at__gt=late_before(now))
    counts = near.values_list("queue_name", "kind").annotate(
        scheduled=Count("id", filter=status_q(SCHEDULED, now)),
        retrying=Count("id", filter=status_q(RETRYING, now)),
        recent=Count("id", filter=status_q(READY, now)),
    )
    for queue, kind, scheduled, retrying, recent in counts:
        row = out.setdefault((queue, kind), dict.fromkeys(reads.PENDING_COUNTS, 0))
        row[SCHEDULED] += scheduled
        row[RETRYING] += retrying
        row[READY] -= scheduled + retrying
        row[LATE] -= scheduled + retrying + recent
    # One statement too: per queue and level, its oldest ready job (a seek each).
    ready = sorted({q for (q, _), row in out.items() if row[READY] > 0})
    paused_kinds = sorted(name for scope, name in pauses if scope == PauseScope.KIND)
    oldest = engines.of(connections[db]).oldest_ready(ready, levels, now, paused_kinds)
    for row in out.values():
        # JobCount was folded a moment before these reads: never below zero.
        for name in reads.PENDING_COUNTS:
            row[name] = max(row[name], 0)
    return out, oldest


# The stored states the queues page counts as they are, by its names (reads.LIVE_COUNTS).
_LIVE_STATES = {State.WAITING: "waiting", State.LEASED: "leased", State.DEAD_LETTER: "deadletter"}


def live_counts(*, using=None, now=None):
    """The queues page's live jobs per (queue, kind) by status (reads.LIVE_COUNTS), and
    {queue: its oldest ready job's run_at} (paused queues and kinds left out), read as a
    scrape reads them: JobCount and index seeks (_pending), no pass over the job table.
    As fresh as the last fold (fold_recent)."""
    db = _db(using)
    now = now or timezone.now()
    groups = _kept_groups(db)
    pauses = set(Pause.objects.using(db).values_list("scope", "name"))
    pending, oldest = _pending(db, groups, pauses, now)
    out = {}
    for state, kind, queue, n in groups:
        if state in _LIVE_STATES:
            out.setdefault((queue, kind), dict.fromkeys(reads.LIVE_COUNTS, 0))[_LIVE_STATES[state]] += n
    for key, counts in pending.items():
        row = out.setdefault(key, dict.fromkeys(reads.LIVE_COUNTS, 0))
        for name in PENDING_STATUSES:
            row[name] = counts[name]
    return out, oldest


def _limit_held(db, ready_by_kind, leased_by_kind, now):
    """Ready jobs of kinds whose concurrency or rate limit is spent right now."""
    held = 0
    for row in KindLimit.objects.using(db).filter(kind__in=[k for k, n in ready_by_kind.items() if n]):
        full = row.concurrency is not None and leased_by_kind.get(row.kind, 0) >= row.concurrency
        if row.rate_limit is not None and row.window_start is not None:
            ends = row.window_start + timedelta(seconds=row.rate_period)
            full = full or (now < ends and row.window_count >= row.rate_limit)
        if full:
            held += ready_by_kind[row.kind]
    return held


def fold_recent(*, using=None, now=None):
    """Fold new events in full batches for at most _FOLD_SECONDS (what a scrape or the
    queues page does before it reads); the rest waits for the next caller."""
    db = _db(using)
    started = time.monotonic()
    while fold_events(using=db, now=now) >= settings.METRICS_FOLD_BATCH:
        if time.monotonic() - started > _FOLD_SECONDS:
            break


def rebuild_flow(since, *, using=None, batch=None):
    """Refill the flow rollup (FlowBucket) from the events at or after ``since`` up to
    the fold's checkpoint, and record ``since`` as where it counts from; return how
    many events it read. One pass over those events in id order, ``batch`` at a time,
    under the fold's lock: for a benchmark's seeded history, or once after an upgrade."""
    db = _db(using)
    batch = batch or settings.METRICS_FOLD_BATCH
    with transaction.atomic(using=db):
        catch_up(using=db)
        cp = MetricsCheckpoint.objects.using(db).select_for_update().get(id=1)
        FlowBucket.objects.using(db).all().delete()
        events = Event.objects.using(db).filter(
            at__gte=since, id__lte=cp.last_event_id, type__in=flow_rollup.COUNTED | {EventType.CLAIMED}
        )
        after, read, delta, now = 0, 0, {}, timezone.now()
        while True:
            rows = list(events.filter(id__gt=after).order_by("id").values_list(*_FIELDS)[:batch])
            if not rows:
                break
            after, read = rows[-1][ID], read + len(rows)
            jobs = _jobs(db, {row[JOB] for row in rows})
            observed = _observations(db, rows, jobs)
            flow_rollup.collect(delta, [(row[TYPE], row[JOB], row[AT]) for row in rows], jobs, observed, now)
        flow_rollup.write_fresh(db, delta)
        MetricsCheckpoint.objects.using(db).filter(id=1).update(flow_since=since)
    return read


def snapshot(*, using=None, now=None):
    """Fold new events and read every metric the queue exports."""
    db = _db(using)
    fold_recent(using=db, now=now)
    now = now or timezone.now()
    # The maintained counts, never a count over the job table.
    groups = _kept_groups(db)
    kind_totals, queue_totals = dict.fromkeys(registry.kinds(), 0), {settings.DEFAULT_QUEUE: 0}
    for _, kind, queue, n in groups:
        kind_totals[kind] = kind_totals.get(kind, 0) + n
        queue_totals[queue] = queue_totals.get(queue, 0) + n
    for kind, queue in JobHistogram.objects.using(db).values_list("kind", "queue_name").distinct():
        kind_totals.setdefault(kind, 0)
        queue_totals.setdefault(queue, 0)
    crashed = {k.kind: (k.crashes, k.poisoned) for k in KindCrashes.objects.using(db).all()}
    for kind in crashed:
        kind_totals.setdefault(kind, 0)
    kinds = _keep(kind_totals, set(registry.kinds()) | {OTHER}, settings.METRICS_MAX_KINDS)
    queues = _keep(queue_totals, {settings.DEFAULT_QUEUE}, settings.METRICS_MAX_QUEUES)
    jobs = dict.fromkeys(State.values, 0)
    by_kind, by_queue, leased_by_kind = {}, {}, {}
    pairs = {(kind, settings.DEFAULT_QUEUE) for kind in registry.kinds()}
    for state, kind, queue, n in groups:
        if state == State.LEASED:
            leased_by_kind[kind] = leased_by_kind.get(kind, 0) + n
        kind = kind if kind in kinds else OTHER
        queue = queue if queue in queues else OTHER
        pairs.add((kind, queue))
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
    pauses = set(Pause.objects.using(db).values_list("scope", "name"))
    pending, oldest_ready = _pending(db, groups, pauses, now)
    totals = {name: sum(p[name] for p in pending.values()) for name in reads.PENDING_COUNTS}
    oldest = min(oldest_ready.values(), default=None)
    paused_queues = {name for scope, name in pauses if scope == PauseScope.QUEUE}
    oldest_by_queue = {q: 0.0 for q in queues if q != OTHER and q not in paused_queues}
    for queue, run_at in oldest_ready.items():
        queue = queue if queue in queues else OTHER
        waited = max((now - run_at).total_seconds(), 0.0)
        oldest_by_queue[queue] = max(oldest_by_queue.get(queue, 0.0), waited)
    ready_by_kind = {}
    for (_, kind), p in pending.items():
        ready_by_kind[kind] = ready_by_kind.get(kind, 0) + p[READY]
    by_status = {
        name: totals[name] if name in PENDING_STATUSES else jobs.get(name, 0) for name in JOB_STATUSES
    }
    crashes = dict.fromkeys(kinds, (0, 0))
    for kind, (n, poisoned) in crashed.items():
        key = kind if kind in kinds else OTHER
        prev = crashes.get(key, (0, 0))
        crashes[key] = (prev[0] + n, prev[1] + poisoned)
    held = {
        "pause": totals[PAUSED],
        "limit": _limit_held(db, ready_by_kind, leased_by_kind, now),
        "dependencies": jobs.get(State.WAITING, 0),
    }
    run_bounds, wait_bounds = _bounds(HistogramMetric.RUN), _bounds(HistogramMetric.WAIT)
    return Snapshot(
        at=now,
        jobs=jobs,
        jobs_by_status=by_status,
        late=totals[LATE],
        jobs_by_kind=by_kind,
        jobs_by_queue=by_queue,
        events=events,
        oldest_pending_seconds=max((now - oldest).total_seconds(), 0.0) if oldest else 0.0,
        oldest_ready_by_queue=oldest_by_queue,
        held=held,
        bounds=run_bounds,
        durations=_histograms(db, HistogramMetric.RUN, run_bounds, kinds, queues, pairs),
        wait_bounds=wait_bounds,
        waits=_histograms(db, HistogramMetric.WAIT, wait_bounds, kinds, queues, pairs),
        workers={s: n for s, n in reads.worker_counts(using=db, now=now).items() if s in WORKER_STATES},
        # Each dead_letter job has one unresolved dead letter (dead-lettering writes it,
        # requeue resolves it, prune deletes both): the kept count, not a count of rows.
        dead_letters=jobs.get(State.DEAD_LETTER, 0),
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
    f = GaugeMetricFamily(
        "jobqueue_oldest_ready_seconds",
        "Seconds the oldest ready job of each queue has waited since its run_at (paused queues"
        " left out; 0 when none is ready).",
        labels=["queue"],
    )
    for queue, seconds in sorted(snap.oldest_ready_by_queue.items()):
        f.add_metric([queue], seconds)
    yield f
    f = GaugeMetricFamily(
        "jobqueue_held_jobs",
        "Jobs held back: pending in a paused queue or kind (pause), ready but their kind's"
        " concurrency or rate limit is spent (limit), waiting on dependencies (dependencies).",
        labels=["reason"],
    )
    for reason, n in snap.held.items():
        f.add_metric([reason], n)
    yield f
    yield _histogram(
        "jobqueue_job_duration_seconds",
        "Run time of completed attempts (claimed to completed), by kind and queue.",
        snap.bounds,
        snap.durations,
    )
    yield _histogram(
        "jobqueue_job_wait_seconds",
        "Wait of claimed jobs from ready (run_at) to claimed, by kind and queue.",
        snap.wait_bounds,
        snap.waits,
    )
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


def _histogram(name, doc, bounds, values):
    f = HistogramMetricFamily(name, doc, labels=["kind", "queue"])
    for (kind, queue), (buckets, _count, total) in sorted(values.items()):
        cumulative, acc = [], 0
        for le, n in zip([*map(_le, bounds), "+Inf"], buckets):
            acc += n
            cumulative.append((le, acc))
        f.add_metric([kind, queue], cumulative, sum_value=total)
    return f


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
