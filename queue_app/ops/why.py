"""Why isn't this job running? The first reason that holds, in words, from the rules
the claim applies, in the order it applies them: a job's state, its run_at, the pauses,
its kind's limits (concurrency, rate, per key), the live workers' queues and kinds, and
last its place in the lease order.

Each answer is a ``Reason``: a stable ``code`` (for scripts and tests), the sentence an
operator reads, and the dashboard address that shows more when there is one. The
dashboard's job page, ``manage.py history`` and the API's job endpoint all show it.
"""

from dataclasses import asdict, dataclass
from datetime import timedelta
from urllib.parse import urlencode

from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from queue_app.conf import settings
from queue_app.core import durations, flow, ordering
from queue_app.models import Job, KindLimit, Pause, PauseScope, State, Worker


@dataclass(frozen=True)
class Reason:
    code: str
    text: str
    link: str = ""

    def as_dict(self):
        return asdict(self)


def _in(seconds):
    return durations.format(max(0.0, seconds))


def _at(moment, fmt="%Y-%m-%d %H:%M:%S"):
    """``moment`` on the dashboard's one clock: the site's time zone, 24-hour, named."""
    return f"{timezone.localtime(moment):{fmt}} {timezone.get_current_timezone_name()}"


def _paused(job):
    for scope, name in ((PauseScope.QUEUE, job.queue_name), (PauseScope.KIND, job.kind)):
        pause = Pause.objects.filter(scope=scope, name=name).first()
        if pause is not None:
            by = f" by {pause.actor}" if pause.actor else ""
            why = f" ({pause.reason})" if pause.reason else ""
            since = _at(pause.created_at)
            return Reason(
                f"{scope}_paused",
                f"its {scope} {name!r} is paused{by} since {since}{why}: resume it to run it",
                reverse("queue_app_dashboard:queues"),
            )
    return None


def _limited(job, now):
    limit = KindLimit.objects.filter(kind=job.kind).first()
    if limit is None:
        return None
    queues = reverse("queue_app_dashboard:queues")
    leased_list = (
        reverse("queue_app_dashboard:jobs") + "?" + urlencode({"status": "leased", "kind": job.kind})
    )
    if limit.concurrency is not None:
        leased = Job.objects.filter(state=State.LEASED, kind=job.kind).count()
        if leased >= limit.concurrency:
            return Reason(
                "concurrency_limit",
                f"its kind {job.kind!r} is at its concurrency limit ({leased} of {limit.concurrency} leased)",
                leased_list,
            )
    if limit.rate_limit is not None and limit.window_start is not None:
        ends = limit.window_start + timedelta(seconds=limit.rate_period)
        if now < ends and limit.window_count >= limit.rate_limit:
            return Reason(
                "rate_limit",
                f"its kind {job.kind!r} has spent its rate limit ({limit.window_count} of "
                f"{limit.rate_limit} starts per {durations.format(limit.rate_period)}) until "
                f"{_at(ends, '%H:%M:%S')} (in {_in((ends - now).total_seconds())})",
                queues,
            )
    if limit.per_key is not None and job.concurrency_key:
        held = flow.leased_per_key(job.kind).get(job.concurrency_key, 0)
        if held >= limit.per_key:
            return Reason(
                "per_key_limit",
                f"its concurrency key {job.concurrency_key!r} is at the per-key limit "
                f"({held} of {limit.per_key} leased)",
                leased_list,
            )
    return None


def _unserved(job, now):
    serving = [
        w
        for w in Worker.objects.leasing(now).only("queues", "kinds")
        if (not w.queues or "*" in w.queues or job.queue_name in w.queues)
        and (not w.kinds or "*" in w.kinds or job.kind in w.kinds)
    ]
    if serving:
        return None
    workers = reverse("queue_app_dashboard:workers")
    if not Worker.objects.live(now).exists():
        return Reason("no_worker", "no worker is running: start one with manage.py runworker", workers)
    if not Worker.objects.leasing(now).exists():
        return Reason(
            "no_worker",
            "every live worker is quiet or stopping, so none leases: start one with manage.py runworker",
            workers,
        )
    return Reason(
        "no_worker_serves",
        f"no live worker serves queue {job.queue_name!r} and kind {job.kind!r}: "
        f"start one with runworker --queue {job.queue_name}",
        workers,
    )


