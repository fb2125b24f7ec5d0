"""Cron schedules: ``tick()`` enqueues one job per due tick of each enabled Schedule.

Every worker supervisor calls ``tick()`` every ``SCHEDULE_INTERVAL`` seconds, so
schedules keep running while any worker on any host is up, with no scheduler process
to keep alive. Many tickers at once are safe because a tick's job carries the
idempotency key ``schedule:<name>:<tick in UTC, ISO 8601>``: the key's unique index
lets exactly one insert win, whoever gets there first. ``last_tick`` only moves
forward (a conditional UPDATE) and saves the next tick from recomputing old ones; it
is an optimisation, the key is the guarantee.

Missed ticks. A due tick older than ``SCHEDULE_GRACE_SECONDS`` was missed (no worker
was running). The policy, per schedule or from ``SCHEDULE_MISSED_TICKS``:
- ``run_once`` (default): all missed ticks together run once, as the latest of them;
  a nightly report after a weekend outage runs once, not three times.
- ``skip``: missed ticks are dropped; the schedule resumes at its next tick.
Ticks within the grace period always run, each once, so a short pause of the workers
(a deploy) loses nothing.

Schedules come from the admin or from the ``SCHEDULES`` setting (``sync_schedules``
writes them, keeping their ``last_tick``). Expressions are croniter's: five fields, or
six with seconds last (``* * * * * */10`` is every ten seconds), evaluated in the
schedule's timezone so ``0 9 * * *`` in Europe/Paris follows daylight saving time.
"""

import logging
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from queue_app.conf import settings
from queue_app.core import transitions, validation
from queue_app.exceptions import InvalidJob
from queue_app.models import KIND_MAX_LENGTH, QUEUE_NAME_MAX_LENGTH, MissedTicks, Schedule

log = logging.getLogger("queue_app")

# Ticks inside the grace period enqueued per schedule per call; more means a
# schedule far more frequent than the tick interval, and the rest wait for next call.
MAX_TICKS_PER_CALL = 1000
SCHEDULE_FIELDS = ("cron", "kind", "payload", "queue_name", "priority", "timezone", "enabled", "missed_ticks")


def zone(name):
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise InvalidJob(
            f"timezone {name!r} is not a known IANA time zone (e.g. UTC, Europe/Paris)", "timezone"
        ) from None


def validate(
    name, cron, kind, payload=None, queue_name=None, priority=0, timezone="UTC", enabled=True, missed_ticks=""
):
    """Check a schedule's fields; return them cleaned as a dict, or raise InvalidJob."""
    validation.name(name, "name", 100)
    if not isinstance(cron, str) or not croniter.is_valid(cron):
        raise InvalidJob(f"cron {cron!r} is not a valid cron expression (e.g. '*/5 * * * *')", "cron")
    zone(timezone)
    if missed_ticks not in ("", *MissedTicks.values):
        raise InvalidJob(f"missed_ticks must be one of {', '.join(MissedTicks.values)}", "missed_ticks")
    if not isinstance(enabled, bool):
        raise InvalidJob("enabled must be true or false", "enabled")
    return {
        "cron": cron,
        "kind": validation.name(kind, "kind", KIND_MAX_LENGTH),
        "payload": validation.payload({} if payload is None else payload),
        "queue_name": validation.name(
            queue_name or settings.DEFAULT_QUEUE, "queue_name", QUEUE_NAME_MAX_LENGTH
        ),
        "priority": validation.priority(priority),
        "timezone": timezone,
        "enabled": enabled,
        "missed_ticks": missed_ticks,
    }


def sync_schedules(using="default"):
    """Write the SCHEDULES setting into Schedule rows (keeping last_tick); return the names.

    A row that came from the setting and is no longer in it is removed.
    """
    configured = settings.SCHEDULES or {}
    for name, spec in configured.items():
        unknown = set(spec) - set(SCHEDULE_FIELDS)
        if unknown:
            raise InvalidJob(f"SCHEDULES[{name!r}]: unknown key(s) {sorted(unknown)}", "SCHEDULES")
        try:
            fields = validate(name, **spec)
        except TypeError as exc:
            raise InvalidJob(f"SCHEDULES[{name!r}]: {exc}", "SCHEDULES") from None
        except InvalidJob as exc:
            raise InvalidJob(f"SCHEDULES[{name!r}]: {exc}", exc.field) from None
        Schedule.objects.using(using).update_or_create(name=name, defaults={**fields, "from_settings": True})
    Schedule.objects.using(using).filter(from_settings=True).exclude(name__in=list(configured)).delete()
    return sorted(configured)


def _cron(schedule, start):
    return croniter(schedule.cron, start.astimezone(zone(schedule.timezone)))


