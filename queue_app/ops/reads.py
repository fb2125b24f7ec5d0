"""The reads behind the dashboard, the admin's lists, the CLI and the API: one module,
so every surface counts and filters jobs and workers the same way. Statuses come from
``queue_app.models`` (``status_q``, ``Job.status``, ``Worker.status``); nothing here
re-derives them. The dashboard and the API get model rows; the CLI gets plain dicts and
lists, the shape ``--json`` prints. What rows and dicts show of payloads, results, errors
and output is redacted (``redaction``) unless the caller says ``unredacted=True``, which
a surface says only for a principal holding ``redaction.PERMISSION``.

Every function reads the store afresh. None counts the whole job table row by row on
each request where an index can answer instead: state counts group over the (state,
kind) index, the pending breakdown reads only pending rows, lists page by keyset on id
and fetch one row more than they show instead of counting.
"""

import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from django.core.paginator import Paginator
from django.db.models import (
    Count,
    F,
    Max,
    Min,
    Q,
    Sum,
    TextField,
)
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Length, Substr, TruncMinute
from django.utils import timezone
from django.utils.functional import cached_property

from queue_app.conf import settings
from queue_app.exceptions import InvalidJob, JobNotFound
from queue_app.models import (
    LATE,
    LOST,
    PENDING_STATUSES,
    READY,
    STATUSES,
    WORKER_STATUSES,
    DeadLetter,
    Event,
    EventType,
    Job,
    KindCrashes,
    Pause,
    PauseScope,
    State,
    Worker,
    status_q,
)
from queue_app.ops import flow_rollup, redaction
from queue_app.ops import why as explain

# Stored states, in the order every surface shows them.
STATES = (State.WAITING, State.PENDING, State.LEASED, State.COMPLETED, State.DEAD_LETTER, State.CANCELLED)
# The pending breakdown: each pending status, then late (a part of ready).
PENDING_COUNTS = (*PENDING_STATUSES, LATE)
FAILURE_EVENTS = (EventType.FAILED, EventType.DEAD_LETTERED, EventType.RECOVERED)
# Events that end the attempt its claim began (history's attempts, the timeline's entries).
ENDS_ATTEMPT = frozenset(
    {
        EventType.COMPLETED,
        EventType.FAILED,
        EventType.DEAD_LETTERED,
        EventType.RECOVERED,
        EventType.RELEASED,
        EventType.SNOOZED,
        EventType.CANCELLED,
    }
)


# Ids are 64-bit: a larger number is no id (and PostgreSQL refuses to compare with it).
MAX_ID = 2**63 - 1


