"""Webhooks: a job with a ``webhook_url`` has its outcome POSTed there when it reaches a
terminal state (completed, dead_letter, cancelled).

Delivery is itself a job of kind ``queue_app.webhook``, enqueued by the terminal
transition in the same transaction, so it survives restarts, retries with the usual
backoff and ends in the dead-letter queue when the receiver never accepts: a receiver
that is down for an hour still gets the call, and an operator can replay it.

The body is JSON: id, kind, queue, state, attempts, result, error, created_at,
started_at, finished_at. With ``WEBHOOK_SECRET`` set, ``X-Jobqueue-Signature:
sha256=<hex>`` is the HMAC-SHA256 of the exact body bytes under that secret;
receivers should compare it in constant time.

Safety: a payload must not turn the workers into a proxy for internal addresses. Only
http and https URLs to hosts in ``WEBHOOK_ALLOWED_HOSTS`` are accepted, checked at
enqueue time (the caller hears about it) and again at delivery (the setting may have
changed). Redirects are not followed (a redirect could point anywhere), environment
proxies are not used, and each attempt has ``WEBHOOK_TIMEOUT``. Any 2xx is success;
anything else, a refused connection or a timeout fails the attempt.
"""
import hashlib
import hmac
import json
import logging
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from queue_app.conf import settings
from queue_app.exceptions import InvalidJob
from queue_app.models import State

log = logging.getLogger("queue_app")

KIND = "queue_app.webhook"
SIGNATURE_HEADER = "X-Jobqueue-Signature"
URL_MAX_LENGTH = 2000
TERMINAL = (State.COMPLETED, State.DEAD_LETTER, State.CANCELLED)


def host_allowed(host):
    host = (host or "").lower().rstrip(".")
    for entry in settings.WEBHOOK_ALLOWED_HOSTS or ():
        entry = entry.lower()
        if entry.startswith("."):
            if host == entry[1:] or host.endswith(entry):
                return True
        elif host == entry:
            return True
    return False


def check_url(url):
    """Return ``url`` if it may receive webhooks, else raise InvalidJob saying why."""
    field = "webhook_url"
    if not isinstance(url, str) or not url:
        raise InvalidJob("webhook_url must be a non-empty string", field)
    if len(url) > URL_MAX_LENGTH:
        raise InvalidJob(f"webhook_url is {len(url)} characters; the limit is {URL_MAX_LENGTH}", field)
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018  (raises on a malformed port)
    except ValueError as exc:
        raise InvalidJob(f"webhook_url is not a valid URL: {exc}", field) from None
    if parts.scheme not in ("http", "https"):
        raise InvalidJob(f"webhook_url must be http or https, not {parts.scheme or 'empty'!r}", field)
    if not host:
        raise InvalidJob("webhook_url has no host", field)
    if parts.username or parts.password:
        raise InvalidJob("webhook_url may not carry credentials; set WEBHOOK_SECRET to sign deliveries", field)
    if not host_allowed(host):
        raise InvalidJob(f"webhook host {host!r} is not in the WEBHOOK_ALLOWED_HOSTS setting", field)
    return url


def body_for(job, state, now, *, result=None, error=None):
    def iso(value):
        return value.isoformat() if value else None

    return {
        "id": job.id,
        "kind": job.kind,
        "queue": job.queue_name,
        "state": str(state),
        "attempts": job.attempts,
        "result": result if state == State.COMPLETED else None,
        "error": error if state != State.COMPLETED else None,
        "created_at": iso(job.created_at),
        "started_at": iso(job.started_at),
        "finished_at": iso(now),
    }


def notify(job, state, now, *, result=None, error=None, using="default"):
    """Enqueue the delivery of ``job``'s outcome if it has a webhook; return event metadata."""
    if not job.webhook_url or state not in TERMINAL:
        return {}
    from queue_app import transitions, validation  # transitions calls us: import on use

    try:
        req = validation.enqueue_request(
            KIND,
            {"url": job.webhook_url, "body": body_for(job, state, now, result=result, error=error)},
            now=now,
            queue_name=settings.WEBHOOK_QUEUE or job.queue_name,
            max_attempts=settings.WEBHOOK_MAX_ATTEMPTS,
        )
    except InvalidJob as exc:
        log.error("webhook refused id=%s: %s", job.id, exc)
        return {"webhook_error": str(exc)}
    delivery, _ = transitions.enqueue(req, using=using)
    return {"webhook": delivery.id}


def sign(data, secret):
    return "sha256=" + hmac.new(secret.encode(), data, hashlib.sha256).hexdigest()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise urllib.error.HTTPError(req.full_url, code, f"redirect to {newurl} refused", headers, fp)


_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)


class DeliveryFailed(Exception):
    pass


def deliver(payload):
    """The ``queue_app.webhook`` handler: POST the body; raise (so the job retries) unless 2xx."""
    url = check_url(payload["url"])
    data = json.dumps(payload["body"], separators=(",", ":"), sort_keys=True).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "jobqueue-webhook/1"}
    if settings.WEBHOOK_SECRET:
        headers[SIGNATURE_HEADER] = sign(data, settings.WEBHOOK_SECRET)
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with _opener.open(request, timeout=float(settings.WEBHOOK_TIMEOUT)) as response:
            return {"status": response.status}
    except urllib.error.HTTPError as exc:
        raise DeliveryFailed(f"{url} answered {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise DeliveryFailed(f"{url} could not be reached: {getattr(exc, 'reason', exc)}") from None
