"""The reads behind the dashboard and the admin's list columns. Views call these and
render; they run no queries of their own.

Every function reads the store afresh. None counts the whole job table row by row
on each request where an index can answer instead: state counts group over the
(state, kind) index, the pending breakdown reads only pending rows (a partial or
state-prefixed index), lists page by keyset on id and fetch one row more than they
show instead of counting.
"""

import json
from dataclasses import dataclass
from datetime import timedelta

from django.core.paginator import Paginator
from django.db.models import Count, Min, Q
from django.db.models.functions import TruncMinute
from django.utils import timezone
from django.utils.functional import cached_property

from queue_app.conf import settings
from queue_app.core import ordering
from queue_app.models import DeadLetter, Event, EventType, Job, State, Worker, WorkerState

# Shown in this order everywhere.
STATES = [State.PENDING, State.LEASED, State.COMPLETED, State.DEAD_LETTER, State.CANCELLED]
# Statuses a list can filter on: the states plus the derived views of pending.
STATUSES = ["ready", "scheduled", "retrying", "late", *STATES]
FAILURE_EVENTS = [EventType.FAILED, EventType.DEAD_LETTERED, EventType.RECOVERED]


# --- small helpers the templates and the admin share ---------------------------------


def age(then, now=None):
    """A short human duration: 45s, 12m, 3h 5m, 2d 4h."""
    if then is None:
        return ""
    seconds = int(((now or timezone.now()) - then).total_seconds())
    sign, seconds = ("-" if seconds < 0 else ""), abs(seconds)
    if seconds < 60:
        return f"{sign}{seconds}s"
    if seconds < 3600:
        return f"{sign}{seconds // 60}m"
    if seconds < 86400:
        return f"{sign}{seconds // 3600}h {seconds % 3600 // 60}m"
    return f"{sign}{seconds // 86400}d {seconds % 86400 // 3600}h"


def json_text(value):
    """JSON as an operator edits it: indented, keys sorted, non-ASCII kept."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def effective_priority(job, now=None):
    """The priority the claim sees now (aging included); None unless the job is pending."""
    if job.state != State.PENDING:
        return None
    return ordering.effective_priority(
        job.priority, job.run_at, now or timezone.now(), settings.AGING_INTERVAL
    )


def status(job, now=None):
    """State as operators read it: pending splits into ready, scheduled, retrying."""
    now = now or timezone.now()
    if job.state != State.PENDING:
        return job.state
    if job.attempts > 0:
        return "retrying"
    return "scheduled" if job.run_at > now else "ready"


def worker_status(worker, now=None):
    """running, stopping, stopped, or lost: alive on paper but silent past a lease."""
    now = now or timezone.now()
    if worker.state != WorkerState.STOPPED and worker.last_heartbeat < now - lost_after():
        return "lost"
    return worker.state


def lost_after():
    # A worker renews its leases on each heartbeat; one silent for a whole lease has
    # let them lapse, so it is no longer doing its work whatever its row says.
    return timedelta(seconds=float(settings.LEASE_SECONDS))


def filter_status(qs, status_name, now=None):
    """Narrow a Job queryset to a state or a derived status (ready, late, ...)."""
    now = now or timezone.now()
    if status_name == "ready":
        return qs.filter(state=State.PENDING, run_at__lte=now, attempts=0)
    if status_name == "scheduled":
        return qs.filter(state=State.PENDING, run_at__gt=now, attempts=0)
    if status_name == "retrying":
        return qs.filter(state=State.PENDING, attempts__gt=0)
    if status_name == "late":
        return qs.filter(state=State.PENDING, run_at__lte=now - timedelta(seconds=settings.OPS_LATE_SECONDS))
    if status_name in State.values:
        return qs.filter(state=status_name)
    return qs


class CappedPaginator(Paginator):
    """Counts at most OPS_COUNT_CAP + 1 rows; past that, ``capped`` is True and the
    count shown is a floor. Counting a million-row filter exactly on every page view
    costs more than the page."""

    @cached_property
    def count(self):
        cap = settings.OPS_COUNT_CAP
        n = self.object_list.order_by()[: cap + 1].count()
        return n

    @cached_property
    def capped(self):
        return self.count > settings.OPS_COUNT_CAP


# --- overview ------------------------------------------------------------------------


def state_counts(pending=None):
    """Jobs per state, and the states whose count stopped at DASHBOARD_COUNT_CAP.

    Live states are counted exactly over their indexes. Completed and cancelled
    jobs are history that grows without bound: counting a million of them on every
    refresh is the slowest thing the page could do, so they stop at the cap.
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


def pending_breakdown(now=None):
    """Ready, scheduled, retrying and late among pending jobs, and the oldest ready one."""
    now = now or timezone.now()
    late = now - timedelta(seconds=settings.OPS_LATE_SECONDS)
    row = (
        Job.objects.pending()
        .order_by()
        .aggregate(
            ready=Count("id", filter=Q(run_at__lte=now, attempts=0)),
            scheduled=Count("id", filter=Q(run_at__gt=now, attempts=0)),
            retrying=Count("id", filter=Q(attempts__gt=0)),
            late=Count("id", filter=Q(run_at__lte=late)),
            oldest=Min("run_at", filter=Q(run_at__lte=now)),
        )
    )
    row["oldest_age"] = age(row["oldest"], now) if row["oldest"] else ""
    row["oldest_seconds"] = (now - row["oldest"]).total_seconds() if row["oldest"] else 0
    return row