def next_run(schedule, now=None):
    """The schedule's next tick after its last one (or after now, if that is later)."""
    now = now or timezone.now()
    base = max(schedule.last_tick or schedule.created_at, now)
    return _cron(schedule, base).get_next(datetime).astimezone(UTC)


def due_ticks(schedule, now):
    """Return the ticks of ``schedule`` to enqueue at ``now``, oldest first."""
    base = schedule.last_tick or schedule.created_at
    horizon = now - timedelta(seconds=float(settings.SCHEDULE_GRACE_SECONDS))
    ticks = []
    if base < horizon:
        # Missed while nobody ticked; seek straight to the horizon instead of walking
        # every missed tick (a per-second schedule after a day down is 86,400 of them).
        latest_missed = _cron(schedule, horizon).get_prev(datetime)
        policy = schedule.missed_ticks or settings.SCHEDULE_MISSED_TICKS
        if latest_missed > base and policy == MissedTicks.RUN_ONCE:
            ticks.append(latest_missed)
        base = horizon
    it = _cron(schedule, base)
    for _ in range(MAX_TICKS_PER_CALL):
        t = it.get_next(datetime)
        if t > now:
            break
        ticks.append(t)
    return [t.astimezone(UTC) for t in ticks]


def _request(schedule, now, key):
    """The job one run of ``schedule`` enqueues, under idempotency key ``key``."""
    return validation.enqueue_request(
        schedule.kind,
        schedule.payload,
        now=now,
        queue_name=schedule.queue_name,
        priority=schedule.priority,
        idempotency_key=key,
    )


def key_prefix(name):
    """The start of the idempotency key of every job schedule ``name`` enqueued."""
    return f"schedule:{name}:"


def tick_key(schedule, t):
    return f"{key_prefix(schedule.name)}{t.astimezone(UTC).isoformat()}"


def set_enabled(name, enabled, *, using="default"):
    """Turn schedule ``name`` on or off; return the schedule. Turned back on, it resumes
    at its next tick: the missed ones follow its missed-ticks policy."""
    if Schedule.objects.using(using).filter(name=name).update(enabled=bool(enabled)) == 0:
        raise InvalidJob(f"no schedule named {name!r}", "name")
    return Schedule.objects.using(using).get(name=name)


def run_now(name, *, now=None, using="default"):
    """Enqueue one job of schedule ``name`` now, outside its ticks (the dashboard's Run
    now). Its key, ``schedule:<name>:now:<time>``, lists it among the schedule's jobs and
    can never stand in for a tick's, so the next tick still runs."""
    schedule = Schedule.objects.using(using).filter(name=name).first()
    if schedule is None:
        raise InvalidJob(f"no schedule named {name!r}", "name")
    now = now or timezone.now()
    key = f"{key_prefix(name)}now:{now.astimezone(UTC).isoformat()}"
    job, _ = transitions.enqueue(_request(schedule, now, key), using=using)
    log.info("schedule %s run now: id=%s", name, job.id)
    return job


def tick(now=None, using="default"):
    """Enqueue every due tick of every enabled schedule; return [(name, tick, job, created)]."""
    now = now or timezone.now()
    out = []
    for schedule in Schedule.objects.using(using).filter(enabled=True):
        try:
            ticks = due_ticks(schedule, now)
        except (InvalidJob, ValueError, KeyError) as exc:
            log.error("schedule %s cannot be evaluated: %s", schedule.name, exc)
            continue
        if not ticks:
            continue
        try:
            with transaction.atomic(using=using):
                for t in ticks:
                    job, created = transitions.enqueue(
                        _request(schedule, now, tick_key(schedule, t)), using=using
                    )
                    out.append((schedule.name, t, job, created))
                # Forward only: a slower ticker with an older view never moves it back.
                Schedule.objects.using(using).filter(
                    Q(last_tick__isnull=True) | Q(last_tick__lt=ticks[-1]), id=schedule.id
                ).update(last_tick=ticks[-1])
        except InvalidJob as exc:
            log.error("schedule %s refused: %s", schedule.name, exc)
    for name, t, job, created in out:
        if created:
            log.info("scheduled id=%s schedule=%s tick=%s", job.id, name, t.isoformat())
    return out


def overview(now=None, using="default"):
    """Return [(Schedule, next run or None)] for `manage.py schedules` and the admin."""
    now = now or timezone.now()
    out = []
    for schedule in Schedule.objects.using(using).all():
        try:
            upcoming = next_run(schedule, now) if schedule.enabled else None
        except (InvalidJob, ValueError, KeyError):
            upcoming = None
        out.append((schedule, upcoming))
    return out