def as_id(text):
    """``text`` as a job id, or None: ASCII digits only ("²" is a digit to str.isdigit
    but not to int()) and within 64 bits."""
    if not (text and text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if 0 < value <= MAX_ID else None


@dataclass(frozen=True)
class Filters:
    """What the job lists, `inspect` and `requeue --all-matching` narrow jobs by.

    ``state`` takes any name of ``models.STATUSES``: a stored state or a derived status.
    ``q`` is a job id or text in the kind or the idempotency key. ``text`` is text
    anywhere in the payload's or the last error's JSON (the exception's type, message
    and traceback): a scan of the rows the other filters leave, so it is a field of its
    own rather than part of ``q``. ``schedule`` is a cron schedule's name: the jobs it
    enqueued.
    """

    state: str | None = None
    kind: str | None = None
    queue: str | None = None
    q: str | None = None
    text: str | None = None
    schedule: str | None = None
    # False for a reader who sees payloads redacted: ``text`` then matches the exception
    # type only, or searching would tell them what a redacted value holds.
    unredacted: bool = True

    def __post_init__(self):
        for name in ("kind", "queue", "q", "text", "schedule"):
            value = getattr(self, name)
            if value and "\x00" in value:
                # PostgreSQL cannot hold or compare a NUL in text (the query would fail):
                # no kind, queue or key holds one, so the filter matches what it would.
                object.__setattr__(self, name, value.replace("\x00", ""))
        if self.state is not None and self.state not in STATUSES:
            raise InvalidJob(f"unknown state {self.state!r}; choose one of {', '.join(STATUSES)}", "state")

    def apply(self, qs, now=None):
        if self.state:
            qs = qs.status(self.state, now)
        if self.kind:
            qs = qs.filter(kind=self.kind)
        if self.queue:
            qs = qs.filter(queue_name=self.queue)
        if self.q and self.q.strip():
            term = self.q.strip()
            qs = (
                qs.filter(id=int(term))
                if as_id(term) is not None
                else qs.filter(Q(kind__icontains=term) | Q(idempotency_key=term))
            )
        if self.schedule:
            # A schedule's jobs carry keys "schedule:<name>:<tick>" (worker.schedules).
            qs = qs.filter(idempotency_key__startswith=f"schedule:{self.schedule}:")
        if self.text and self.text.strip() and not self.unredacted:
            qs = qs.filter(last_error__type__icontains=self.text.strip())
        elif self.text and self.text.strip():
            term = self.text.strip()
            # alias, not annotate: the text is compared, never sent back with the row.
            qs = qs.alias(
                payload_text=Cast("payload", TextField()), error_text=Cast("last_error", TextField())
            ).filter(Q(payload_text__icontains=term) | Q(error_text__icontains=term))
        return qs


# --- counts ------------------------------------------------------------------------------


def pending_counts(qs=None, now=None):
    """Pending jobs per status (ready, scheduled, retrying, paused, and late among the
    ready) and ``oldest``, the run_at of the longest-waiting ready job (None if none)."""
    now = now or timezone.now()
    qs = (Job.objects.all() if qs is None else qs).filter(state=State.PENDING).order_by()
    return qs.aggregate(
        **{name: Count("id", filter=status_q(name, now)) for name in PENDING_COUNTS},
        oldest=Min("run_at", filter=status_q(READY, now)),
    )


def state_counts(qs=None):
    """Jobs per stored state, every state present (zeros included)."""
    qs = (Job.objects.all() if qs is None else qs).order_by()
    out = dict.fromkeys(State.values, 0)
    out.update(qs.values_list("state").annotate(n=Count("id")).values_list("state", "n"))
    return out


def capped_state_counts(pending=None):
    """Jobs per state for the overview, and the states whose count stopped at
    DASHBOARD_COUNT_CAP.

    Live states are counted exactly over their indexes. Completed and cancelled jobs
    are history that grows without bound: counting a million of them on every refresh
    is the slowest thing the page could do, so they stop at the cap.
    """
    cap = settings.DASHBOARD_COUNT_CAP
    counts, capped = {}, set()
    for state in STATES:
        qs = Job.objects.filter(state=state).order_by()
        if state == State.PENDING and pending is not None:
            counts[state] = pending
        elif state in (State.COMPLETED, State.CANCELLED):
            counts[state] = min(qs[: cap + 1].count(), cap)
            if qs[cap : cap + 1].exists():
                capped.add(state)
        else:
            counts[state] = qs.count()
    return counts, capped


def worker_counts(*, using=None, now=None):
    """Workers per status (every status of WORKER_STATUSES, zeros included) and
    ``jobs_in_hand``, what the workers that are not lost hold."""
    now = now or timezone.now()
    qs = Worker.objects.using(using).order_by()
    out = dict.fromkeys(WORKER_STATUSES, 0)
    out.update(qs.values_list("state").annotate(n=Count("id")))
    for state, n in qs.lost(now).values_list("state").annotate(n=Count("id")).order_by():
        out[state] -= n
        out[LOST] += n
    in_hand = qs.live(now).aggregate(n=Sum("jobs_in_hand"))["n"] or 0
    return {**out, "jobs_in_hand": in_hand}


def pauses():
    """[(Pause, pending jobs it holds back)], for the overview and `pause --list`."""
    out = []
    for p in Pause.objects.all():
        field = "queue_name" if p.scope == PauseScope.QUEUE else "kind"
        out.append((p, Job.objects.pending().filter(**{field: p.name}).count()))
    return out


def kind_crashes():
    """Per kind, the attempts that crashed their worker process and the jobs quarantined
    as poison (KindCrashes), most crashes first."""
    return list(KindCrashes.objects.order_by("-crashes", "kind"))


# The queues page's windows: name -> (length, chart bucket). Each is read from the flow
# rollup (flow_rollup.py: per minute for the chart buckets under an hour, per hour for
# the rest), so its cost follows its buckets and the queues and kinds, never the events.
FLOW_WINDOWS = {
    "5m": (timedelta(minutes=5), timedelta(minutes=1)),
    "15m": (timedelta(minutes=15), timedelta(minutes=1)),
    "1h": (timedelta(hours=1), timedelta(minutes=1)),
    "24h": (timedelta(hours=24), timedelta(hours=1)),
    "7d": (timedelta(days=7), timedelta(hours=6)),
}
FLOW_WINDOW_DEFAULT = "1h"
# What the queues page counts per window: attempts ended, and jobs that came in.
FLOW_SERIES = ("enqueued", "completed", "failed")
# The queues page's live counts per queue and kind.
LIVE_COUNTS = ("waiting", "ready", "scheduled", "retrying", "paused", "leased", "deadletter")


def percentile(values, p):
    """The nearest-rank ``p`` percentile (0 < p <= 1) of ``values``; None when empty.

    >>> percentile([5, 1, 4, 2, 3], 0.5), percentile([5, 1, 4, 2, 3], 0.95), percentile([], 0.5)
    (3, 5, None)
    """
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)]


