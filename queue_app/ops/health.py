"""GET /health: is this deployment able to run jobs? 200 when every check passes, else 503.

Checks: the database answers, every migration is applied, and at least
HEALTH_MIN_WORKERS workers are live (set it to 0 for web-only nodes): not stopped and not
lost, by the one rule in ``Worker.objects.live()`` that the dashboard, the admin,
`manage.py workers` and /metrics also use.
It reports counts only, so it needs no credentials.
"""

from django.db import DatabaseError, connections, router
from django.db.migrations.executor import MigrationExecutor
from django.http import JsonResponse
from django.views.decorators.http import require_GET

from queue_app.conf import settings
from queue_app.models import Job, Worker


def check(using=None):
    """Run the checks; return (healthy, {check: {"ok": bool, ...}})."""
    db = using or router.db_for_read(Job)
    checks = {}
    try:
        with connections[db].cursor() as cursor:
            cursor.execute("SELECT 1")
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
        alive = Worker.objects.using(db).live().count()
        checks["workers"] = {"ok": alive >= need, "alive": alive, "required": need}
    except DatabaseError as exc:
        checks["workers"] = {"ok": need == 0, "error": str(exc).strip()[:200], "required": need}
    return all(c["ok"] for c in checks.values()), checks


@require_GET
def health_view(request):
    healthy, checks = check()
    return JsonResponse(
        {"status": "ok" if healthy else "unhealthy", "checks": checks}, status=200 if healthy else 503
    )
