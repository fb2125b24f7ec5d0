"""What the dashboard's pages and the admin's columns show, laid out for templates over
the reads in ``queue_app.ops.reads``. Nothing here queries: views call these and render.
"""

import json
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from queue_app.conf import settings
from queue_app.core import durations, flow, ordering
from queue_app.models import (
    LATE,
    LOST,
    PENDING_STATUSES,
    STATUSES,
    WORKER_STATUSES,
    EventType,
    State,
    WorkerState,
)
from queue_app.ops import flow_rollup, metrics, reads
from queue_app.worker import schedules as scheduling

# Names shown for statuses whose identifier reads badly.
_LABELS = {State.DEAD_LETTER: "dead letter"}


def status_choices():
    """(name, label, meaning) for every status a list filters by, in display order."""
    late = int(settings.OPS_LATE_SECONDS)
    labels = {**_LABELS, LATE: f"late (ready > {late}s)"}
    return [(name, labels.get(name, name), meaning) for name, meaning in STATUSES.items()]


def worker_status_choices():
    """(name, meaning) for every worker status, in display order."""
    return list(WORKER_STATUSES.items())


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


# --- overview ------------------------------------------------------------------------


@dataclass(frozen=True)
class Chart:
    """Completed and failed attempts per minute over the last hour, as SVG geometry."""

    bars: list
    max: int
    completed: int
    failed: int
    width: int = 600
    height: int = 120


ENDS_ATTEMPT = reads.ENDS_ATTEMPT
# Tracebacks go through these packages before they reach a handler's own code.
MACHINERY = ("/queue_app/worker/", "/queue_app/tasks/", "/queue_app/handlers/")


def _stamp(text, default):
    try:
        return datetime.fromisoformat(text) if text else default
    except (TypeError, ValueError):
        return default


def _due_after(event, due):
    """When the job was next due after ``event`` (it waited from then to its next claim)."""
    meta = event.metadata or {}
    if event.type == EventType.ENQUEUED:
        return _stamp(meta.get("run_at"), event.at)
    if event.type == EventType.FAILED:
        return _stamp(meta.get("retry_at"), event.at)
    if event.type == EventType.SNOOZED:
        return _stamp(meta.get("run_at"), event.at)
    if event.type in (EventType.RESCHEDULED, EventType.REQUEUED, EventType.RELEASED, EventType.RECOVERED):
        return event.at
    return due


def timeline(events):
    """A job's events as timeline entries, oldest first: each claim and the event that
    ended its attempt make one entry ({"event": the end, "claim": the claim, "ran": the
    time between, "waited": from when it was due to its claim}), so ten attempts read as
    ten entries, not twenty; every other event is an entry of its own (claim None). A
    claim still open is an entry with the claim as its event and "waited" set."""
    entries, open_claims, due = [], {}, None
    for event in events:
        if event.type == EventType.CLAIMED:
            waited = max(event.at - due, timedelta(0)) if due else None
            open_claims[event.attempt] = len(entries)
            entries.append({"event": event, "claim": None, "ran": None, "waited": waited})
            continue
        due = _due_after(event, due)
        at = open_claims.pop(event.attempt, None) if event.type in ENDS_ATTEMPT else None
        if at is None:
            entries.append({"event": event, "claim": None, "ran": None, "waited": None})
            continue
        opened = entries[at]
        entries[at] = None
        claim = opened["event"]
        entries.append(
            {"event": event, "claim": claim, "ran": event.at - claim.at, "waited": opened["waited"]}
        )
    return [entry for entry in entries if entry is not None]


def user_traceback(text):
    """``text`` without the leading frames of the queue's own machinery (the worker
    calling the handler), with a line saying how many were left out; the stored
    traceback keeps them."""
    if not text:
        return text
    lines = text.splitlines()
    if not lines[0].startswith("Traceback"):
        return text
    i, hidden = 1, 0
    while i < len(lines) and lines[i].startswith('  File "') and any(m in lines[i] for m in MACHINERY):
        i += 1
        while i < len(lines) and lines[i].startswith("    "):
            i += 1
        hidden += 1
    if not hidden or i >= len(lines) or not lines[i].startswith('  File "'):
        return text  # nothing of the handler's own below: keep it whole
    note = f"  ({hidden} frame{'s' if hidden != 1 else ''} of jobqueue's worker left out)"
    return "\n".join([lines[0], note, *lines[i:]])