def flow_window(name):
    """(length, bucket, buckets) of the window called ``name`` (FLOW_WINDOWS), ending now:
    whole buckets, the last of them the one under way. InvalidJob for another name."""
    if name not in FLOW_WINDOWS:
        raise InvalidJob(f"unknown window {name!r}; choose one of {', '.join(FLOW_WINDOWS)}", "window")
    length, bucket = FLOW_WINDOWS[name]
    return length, bucket, int(length / bucket)


def _bucket_start(now, bucket, buckets):
    step = int(bucket.total_seconds())
    epoch = int(now.timestamp()) // step * step
    return datetime.fromtimestamp(epoch, tz=UTC) - bucket * (buckets - 1)


def flow(window=FLOW_WINDOW_DEFAULT, now=None):
    """Per (queue, kind) over ``window``: jobs enqueued and attempts completed and failed,
    in all and per chart bucket, and the p50/p95 queue wait and run time of the attempts
    timed in it. Returns (start, bucket, {(queue, kind): row}).

    Read from the flow rollup (FlowBucket, folded from the event log by the metrics fold:
    call metrics.fold_recent() first for the newest events). Wait is from when the
    attempt was due (the job's run_at) to its claim, run from the claim to the
    completion; the percentiles come from the rollup's sketches, within 10%."""
    now = now or timezone.now()
    length, bucket, buckets = flow_window(window)
    start = _bucket_start(now, bucket, buckets)
    table = {}
    for key, got in flow_rollup.window(start, bucket, buckets).items():
        row = table[key] = _no_flow(buckets)
        for name in FLOW_SERIES:
            row[name] = got[name]
            row[f"{name}_series"] = got[f"{name}_series"]
        row.update(
            wait_p50=flow_rollup.quantile(got["waits"], 0.5),
            wait_p95=flow_rollup.quantile(got["waits"], 0.95),
            run_p50=flow_rollup.quantile(got["runs"], 0.5),
            run_p95=flow_rollup.quantile(got["runs"], 0.95),
            sampled=sum(got["runs"].values()),
            waited=sum(got["waits"].values()),
        )
    minutes = length.total_seconds() / 60
    for r in table.values():
        for name in FLOW_SERIES:
            r[f"{name}_per_minute"] = r[name] / minutes
    return start, bucket, table


def _no_flow(buckets):
    """A flow() row for a queue and kind with nothing in the window."""
    return {
        **dict.fromkeys(FLOW_SERIES, 0),
        **dict.fromkeys((f"{name}_per_minute" for name in FLOW_SERIES), 0.0),
        **{f"{name}_series": [0] * buckets for name in FLOW_SERIES},
        **dict.fromkeys(("wait_p50", "wait_p95", "run_p50", "run_p95"), None),
        "sampled": 0,
        "waited": 0,
    }


