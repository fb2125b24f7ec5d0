"""Read-only views of the queue for the command line: jobs, counts, a job's history,
dead letters and throughput. Every function returns plain dicts and lists, the shape
``--json`` prints; the commands render the same data as tables.
"""

from dataclasses import dataclass
from datetime import timedelta

from django.db.models import Count, Min, Q
from django.utils import timezone

from queue_app.exceptions import InvalidJob, JobNotFound
from queue_app.models import DeadLetter, Event, EventType, Job, State
from queue_app.worker import registry as workers

# Filters accept a stored state or a status derived from a pending job's fields.
DERIVED = ("ready", "scheduled", "retrying")
STATUSES = (*State.values, *DERIVED)
FAILURE_EVENTS = (EventType.FAILED, EventType.DEAD_LETTERED, EventType.RECOVERED)


@dataclass(frozen=True)
class Filters:
    """What `inspect`, `requeue --all-matching` and friends narrow jobs by."""

    state: str | None = None
    kind: str | None = None
    queue: str | None = None

    def __post_init__(self):
        if self.state is not None and self.state not in STATUSES:
            raise InvalidJob(f"unknown state {self.state!r}; choose one of {', '.join(STATUSES)}", "state")

    def apply(self, qs, now=None):
        now = now or timezone.now()
        if self.state == "ready":
            qs = qs.filter(state=State.PENDING, run_at__lte=now, attempts=0)
        elif self.state == "scheduled":
            qs = qs.filter(state=State.PENDING, run_at__gt=now, attempts=0)
        elif self.state == "retrying":
            qs = qs.filter(state=State.PENDING, attempts__gt=0)
        elif self.state:
            qs = qs.filter(state=self.state)
        if self.kind:
            qs = qs.filter(kind=self.kind)
        if self.queue:
            qs = qs.filter(queue_name=self.queue)
        return qs


def job_dict(job, now=None):
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
        "idempotency_key": job.idempotency_key,
        "concurrency_key": job.concurrency_key,
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


def counts(filters=None, now=None):
    """Jobs per state (every state, zeros included) and the pending breakdown."""
    filters = filters or Filters()
    now = now or timezone.now()
    qs = Filters(kind=filters.kind, queue=filters.queue).apply(Job.objects.order_by(), now)
    by_state = dict.fromkeys(State.values, 0)
    by_state.update(qs.values_list("state").annotate(n=Count("id")).values_list("state", "n"))
    pending = qs.filter(state=State.PENDING).aggregate(
        ready=Count("id", filter=Q(run_at__lte=now, attempts=0)),
        scheduled=Count("id", filter=Q(run_at__gt=now, attempts=0)),
        retrying=Count("id", filter=Q(attempts__gt=0)),
        oldest=Min("run_at", filter=Q(run_at__lte=now)),
    )
    oldest = pending.pop("oldest")
    pending["oldest_ready_seconds"] = round((now - oldest).total_seconds(), 3) if oldest else 0.0
    return {"states": by_state, "pending": pending}


def jobs(filters=None, *, limit=20, now=None):
    """The newest jobs matching ``filters``."""
    filters = filters or Filters()
    return [job_dict(j, now) for j in filters.apply(Job.objects.order_by("-id"), now)[:limit]]


def recent_events(filters=None, *, limit=10):
    """The latest events, newest first, of jobs matching the kind and queue filters."""
    qs = Event.objects.select_related("job").order_by("-id")
    if filters and filters.kind:
        qs = qs.filter(job__kind=filters.kind)
    if filters and filters.queue:
        qs = qs.filter(job__queue_name=filters.queue)
    return [{**event_dict(e), "kind": e.job.kind} for e in qs[:limit]]


def snapshot(filters=None, *, limit=20, events=10, now=None):
    """What `inspect` shows: counts, the latest jobs and the latest events."""
    now = now or timezone.now()
    return {
        "at": now,
        "filters": {"state": filters.state, "kind": filters.kind, "queue": filters.queue} if filters else {},
        **counts(filters, now),
        "jobs": jobs(filters, limit=limit, now=now),
        "events": recent_events(filters, limit=events),
    }


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


def status(now=None):
    """What `status` shows: counts by state, workers and throughput."""
    now = now or timezone.now()
    listing = workers.listing(now=now)
    return {
        "at": now,
        **counts(None, now),
        "workers": {
            "running": sum(1 for w in listing if w["status"] == "running"),
            "stopping": sum(1 for w in listing if w["status"] == "stopping"),
            "lost": sum(1 for w in listing if w["status"] == "lost"),
            "jobs_in_hand": sum(w["jobs_in_hand"] for w in listing if w["status"] != "lost"),
        },
        "dead_letters_open": DeadLetter.objects.unresolved().count(),
        "throughput": throughput(now),
    }


def history(job_id):
    """A job, its whole event timeline, and one entry per attempt with its outcome."""
    try:
        job = Job.objects.get(id=job_id)
    except Job.DoesNotExist:
        raise JobNotFound(job_id) from None
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
        elif current is not None and e.type in (
            EventType.COMPLETED,
            EventType.FAILED,
            EventType.DEAD_LETTERED,
            EventType.RECOVERED,
            EventType.RELEASED,
            EventType.CANCELLED,
        ):
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
    return {
        "job": job_dict(job),
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


def dead_letters(*, kind=None, since=None, include_resolved=False, limit=50, now=None):
    """Dead letters, newest first; ``since`` is seconds back from now."""
    now = now or timezone.now()
    qs = DeadLetter.objects.order_by("-id")
    if not include_resolved:
        qs = qs.unresolved()
    if kind:
        qs = qs.filter(kind=kind)
    if since is not None:
        qs = qs.filter(created_at__gte=now - timedelta(seconds=since))
    return [
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