def _ahead(job, now):
    """Ready jobs of its queue the claim takes before it (priority, then run_at,
    created_at, id; aging counted only as far as this job's own effective priority)."""
    mine = ordering.effective_priority(job.priority, job.run_at, now, settings.AGING_INTERVAL)
    same = Q(priority=job.priority) & (
        Q(run_at__lt=job.run_at)
        | Q(run_at=job.run_at, created_at__lt=job.created_at)
        | Q(run_at=job.run_at, created_at=job.created_at, id__lt=job.id)
    )
    cap = settings.OPS_COUNT_CAP
    ahead = (
        Job.objects.ready(now)
        .filter(queue_name=job.queue_name)
        .filter(Q(priority__gt=mine) | same)
        .exclude(id=job.id)
        .order_by()[: cap + 1]
        .count()
    )
    return ahead, ahead > cap, mine


def why(job, now=None):
    """The first reason ``job`` is not running now (a Reason; code "eligible" when none)."""
    now = now or timezone.now()
    if job.state == State.LEASED:
        return Reason("running", f"it is running (leased by {job.lease_owner})")
    if job.state == State.WAITING:
        held = (job.depends or {}).get("held")
        link = reverse("queue_app_dashboard:workflow", args=[job.id])
        key, ahead = (job.depends or {}).get("ordering"), (job.depends or {}).get("after")
        if key is not None and held:
            return Reason(
                "held",
                f"blocked by job {ahead} on ordering key {key!r}, which was dead-lettered: requeue job "
                f"{ahead} (it runs first, then this one), or requeue this job to skip it",
                link,
            )
        if key is not None:
            return Reason("waiting", f"it waits for job {ahead}, ahead of it on ordering key {key!r}", link)
        if held:
            return Reason(
                "held",
                "a job it depends on failed and it is held: requeue runs it, cancel drops it, "
                "requeueing the failed job makes it wait for that job again",
                link,
            )
        return Reason("waiting", f"it waits for {job.waiting_for} job(s) it depends on to end", link)
    dropped_by = (job.depends or {}).get("cancelled_by")
    if job.state == State.CANCELLED and dropped_by is not None:
        return Reason(
            "ended",
            f"it was cancelled because job {dropped_by} it depends on failed: "
            f"requeueing job {dropped_by} makes it wait for that job again",
            reverse("queue_app_dashboard:workflow", args=[job.id]),
        )
    if job.state != State.PENDING:
        return Reason("ended", f"it has ended: {job.state.replace('_', ' ')}")
    if job.run_at > now:
        wait = _in((job.run_at - now).total_seconds())
        if job.attempts:
            return Reason("retrying", f"it is backing off after attempt {job.attempts} (retry in {wait})")
        return Reason("scheduled", f"it is scheduled for later (in {wait}, at {_at(job.run_at)})")
    for check in (_paused(job), _limited(job, now), _unserved(job, now)):
        if check is not None:
            return check
    ahead, capped, mine = _ahead(job, now)
    if ahead:
        count = f"more than {ahead - 1}" if capped else str(ahead)
        return Reason(
            "busy",
            f"the workers are busy: {count} ready job(s) of queue {job.queue_name!r} lease before it "
            f"(its effective priority is {mine})",
            reverse("queue_app_dashboard:jobs")
            + "?"
            + urlencode({"status": "ready", "queue": job.queue_name}),
        )
    return Reason("eligible", "it is eligible now: the next claim of its queue takes it")