def job_timing(job, entries, now=None):
    """The job page's timing facts from its timeline entries, as short strings ("" where
    they do not apply): the latest attempt's queue wait and run time (or how long it has
    been running), and when a pending job runs next."""
    now = now or timezone.now()
    out = {"waited": "", "ran": "", "running_for": "", "next_in": "", "next_is_retry": False}
    attempts = [e for e in entries if e["claim"] is not None or e["event"].type == EventType.CLAIMED]
    if attempts:
        latest = attempts[-1]
        if latest["waited"] is not None:
            out["waited"] = durations.format(latest["waited"].total_seconds())
        if latest["ran"] is not None:
            out["ran"] = durations.format(max(0.0, latest["ran"].total_seconds()))
        elif job.state == State.LEASED:
            out["running_for"] = durations.format(max(0.0, (now - latest["event"].at).total_seconds()))
    if job.state == State.PENDING and job.run_at > now:
        out["next_in"] = age(now, job.run_at)
        out["next_is_retry"] = job.attempts > 0
    return out


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


def pending_breakdown(now=None):
    """The overview's pending panel: reads.pending_counts with the oldest ready job's age."""
    now = now or timezone.now()
    row = reads.pending_counts(now=now)
    row["oldest_age"] = age(row["oldest"], now) if row["oldest"] else ""
    row["oldest_seconds"] = (now - row["oldest"]).total_seconds() if row["oldest"] else 0
    return row


def workers_summary(now=None):
    """Workers alive (running, quiet or stopping), lost, and the jobs the alive ones hold."""
    counts = reads.worker_counts(now=now)
    alive = counts[WorkerState.RUNNING] + counts[WorkerState.QUIET] + counts[WorkerState.STOPPING]
    return {"alive": alive, "lost": counts[LOST], "in_hand": counts["jobs_in_hand"]}


def overview(now=None, *, unredacted=False):
    now = now or timezone.now()
    pending = pending_breakdown(now)
    counts, capped = reads.capped_state_counts(sum(pending[s] for s in PENDING_STATUSES))
    return {
        "now": now,
        "counts": counts,
        "capped": capped,
        "cap": settings.DASHBOARD_COUNT_CAP,
        "pending": pending,
        "workers": workers_summary(now),
        "chart": chart(*reads.completions_per_minute(now)),
        "events": reads.latest_events(limit=15, unredacted=unredacted),
        "paused": reads.pauses(),
    }


@dataclass(frozen=True)
class Spark:
    """One queue and kind's flow over the window as SVG geometry: completed and failed
    attempts as stacked bars, jobs enqueued as a line over them, on one scale."""

    bars: list
    line: str
    max: int
    label: str
    width: int = 160
    height: int = 32


def spark(row, start, bucket, width=160, height=32):
    """Lay out ``row``'s flow series (reads.flow) for a small inline SVG."""
    done, failed, came = row["completed_series"], row["failed_series"], row["enqueued_series"]
    top = max([d + f for d, f in zip(done, failed)] + came + [1])
    slot = width / len(done)
    stamp = "%H:%M" if bucket < timedelta(hours=1) else "%d %H:00"
    per = bucket_name(bucket)
    bars, points = [], []
    for i, (d, f, c) in enumerate(zip(done, failed, came)):
        hd, hf = height * d / top, height * f / top
        at = timezone.localtime(start + bucket * i)
        bars.append(
            {
                "x": round(i * slot + 0.5, 1),
                "w": round(max(slot - 1, 0.5), 1),
                "yd": round(height - hd, 1),
                "hd": round(hd, 1),
                "yf": round(height - hd - hf, 1),
                "hf": round(hf, 1),
                "label": f"{at:{stamp}}: {c} enqueued, {d} completed, {f} failed",
            }
        )
        points.append(f"{round((i + 0.5) * slot, 1)},{round(height - height * c / top, 1)}")
    label = (
        f"{row['enqueued']} enqueued, {row['completed']} completed, {row['failed']} failed "
        f"in the window; busiest {per} {top}"
    )
    return Spark(bars=bars, line=" ".join(points), max=top, label=label, width=width, height=height)