def queues(live, oldest, now=None, window=FLOW_WINDOW_DEFAULT):
    """Per queue and kind: ``live`` {(queue, kind): jobs by status (LIVE_COUNTS)}, the
    oldest ready job's run_at of its queue (``oldest`` {queue: run_at}, on the rows with
    ready jobs; a paused queue's jobs are held, not waiting, so never counted there),
    whether its queue or kind is paused, and its flow over ``window`` (flow()). Returns
    (rows, start, bucket). The live counts come from metrics.live_counts(), which reads
    the maintained JobCount and index seeks, not the job table."""
    now = now or timezone.now()
    start, bucket, flows = flow(window, now)
    _, _, buckets = flow_window(window)
    table = {}

    def row(queue, kind):
        if (queue, kind) not in table:
            table[(queue, kind)] = {
                "queue": queue,
                "kind": kind,
                **dict.fromkeys(LIVE_COUNTS, 0),
                "oldest": None,
                **(flows.get((queue, kind)) or _no_flow(buckets)),
            }
        return table[(queue, kind)]

    for (queue, kind), counts in live.items():
        if any(counts.values()):
            target = row(queue, kind)
            target.update(counts)
            target["oldest"] = oldest.get(queue) if counts["ready"] else None
    for queue, kind in flows:
        row(queue, kind)
    paused = {(p.scope, p.name): p for p in Pause.objects.all()}
    for r in table.values():
        # The Pause rows themselves (who, since when, why), or None.
        r["queue_pause"] = paused.get((PauseScope.QUEUE, r["queue"]))
        r["kind_pause"] = paused.get((PauseScope.KIND, r["kind"]))
        r["queue_paused"] = r["queue_pause"] is not None
        r["kind_paused"] = r["kind_pause"] is not None
        r["oldest_ready_seconds"] = max((now - r["oldest"]).total_seconds(), 0.0) if r["oldest"] else None
    return [table[key] for key in sorted(table)], start, bucket


def filter_choices(sample=5000):
    """Kinds and queues seen among the newest live jobs, as hints for the list filters.

    A sample, not DISTINCT over every live row: that scan costs more than the page,
    and the filters take any value typed in the address anyway.
    """
    rows = list(
        Job.objects.filter(state__in=[State.WAITING, State.PENDING, State.LEASED, State.DEAD_LETTER])
        .order_by("-id")
        .values_list("kind", "queue_name")[:sample]
    )
    return {"kinds": sorted({k for k, _ in rows}), "queues": sorted({q for _, q in rows})}


