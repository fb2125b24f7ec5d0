"""What the dashboard's pages and the admin's columns show, laid out for templates over
the reads in ``queue_app.ops.reads``. Nothing here queries: views call these and render.
"""

import json
from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone

from queue_app.conf import settings
from queue_app.core import ordering
from queue_app.models import LATE, LOST, PENDING_STATUSES, STATUSES, WORKER_STATUSES, State, WorkerState
from queue_app.ops import reads

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
    """Workers alive (running or stopping), lost, and the jobs the alive ones hold."""
    counts = reads.worker_counts(now=now)
    alive = counts[WorkerState.RUNNING] + counts[WorkerState.STOPPING]
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


def workers(now=None):
    """The workers page's rows: each worker, its status and its heartbeat's age."""
    now = now or timezone.now()
    return [
        {"worker": w, "status": w.status, "heartbeat_age": age(w.last_heartbeat, now)}
        for w in reads.worker_rows()
    ]