def bucket_name(bucket):
    """A chart bucket in words: minute, hour, 6 hours."""
    if bucket == timedelta(minutes=1):
        return "minute"
    if bucket == timedelta(hours=1):
        return "hour"
    return f"{int(bucket.total_seconds() // 3600)} hours"


def queues(now=None, window=reads.FLOW_WINDOW_DEFAULT, limits=()):
    """The queues page: reads.queues() rows over ``window``, each with its flow chart, its
    kind's limit (of ``limits``, as limits() gives them) and what its Pause/Resume buttons
    act on: (scope, name, paused now) for its queue and its kind. The newest events are
    folded into the flow rollup first (metrics.fold_recent), as a scrape does."""
    metrics.fold_recent()
    now = now or timezone.now()
    live, oldest = metrics.live_counts(now=now)
    rows, start, bucket = reads.queues(live, oldest, now, window)
    since = flow_rollup.since()
    by_kind = {entry["limit"].kind: entry for entry in limits}
    for r in rows:
        r["limit"] = by_kind.get(r["kind"])
        r["pause_targets"] = [("queue", r["queue"], r["queue_paused"]), ("kind", r["kind"], r["kind_paused"])]
        r["spark"] = spark(r, start, bucket)
    return {
        "rows": rows,
        "window": window,
        "windows": list(reads.FLOW_WINDOWS),
        "per": bucket_name(bucket),
        # The rollup began inside the window: it counts only from then.
        "counted_since": since if since and since > start else None,
    }


def crashes():
    """The queues page's crashes panel: per kind, crashes and poison pills (reads.kind_crashes)."""
    return reads.kind_crashes()


def limits():
    """The queues page's limits panel: each kind limit with what it holds back now."""
    return [
        {"limit": row, "leased": leased, "in_window": in_window, "keys_full": full}
        for row, leased, in_window, full in flow.limit_status()
    ]


def schedules(now=None):
    """The schedules page's rows: each schedule, its next run ("" when disabled or its
    expression no longer evaluates) and its latest job with that job's status."""
    now = now or timezone.now()
    rows = []
    for schedule, upcoming in scheduling.overview(now):
        latest = reads.latest_job_with_key_prefix(scheduling.key_prefix(schedule.name))
        rows.append(
            {
                "schedule": schedule,
                "next_run": upcoming,
                "next_in": age(now, upcoming) if upcoming else "",
                "latest": latest,
                "latest_status": latest.status if latest else "",
            }
        )
    return rows


def running(now=None, worker=None):
    """The running-now page's rows (only ``worker``'s, a name, if given): each leased job
    with its worker (the registered row whose name starts its lease owner), child, thread
    (from the worker's last heartbeat, Worker.running_threads; None until a heartbeat has
    seen it running), runtime and time left on its lease."""
    now = now or timezone.now()
    jobs = reads.running_now(worker=worker)
    alive = {w.name: w for w in reads.worker_rows(include_stopped=False)}
    names = sorted(alive, key=len, reverse=True)
    rows = []
    for job in jobs:
        worker = next((n for n in names if job.lease_owner.startswith(f"{n}/")), "")
        rows.append(
            {
                "job": job,
                "worker": worker or job.lease_owner.split("/")[0],
                "child": job.lease_owner.rpartition("/")[2],
                "thread": (alive[worker].running_threads or {}).get(str(job.id)) if worker else None,
                "running_for": age(job.started_at, now) if job.started_at else "",
                "lease_left": durations.format(max(0.0, (job.lease_expires_at - now).total_seconds()))
                if job.lease_expires_at
                else "",
                "lease_lapsed": bool(job.lease_expires_at and job.lease_expires_at < now),
            }
        )
    return rows


def workers(now=None):
    """The workers page's rows: each worker, its status, its heartbeat's age and the jobs
    it holds now (each with its child process and how long it has run)."""
    now = now or timezone.now()
    rows = reads.worker_rows()
    held = reads.jobs_held_by([w.name for w in rows if w.state != WorkerState.STOPPED])
    return [
        {
            "worker": w,
            "status": w.status,
            "heartbeat_age": age(w.last_heartbeat, now),
            "held": [
                {
                    "job": job,
                    "child": child,
                    "thread": (w.running_threads or {}).get(str(job.id)),
                    "running_for": age(job.started_at, now) if job.started_at else "",
                }
                for job, child in held.get(w.name, [])
            ],
        }
        for w in rows
    ]