def workers_summary(now=None):
    now = now or timezone.now()
    workers = list(Worker.objects.alive())
    lost = sum(1 for w in workers if worker_status(w, now) == "lost")
    return {"alive": len(workers) - lost, "lost": lost, "in_hand": sum(w.jobs_in_hand for w in workers)}


@dataclass(frozen=True)
class Chart:
    """Completed and failed attempts per minute over the last hour, as SVG geometry."""

    bars: list
    max: int
    completed: int
    failed: int
    width: int = 600
    height: int = 120


def throughput(now=None, minutes=60):
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
    return chart(start, done, failed)


def chart(start, done, failed, width=600, height=120):
    """Lay out stacked bars (completed under failed) for an inline SVG."""
    top = max([d + f for d, f in zip(done, failed)] + [1])
    slot = width / len(done)
    bars = []
    for i, (d, f) in enumerate(zip(done, failed)):
        hd, hf = height * d / top, height * f / top
        bars.append(
            {
                "x": round(i * slot + 1, 1),
                "w": round(max(slot - 2, 1), 1),
                "yd": round(height - hd, 1),
                "hd": round(hd, 1),
                "yf": round(height - hd - hf, 1),
                "hf": round(hf, 1),
                "label": f"{(start + timedelta(minutes=i)):%H:%M} — {d} completed, {f} failed",
            }
        )
    return Chart(bars=bars, max=top, completed=sum(done), failed=sum(failed), width=width, height=height)


def recent_events(limit=15):
    return list(Event.objects.select_related("job").order_by("-id")[:limit])


def overview(now=None):
    now = now or timezone.now()
    pending = pending_breakdown(now)
    counts, capped = state_counts(pending["ready"] + pending["scheduled"] + pending["retrying"])
    return {
        "now": now,
        "counts": counts,
        "capped": capped,
        "cap": settings.DASHBOARD_COUNT_CAP,
        "pending": pending,
        "workers": workers_summary(now),
        "chart": throughput(now),
        "events": recent_events(),
    }


# --- lists -----------------------------------------------------------------------------


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


def jobs(*, status=None, kind=None, queue=None, q=None, before=None, size=None, now=None):
    """Filtered jobs, newest first. ``q`` is a job id or a search over kind and key."""
    qs = filter_status(Job.objects.all(), status, now)
    if kind:
        qs = qs.filter(kind=kind)
    if queue:
        qs = qs.filter(queue_name=queue)
    if q:
        q = q.strip()
        qs = qs.filter(id=int(q)) if q.isdigit() else qs.filter(Q(kind__icontains=q) | Q(idempotency_key=q))
    return _keyset(qs, before, size or settings.DASHBOARD_PAGE_SIZE)


def job(job_id):
    """The job with its whole timeline and dead letters, or None."""
    found = Job.objects.filter(id=job_id).first()
    if found is None:
        return None
    return {
        "job": found,
        "events": list(found.events.order_by("id")),
        "dead_letters": list(found.dead_letters.order_by("-id")),
    }


def dead_letters(*, resolved=False, before=None, size=None):
    qs = DeadLetter.objects.filter(resolved_at__isnull=not resolved)
    return _keyset(qs, before, size or settings.DASHBOARD_PAGE_SIZE)


def workers(now=None):
    now = now or timezone.now()
    rows = list(Worker.objects.order_by("state", "-last_heartbeat")[:500])
    return [
        {"worker": w, "status": worker_status(w, now), "heartbeat_age": age(w.last_heartbeat, now)}
        for w in rows
    ]


def queues():
    """Live jobs (pending, leased, dead) per queue and kind; finished ones are history."""
    live = [State.PENDING, State.LEASED, State.DEAD_LETTER]
    table = {}
    rows = (
        Job.objects.filter(state__in=live)
        .order_by()
        .values("queue_name", "kind", "state")
        .annotate(n=Count("id"))
    )
    for row in rows:
        key = (row["queue_name"], row["kind"])
        table.setdefault(key, dict.fromkeys(live, 0))[row["state"]] = row["n"]
    return [
        {"queue": q, "kind": k, **{s.replace("_", ""): n for s, n in counts.items()}}
        for (q, k), counts in sorted(table.items())
    ]


def filter_choices(sample=5000):
    """Kinds and queues seen among the newest live jobs, as hints for the list filters.

    A sample, not DISTINCT over every live row: that scan costs more than the page,
    and the filters take any value typed in the address anyway.
    """
    rows = list(
        Job.objects.filter(state__in=[State.PENDING, State.LEASED, State.DEAD_LETTER])
        .order_by("-id")
        .values_list("kind", "queue_name")[:sample]
    )
    return {"kinds": sorted({k for k, _ in rows}), "queues": sorted({q for _, q in rows})}
