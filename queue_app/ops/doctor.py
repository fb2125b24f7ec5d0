"""manage.py doctor: what is wrong with a live installation, each finding with its fix.

Checks: every migration applied; leased jobs whose lease expired with no live worker to
recover them; lost workers; the database's own settings (engines: SQLite's journal mode
and synchronous, PostgreSQL's autovacuum and dead rows on the job and event tables);
workers whose clock runs ahead of the database's; completed jobs' events older than
DOCTOR_PRUNE_DAYS, which say nothing prunes the event table; the claim's and the
dashboard's queries planned without their index (EXPLAIN, on tables of at least
DOCTOR_EXPLAIN_MIN_ROWS rows: below that a planner rightly reads the whole table).
"""

from datetime import timedelta

from django.db import connections, router
from django.db.migrations.executor import MigrationExecutor
from django.db.models.functions import Now
from django.utils import timezone

from queue_app import engines
from queue_app.conf import settings
from queue_app.models import Event, EventType, Job, State, Worker

# A heartbeat this far ahead of the database's clock: that worker's clock is wrong, and
# it would read leases as lapsed (or live) at the wrong time.
SKEW = timedelta(seconds=5)


def findings(using=None, now=None):
    """Run the checks; return ["problem: fix", ...], empty when healthy."""
    db = using or router.db_for_read(Job)
    now = now or timezone.now()
    out = []
    loader = MigrationExecutor(connections[db]).loader
    pending = sorted(
        f"{app}.{name}" for app, name in set(loader.graph.nodes) - set(loader.applied_migrations)
    )
    if pending:
        out.append(
            f"{len(pending)} migration(s) not applied ({', '.join(pending[:5])}): run manage.py migrate"
        )
        return out  # the other checks read tables those migrations may not have made yet
    expired = Job.objects.using(db).expired(now).count()
    if expired and not Worker.objects.using(db).live(now).exists():
        out.append(
            f"{expired} leased job(s) have expired leases and no live worker to recover them: "
            "start a worker (manage.py runworker), which takes them back"
        )
    for name, heartbeat in Worker.objects.using(db).lost(now).values_list("name", "last_heartbeat"):
        out.append(
            f"worker {name} is lost (last heartbeat {heartbeat:%Y-%m-%d %H:%M:%S}): check its host and "
            "restart it; a live worker recovers its jobs once their leases lapse"
        )
    ahead = (
        Worker.objects.using(db)
        .alive()
        .annotate(db_now=Now())
        .values_list("name", "last_heartbeat", "db_now")
    )
    for name, heartbeat, db_now in ahead:
        if heartbeat - db_now > SKEW:
            out.append(
                f"worker {name}'s clock is {(heartbeat - db_now).total_seconds():.0f}s ahead of the "
                "database's: sync its host's clock (NTP)"
            )
    days = settings.DOCTOR_PRUNE_DAYS
    # (type, at) is an index: the oldest completed event is one seek, at any table size.
    oldest = (
        Event.objects.using(db).filter(type=EventType.COMPLETED).order_by("at").values_list("at", flat=True)
    )
    oldest = oldest.first()
    if days and oldest is not None and oldest < now - timedelta(days=days):
        size = engines.of(connections[db]).estimated_rows("queue_app_event")
        out.append(
            f"completed jobs' events go back {(now - oldest).days} days, past DOCTOR_PRUNE_DAYS ({days}), "
            f"in an event table of about {size:,} rows: "
            f"nothing prunes them; run manage.py prune --older-than {days}d daily (cron or a schedule)"
        )
    out.extend(f"{problem}: {fix}" for problem, fix in engines.of(connections[db]).doctor())
    out.extend(_unindexed(db, now))
    return out


def indexed_queries(db, now):
    """[(what, its table, the indexes it may use, its queryset)]: the claim's seeks as
    leasing.py writes them, lease recovery, and what the dashboard reads most."""
    jobs = Job.objects.using(db)
    ready = jobs.filter(state=State.PENDING, priority=0, run_at__lte=now)
    order = ("run_at", "created_at", "id")
    table = "queue_app_job"
    return [
        ("the claim's seek per priority level", table, ("jq_ready_prio",), ready.order_by(*order)[:10]),
        (
            "the claim's seek per queue",
            table,
            ("jq_ready_queue",),
            ready.filter(queue_name=settings.DEFAULT_QUEUE).order_by(*order)[:10],
        ),
        (
            "lease recovery",
            table,
            # Either bounds it by the leased rows (SQLite without ANALYZE picks the second).
            ("jq_lease_expiry", "jq_job_state_kind_queue"),
            jobs.filter(state=State.LEASED, lease_expires_at__lt=now).order_by("lease_expires_at")[:500],
        ),
        (
            "the dashboard's dead-letter count",
            table,
            ("jq_job_state_kind_queue",),
            jobs.filter(state=State.DEAD_LETTER).values("kind", "queue_name").order_by(),
        ),
        (
            "a job's timeline",
            "queue_app_event",
            ("queue_app_event_job_id",),
            Event.objects.using(db).filter(job_id=0).order_by("id"),
        ),
    ]


def _unindexed(db, now):
    connection = connections[db]
    engine = engines.of(connection)
    least = settings.DOCTOR_EXPLAIN_MIN_ROWS
    sizes, out = {}, []
    for what, table, indexes, qs in indexed_queries(db, now):
        if table not in sizes:
            sizes[table] = engine.estimated_rows(table)
        if sizes[table] < least:
            continue
        sql, params = qs.query.get_compiler(using=db).as_sql()
        plan = engine.plan(sql, params)
        if not any(name in plan for name in indexes):
            steps = " | ".join(line.strip() for line in plan.splitlines()[:3])
            out.append(
                f"{what} is planned without its index {' or '.join(indexes)} (plan: {steps}): "
                f"ANALYZE {table} so the planner has statistics; if the index is missing, "
                "manage.py migrate makes it (a migration rolled back by hand may have dropped it)"
            )
    return out
