"""GET /health over HTTP (the checks: ops/health.py)."""

from django.http import JsonResponse
from django.views.decorators.http import require_GET

from queue_app.conf import settings
from queue_app.ops import health
from queue_app.web import auth


def _authenticated(request):
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated and user.is_staff:
        return True
    return auth.authenticate(request.headers.get(settings.API_KEY_HEADER)) is not None


@require_GET
def health_view(request):
    """200 when the deployment can run jobs, else 503; error text only for staff or a key."""
    # Who is asking first: a failed check may leave the request's connection unusable.
    authenticated = _authenticated(request)
    healthy, checks = health.check()
    if not authenticated:
        checks = health.redacted(checks)
    return JsonResponse(
        {"status": "ok" if healthy else "unhealthy", "checks": checks}, status=200 if healthy else 503
    )