def completions_per_minute(now=None, minutes=60):
    """(start, completed per minute, failed per minute) over the last ``minutes``."""
    now = now or timezone.now()
    start = (now - timedelta(minutes=minutes - 1)).replace(second=0, microsecond=0)
    rows = (
        Event.objects.filter(type__in=[EventType.COMPLETED, *FAILURE_EVENTS], at__gte=start)
        .order_by()
        .annotate(minute=TruncMinute("at"))
        .values("minute", "type")
        .annotate(n=Count("id"))
    )
    done, failed = [0] * minutes, [0] * minutes
    for row in rows:
        i = int((row["minute"] - start).total_seconds() // 60)
        if 0 <= i < minutes:
            (done if row["type"] == EventType.COMPLETED else failed)[i] += row["n"]
    return start, done, failed


def throughput(now=None):
    """Completed and failed attempts over the last minute and the last hour."""
    now = now or timezone.now()
    out = {}
    for label, seconds in (("last_minute", 60), ("last_hour", 3600)):
        row = (
            Event.objects.filter(at__gt=now - timedelta(seconds=seconds))
            .order_by()
            .aggregate(
                completed=Count("id", filter=Q(type=EventType.COMPLETED)),
                failed=Count("id", filter=Q(type__in=FAILURE_EVENTS)),
            )
        )
        out[label] = {**row, "per_minute": round(row["completed"] * 60 / seconds, 2)}
    return out


# --- lists of rows (the dashboard, the admin and the API) -------------------------------


class CappedPaginator(Paginator):
    """Counts at most OPS_COUNT_CAP + 1 rows; past that, ``capped`` is True and the
    count shown is a floor. Counting a million-row filter exactly on every page view
    costs more than the page."""

    @cached_property
    def count(self):
        cap = settings.OPS_COUNT_CAP
        return self.object_list.order_by()[: cap + 1].count()

    @cached_property
    def capped(self):
        return self.count > settings.OPS_COUNT_CAP


@dataclass(frozen=True)
class Page:
    """One page of a keyset-paged list, newest first: ``older`` is the cursor for the next."""

    rows: list
    older: int | None
    first: bool


def _keyset(qs, before, size):
    if before:
        qs = qs.filter(id__lt=before)
    rows = list(qs.order_by("-id")[: size + 1])
    older = rows[size - 1].id if len(rows) > size else None
    return Page(rows=rows[:size], older=older, first=not before)


def _previewed(qs, **json_fields):
    """``qs`` without the JSON columns named (their values may be megabytes each), and with
    ``<name>_preview`` (the first LIST_PREVIEW_CHARS of each one's JSON text),
    ``<name>_size`` (its length) and ``<name>_message`` (a message key's start) instead:
    a list page's size stays bounded whatever its rows hold."""
    n = settings.LIST_PREVIEW_CHARS
    annotations = {}
    for name, with_message in json_fields.items():
        text = Cast(name, TextField())
        annotations[f"{name}_preview"] = Substr(text, 1, n)
        annotations[f"{name}_size"] = Length(text)
        if with_message:
            annotations[f"{name}_message"] = Substr(KeyTextTransform("message", name), 1, n)
    return qs.defer(*json_fields).annotate(**annotations)


def _shown(page, unredacted):
    return replace(page, rows=redaction.rows(page.rows, unredacted))


def job_page(filters=None, *, before=None, size=None, now=None, unredacted=False):
    """Jobs matching ``filters``, newest first, each with its status read in the same query
    and its payload, result and error as bounded previews (_previewed)."""
    now = now or timezone.now()
    qs = (filters or Filters()).apply(Job.objects.with_status(now), now)
    qs = _previewed(qs, payload=False, result=False, last_error=True).defer("metadata")
    return _shown(_keyset(qs, before, size or settings.DASHBOARD_PAGE_SIZE), unredacted)


def kind_of(job_id):
    """The kind of job ``job_id``, or None if there is no such job."""
    return Job.objects.filter(id=job_id).values_list("kind", flat=True).first()


def job_detail(job_id, *, unredacted=False):
    """The job with its whole timeline and dead letters, or None."""
    # Prefetched in the models' own orders (events oldest first, dead letters newest
    # first), so the API's serializer reads the same rows without asking again.
    found = Job.objects.with_status().prefetch_related("events", "dead_letters").filter(id=job_id).first()
    if found is None:
        return None
    events, letters = found.events.all(), found.dead_letters.all()
    found = redaction.revealed(found) if unredacted else redaction.row(found)
    return {
        "job": found,
        "events": redaction.rows(events, unredacted),
        "dead_letters": redaction.rows(letters, unredacted),
    }


def latest_events(filters=None, *, limit=15, unredacted=False):
    """The latest events with their jobs, newest first (kind and queue filters only)."""
    # Only what the rows show of each job: its payload, result and error may be megabytes.
    qs = (
        Event.objects.select_related("job")
        .defer(
            "job__payload",
            "job__result",
            "job__last_error",
            "job__metadata",
            "job__on_success",
            "job__on_failure",
        )
        .order_by("-id")
    )
    if filters and filters.kind:
        qs = qs.filter(job__kind=filters.kind)
    if filters and filters.queue:
        qs = qs.filter(job__queue_name=filters.queue)
    return redaction.rows(qs[:limit], unredacted)


def _dead_letters(resolved, kind=None, error_type=None):
    qs = DeadLetter.objects.filter(resolved_at__isnull=not resolved).annotate(
        error_type=KeyTextTransform("type", "error")
    )
    if kind:
        qs = qs.filter(kind=kind.replace("\x00", ""))
    if error_type:
        qs = qs.filter(error__type=error_type.replace("\x00", ""))
    return qs


def dead_letter_page(*, resolved=False, kind=None, error_type=None, before=None, size=None, unredacted=False):
    """Dead letters, newest first: unresolved ones, or resolved ones; of one kind and
    one exception type when given."""
    qs = _previewed(_dead_letters(resolved, kind, error_type), payload=False, error=True)
    return _shown(_keyset(qs, before, size or settings.DASHBOARD_PAGE_SIZE), unredacted)


def dead_letter_groups(*, resolved=False, kind=None, limit=20):
    """[{kind, error_type, n, newest}]: dead letters grouped by kind and exception type,
    the largest groups first, so fifty letters of one outage read as one line."""
    rows = (
        _dead_letters(resolved, kind)
        .order_by()
        .values("kind", "error_type")
        .annotate(n=Count("id"), newest=Max("created_at"))
        .order_by("-n", "kind", "error_type")[:limit]
    )
    return list(rows)


def worker_rows(*, include_stopped=True, limit=500, order=("state", "-last_heartbeat"), ids=None):
    """Registered workers (the rows); each one's ``status`` says whether it is lost."""
    qs = Worker.objects.all() if include_stopped else Worker.objects.alive()
    if ids is not None:
        qs = qs.filter(id__in=ids)
    return list(qs.order_by(*order)[:limit])


def latest_job_with_key_prefix(prefix):
    """The newest job whose idempotency key starts with ``prefix`` (a schedule's), or None."""
    qs = Job.objects.with_status().filter(idempotency_key__startswith=prefix)
    return qs.defer("payload", "result").order_by("-id").first()


def running_now(*, worker=None, limit=200):
    """Leased jobs, longest running first (claimed but not started last), with their lease
    owner's worker and child: the "running now" view, or only ``worker``'s (a name).
    Payloads are left in the table."""
    qs = Job.objects.filter(state=State.LEASED).defer("payload", "result", "last_error")
    if worker:
        qs = qs.filter(lease_owner__startswith=f"{worker}/")
    return list(qs.order_by(F("started_at").asc(nulls_last=True), "id")[:limit])


def jobs_held_by(names, *, limit=500):
    """{worker name: [(job, child)]}: the leased jobs of the workers named, longest
    running first and the not yet started last, at most ``limit`` in all. A lease owner is ``<name>/<run>/<child>``."""
    if not names:
        return {}
    wanted = Q()
    for name in names:
        wanted |= Q(lease_owner__startswith=f"{name}/")
    out = {}
    qs = Job.objects.filter(wanted, state=State.LEASED).defer("payload", "result", "last_error")
    longest_first = sorted(names, key=len, reverse=True)  # a name may hold a "/"
    for job in qs.order_by(F("started_at").asc(nulls_last=True), "id")[:limit]:
        name = next(n for n in longest_first if job.lease_owner.startswith(f"{n}/"))
        out.setdefault(name, []).append((job, job.lease_owner.rpartition("/")[2]))
    return out


# --- the CLI's dicts --------------------------------------------------------------------


def job_dict(job):
    """A job as --json shows it."""
    return {
        "id": job.id,
        "kind": job.kind,
        "queue": job.queue_name,
        "state": job.state,
        "status": job.status,
        "priority": job.priority,
        "payload": job.payload,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "crashes": job.crashes,
        "idempotency_key": job.idempotency_key,
        "concurrency_key": job.concurrency_key,
        "ordering_key": job.ordering_key,
        "run_at": job.run_at,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "lease_owner": job.lease_owner,
        "lease_expires_at": job.lease_expires_at,
        "timeout": job.timeout,
        "result": job.result,
        "last_error": job.last_error,
        "progress": job.progress,
        "progress_message": job.progress_message,
        "metadata": job.metadata,
        "cancel_requested_at": job.cancel_requested_at,
    }


def event_dict(event):
    return {
        "id": event.id,
        "job_id": event.job_id,
        "type": event.type,
        "at": event.at,
        "attempt": event.attempt,
        "worker": event.worker,
        "from_state": event.from_state,
        "to_state": event.to_state,
        "message": event.message,
        "metadata": event.metadata,
    }


def worker_dict(worker, now=None):
    """A worker as `workers --json` shows it."""
    now = now or timezone.now()
    return {
        "name": worker.name,
        "host": worker.host,
        "pid": worker.pid,
        "status": worker.status,
        "queues": worker.queues,
        "kinds": worker.kinds,
        "concurrency": worker.concurrency,
        "threads": worker.threads,
        "jobs_in_hand": worker.jobs_in_hand,
        "jobs_done": worker.jobs_done,
        "started_at": worker.started_at.isoformat(),
        "heartbeat_age": max(0.0, (now - worker.last_heartbeat).total_seconds()),
        "stop_requested": worker.stop_requested_at is not None,
        "quiet_requested": worker.quiet_requested_at is not None,
    }


def counts(filters=None, now=None):
    """Jobs per state (every state, zeros included) and the pending breakdown, of the jobs
    of ``filters``' kind and queue."""
    filters = filters or Filters()
    now = now or timezone.now()
    qs = Filters(kind=filters.kind, queue=filters.queue).apply(Job.objects.all(), now)
    pending = pending_counts(qs, now)
    oldest = pending.pop("oldest")
    pending["oldest_ready_seconds"] = round((now - oldest).total_seconds(), 3) if oldest else 0.0
    return {"states": state_counts(qs), "pending": pending}


def jobs(filters=None, *, limit=20, now=None, unredacted=False):
    """The newest jobs matching ``filters``."""
    now = now or timezone.now()
    qs = (filters or Filters()).apply(Job.objects.with_status(now), now)
    return redaction.data([job_dict(j) for j in qs.order_by("-id")[:limit]], unredacted)


def recent_events(filters=None, *, limit=10, unredacted=False):
    """The latest events, newest first, of jobs matching the kind and queue filters."""
    rows = latest_events(filters, limit=limit, unredacted=unredacted)
    return [{**event_dict(e), "kind": e.job.kind} for e in rows]


def snapshot(filters=None, *, limit=20, events=10, now=None, unredacted=False):
    """What `inspect` shows: counts, the latest jobs and the latest events."""
    now = now or timezone.now()
    return {
        "at": now,
        "filters": {"state": filters.state, "kind": filters.kind, "queue": filters.queue} if filters else {},
        **counts(filters, now),
        "jobs": jobs(filters, limit=limit, now=now, unredacted=unredacted),
        "events": recent_events(filters, limit=events, unredacted=unredacted),
    }


def workers(*, include_stopped=False, now=None):
    """What `workers --json` shows: the registry, newest first."""
    now = now or timezone.now()
    rows = worker_rows(include_stopped=include_stopped, limit=None, order=("-started_at", "-id"))
    return [worker_dict(w, now) for w in rows]


def status(now=None):
    """What `status` shows: counts by state, workers and throughput."""
    now = now or timezone.now()
    return {
        "at": now,
        **counts(None, now),
        "workers": worker_counts(now=now),
        "dead_letters_open": DeadLetter.objects.unresolved().count(),
        "throughput": throughput(now),
    }


def history(job_id, *, unredacted=False):
    """A job, its whole event timeline, and one entry per attempt with its outcome."""
    job = Job.objects.with_status().filter(id=job_id).first()
    if job is None:
        raise JobNotFound(job_id)
    events = list(job.events.order_by("id"))
    attempts, current = [], None
    for e in events:
        if e.type == EventType.CLAIMED:
            current = {
                "attempt": e.attempt,
                "worker": e.worker,
                "started_at": e.at,
                "finished_at": None,
                "outcome": "running",
                "seconds": None,
                "result": None,
                "error": None,
                "output": None,
            }
            attempts.append(current)
        elif current is not None and e.type in ENDS_ATTEMPT:
            current["finished_at"] = e.at
            current["seconds"] = round((e.at - current["started_at"]).total_seconds(), 3)
            current["outcome"] = e.type
            current["error"] = (e.metadata or {}).get("error")
            # What the handler printed and logged (capture.py), when it printed anything.
            current["output"] = (e.metadata or {}).get("output")
            if e.type == EventType.COMPLETED:
                # Only the last completion's value is stored on the job.
                current["result"] = job.result
            current = None
    out = {
        "job": job_dict(job),
        "why": explain.why(job).as_dict() if job.state in (State.PENDING, State.WAITING) else None,
        "events": [event_dict(e) for e in events],
        "attempts": attempts,
        "dead_letters": [
            {
                "id": d.id,
                "created_at": d.created_at,
                "attempts": d.attempts,
                "reason": d.reason,
                "error": d.error,
                "resolved_at": d.resolved_at,
                "resolution": d.resolution,
            }
            for d in job.dead_letters.order_by("id")
        ],
    }
    return redaction.data(out, unredacted)


def dead_letters(*, kind=None, since=None, include_resolved=False, limit=50, now=None, unredacted=False):
    """Dead letters, newest first; ``since`` is seconds back from now."""
    now = now or timezone.now()
    qs = DeadLetter.objects.order_by("-id")
    if not include_resolved:
        qs = qs.unresolved()
    if kind:
        qs = qs.filter(kind=kind)
    if since is not None:
        qs = qs.filter(created_at__gte=now - timedelta(seconds=since))
    rows = [
        {
            "id": d.id,
            "job_id": d.job_id,
            "kind": d.kind,
            "payload": d.payload,
            "attempts": d.attempts,
            "reason": d.reason,
            "error": d.error,
            "created_at": d.created_at,
            "resolved_at": d.resolved_at,
            "resolution": d.resolution,
        }
        for d in qs[:limit]
    ]
    return redaction.data(rows, unredacted)
