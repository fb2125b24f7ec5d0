"""GET /health: is this deployment able to run jobs? 200 when every check passes, else 503.

Checks: the database answers, every migration is applied, and at least
HEALTH_MIN_WORKERS workers lease (set it to 0 for web-only nodes): live (not stopped, not
lost, by the one rule in ``Worker.objects.live()`` that the dashboard, the admin,
`manage.py workers` and /metrics also use) and neither quiet nor stopping
(``Worker.objects.leasing()``). A quiet worker is alive but takes no new job, so a
deployment whose workers are all quiet cannot run jobs: /health says so. ``alive`` is
reported beside ``leasing`` so the difference shows.
Anyone may ask; only a staff session or an API key sees the checks' error text, which
names database hosts, ports and users (web/health.py).
"""

from django.db import DatabaseError, connections, router
from django.db.migrations.executor import MigrationExecutor

from queue_app.conf import settings
from queue_app.models import Job, Worker


def check(using=None):
    """Run the checks; return (healthy, {check: {"ok": bool, ...}})."""
    db = using or router.db_for_read(Job)
    checks = {}
    try:
        Job.objects.using(db).exists()  # a round trip through the ORM (no SQL text here)
        checks["database"] = {"ok": True}
    except DatabaseError as exc:
        checks["database"] = {"ok": False, "error": str(exc).strip()[:200]}
        return False, checks
    try:
        loader = MigrationExecutor(connections[db]).loader
        # Every known migration not recorded as applied, holes included (a plan to the
        # leaf nodes would miss an unapplied migration below an applied one).
        pending = sorted(
            f"{app}.{name}" for app, name in set(loader.graph.nodes) - set(loader.applied_migrations)
        )
        checks["migrations"] = {"ok": not pending, "unapplied": pending[:20]}
    except DatabaseError as exc:
        checks["migrations"] = {"ok": False, "error": str(exc).strip()[:200]}
        return False, checks
    need = settings.HEALTH_MIN_WORKERS
    try:
        workers = Worker.objects.using(db)
        alive, leasing = workers.live().count(), workers.leasing().count()
        checks["workers"] = {"ok": leasing >= need, "alive": alive, "leasing": leasing, "required": need}
    except DatabaseError as exc:
        checks["workers"] = {"ok": need == 0, "error": str(exc).strip()[:200], "required": need}
    return all(c["ok"] for c in checks.values()), checks


def redacted(checks):
    """The checks without their error text, for a caller who has not authenticated."""
    return {name: {k: v for k, v in result.items() if k != "error"} for name, result in checks.items()}
