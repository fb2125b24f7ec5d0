"""Webhooks: a job with a ``webhook_url`` has its outcome POSTed there when it reaches a
terminal state (completed, dead_letter, cancelled).

Delivery is itself a job of kind ``queue_app.webhook`` (delivery() builds it), enqueued
by the terminal transition in the same transaction (its payload names only the finished
job and its state; the body, and the URL, are read from the rows when it is sent,
``deliver()``, so nobody who can reach a payload can choose what gets signed), so it survives restarts, retries with the usual
backoff and ends in the dead-letter queue when the receiver never accepts: a receiver
that is down for an hour still gets the call, and an operator can replay it.

The body is JSON: id, kind, queue, state, attempts, result, error, created_at,
started_at, finished_at. Every attempt carries ``X-Jobqueue-Delivery`` (the delivery
job's id, the same on every retry: receivers dedupe on it), ``X-Jobqueue-Attempt``
and ``X-Jobqueue-Timestamp`` (Unix seconds when the attempt was sent). With
``WEBHOOK_SECRET`` set, ``X-Jobqueue-Signature: t=<timestamp>,v1=<hex>`` holds the
HMAC-SHA256, under that secret, of ``b"<timestamp>." + body`` (Stripe's scheme). The
timestamp is inside the MAC and each retry is signed afresh, so a receiver that checks
it with ``verify()`` refuses a captured delivery replayed more than ``tolerance``
seconds later; within that window only deduping on the delivery id stops a replay
(that header is not signed; the body's id, state and finished_at are).

Safety: a payload must not turn the workers into a proxy for internal addresses. Only
http and https URLs to hosts in ``WEBHOOK_ALLOWED_HOSTS`` are accepted, checked at
enqueue time (the caller hears about it) and again at delivery (the setting may have
changed). A name is only as safe as its DNS, so delivery resolves the host once, drops
every address that is not public (loopback, private, link-local, shared, multicast,
reserved, unspecified; an IPv6 address that embeds an IPv4 one is judged by that) unless
it lies in ``WEBHOOK_ALLOWED_NETWORKS``, and connects to a vetted address itself: a second
lookup (DNS rebinding) never happens. The Host header, TLS SNI and the certificate check
still use the URL's host name. Redirects are not followed (a redirect could point
anywhere), environment proxies are not used, and each attempt has ``WEBHOOK_TIMEOUT``.
Any 2xx is success; anything else, a refused connection or a timeout fails the attempt.
"""

import hashlib
import hmac
import http.client
import ipaddress
import json
import logging
import re
import socket
import ssl
import time
from urllib.parse import urlsplit

from queue_app.conf import settings
from queue_app.core import validation
from queue_app.core.urls import address_allowed, check_url, host_allowed  # noqa: F401  (re-exported)
from queue_app.exceptions import InvalidJob
from queue_app.models import Event, Job, State

log = logging.getLogger("queue_app")

KIND = validation.WEBHOOK_KIND
SIGNATURE_HEADER = "X-Jobqueue-Signature"
TIMESTAMP_HEADER = "X-Jobqueue-Timestamp"
DELIVERY_HEADER = "X-Jobqueue-Delivery"
ATTEMPT_HEADER = "X-Jobqueue-Attempt"
# Seconds a signature stays acceptable, either way of the receiver's clock (Stripe's default).
SIGNATURE_TOLERANCE = 300
TERMINAL = (State.COMPLETED, State.DEAD_LETTER, State.CANCELLED)


def vetted_addresses(host, port):
    """Resolve ``host`` once and return the addresses a webhook may connect to (raise if none)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise DeliveryFailed(f"webhook host {host!r} could not be resolved: {exc}") from None
    found = list(dict.fromkeys(info[4][0] for info in infos))
    allowed = [a for a in found if address_allowed(ipaddress.ip_address(a.partition("%")[0]))]
    if not allowed:
        raise DeliveryFailed(
            f"webhook host {host!r} resolves to {', '.join(found)}: not public and not in "
            "WEBHOOK_ALLOWED_NETWORKS"
        )
    return allowed


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


def delivery(job, state, now, *, result=None, error=None):
    """Return (EnqueueRequest or None, event metadata): the delivery job of ``job``'s outcome.

    None when the job has no webhook or ``state`` is not terminal. The caller (the
    terminal transition) enqueues it in its own transaction and records its id as
    ``webhook``; a delivery that does not validate gives ``webhook_error`` instead."""
    if not job.webhook_url or state not in TERMINAL:
        return None, {}
    try:
        req = validation.enqueue_request(
            KIND,
            {"job_id": job.id, "state": str(state)},
            now=now,
            reserved_ok=True,
            queue_name=settings.WEBHOOK_QUEUE or job.queue_name,
            max_attempts=settings.WEBHOOK_MAX_ATTEMPTS,
        )
    except InvalidJob as exc:
        log.error("webhook refused id=%s: %s", job.id, exc)
        return None, {"webhook_error": str(exc)}
    return req, {}


def sign(data, secret, timestamp):
    """Return the X-Jobqueue-Signature value for body ``data`` sent at ``timestamp`` (Unix seconds)."""
    return f"t={timestamp},v1={_mac(data, secret, timestamp)}"


def _mac(data, secret, timestamp):
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + data, hashlib.sha256).hexdigest()


class InvalidSignature(Exception):
    """A webhook signature header is missing, malformed, outside the tolerance or wrong."""


# ASCII digits only: int() would also take " 17", "+17", "1_7" and non-ASCII digits.
_TIMESTAMP = re.compile(r"[0-9]{1,12}")


def parse_signature(header):
    """Return ``(timestamp, [v1 signatures])`` from an X-Jobqueue-Signature value."""
    # Non-ASCII text would make hmac.compare_digest raise TypeError instead of saying no.
    if not isinstance(header, str) or not header.isascii():
        raise InvalidSignature("the signature header is missing or not ASCII")
    fields = [part.partition("=") for part in header.split(",")]
    if any(not sep or not key for key, sep, _ in fields):
        raise InvalidSignature(f"the signature header is not t=<seconds>,v1=<hex>: {header[:100]!r}")
    stamps = [value for key, _, value in fields if key == "t"]
    signatures = [value for key, _, value in fields if key == "v1"]  # several while a secret rotates
    if len(stamps) != 1 or not _TIMESTAMP.fullmatch(stamps[0]) or not signatures:
        raise InvalidSignature(f"the signature header needs one t=<seconds> and a v1=<hex>: {header[:100]!r}")
    return int(stamps[0]), signatures


def check_signature(body, header, secret, *, tolerance=SIGNATURE_TOLERANCE, now=None):
    """Raise InvalidSignature unless ``header`` signs the raw ``body`` under ``secret``
    at a time within ``tolerance`` seconds of ``now`` (default: the current time)."""
    if not isinstance(body, bytes):
        raise TypeError("body must be the request's raw bytes, not a re-encoded or parsed copy")
    timestamp, signatures = parse_signature(header)
    now = time.time() if now is None else now
    if abs(now - timestamp) > tolerance:
        raise InvalidSignature(
            f"the signature's timestamp {timestamp} is {abs(now - timestamp):.0f}s from now; "
            f"the tolerance is {tolerance}s"
        )
    expected = _mac(body, secret, timestamp)
    # Constant time: how long a comparison takes must not tell how much of a guess was right.
    if not any(hmac.compare_digest(expected, signature) for signature in signatures):
        raise InvalidSignature("no v1 signature matches this body and secret")


def verify(body, header, secret, *, tolerance=SIGNATURE_TOLERANCE, now=None):
    """Return whether ``header`` (X-Jobqueue-Signature) validly signs ``body``: see check_signature()."""
    try:
        check_signature(body, header, secret, tolerance=tolerance, now=now)
    except InvalidSignature:
        return False
    return True


def _connect(addresses, port, timeout):
    """A socket to the first of ``addresses`` (IP literals: no lookup happens) that answers."""
    error = None
    for address in addresses:
        try:
            return socket.create_connection((address, port), timeout)
        except OSError as exc:
            error = exc
    raise error


class _PinnedHTTP(http.client.HTTPConnection):
    """An HTTP connection to vetted addresses; the Host header still names the URL's host."""

    def __init__(self, host, port, addresses, timeout):
        super().__init__(host, port, timeout=timeout)
        self.addresses = addresses

    def connect(self):
        self.sock = _connect(self.addresses, self.port, self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    """As _PinnedHTTP over TLS: SNI and the certificate check use the URL's host name."""

    def __init__(self, host, port, addresses, timeout):
        self.tls = ssl.create_default_context()
        super().__init__(host, port, timeout=timeout, context=self.tls)
        self.addresses = addresses

    def connect(self):
        sock = _connect(self.addresses, self.port, self.timeout)
        try:
            self.sock = self.tls.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise


class DeliveryFailed(Exception):
    pass


def post(url, data, headers):
    """POST ``data`` to an allow-listed http(s) URL over a vetted address; return the status.

    Raise InvalidJob for a URL or address the settings refuse, DeliveryFailed when the
    server cannot be reached or does not answer 2xx.
    """
    url = check_url(url)
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    addresses = vetted_addresses(parts.hostname, port)
    connection_class = _PinnedHTTPS if parts.scheme == "https" else _PinnedHTTP
    # http.client follows no redirects and uses no proxy: a 3xx is just a failed attempt.
    conn = connection_class(parts.hostname, port, addresses, float(settings.WEBHOOK_TIMEOUT))
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        conn.request("POST", target, body=data, headers=headers)
        response = conn.getresponse()
        response.read()
    except (OSError, http.client.HTTPException) as exc:
        raise DeliveryFailed(f"{url} could not be reached: {exc}") from None
    finally:
        conn.close()
    if not 200 <= response.status < 300:
        raise DeliveryFailed(f"{url} answered {response.status} {response.reason}")
    return response.status


def headers_for(data, job, timestamp):
    """Return the headers of ``job``'s current delivery attempt of ``data``, signed at ``timestamp``."""
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "jobqueue-webhook/1",
        DELIVERY_HEADER: str(job.id),
        ATTEMPT_HEADER: str(job.attempts),
        TIMESTAMP_HEADER: str(timestamp),
    }
    if settings.WEBHOOK_SECRET:
        headers[SIGNATURE_HEADER] = sign(data, settings.WEBHOOK_SECRET, timestamp)
    return headers


def source(payload, delivery_id):
    """(URL, body) of the outcome a delivery job announces, read from the finished job's
    row and the terminal event that enqueued this delivery (its metadata names it).
    The payload only says which job and state; a payload from before that (``url`` and
    ``body``) is read the same way, by the body's id and state."""
    if not isinstance(payload, dict):
        raise InvalidJob("a webhook delivery's payload names the finished job: {job_id, state}", "payload")
    old = payload.get("body") if isinstance(payload.get("body"), dict) else {}
    job_id, state = payload.get("job_id", old.get("id")), payload.get("state", old.get("state"))
    job = Job.objects.filter(id=job_id).first() if isinstance(job_id, int) else None
    if job is None or not job.webhook_url:
        raise InvalidJob(f"webhook delivery {delivery_id}: job {job_id!r} no longer exists or has no webhook")
    events = Event.objects.filter(job_id=job.id, to_state__in=TERMINAL).order_by("-id")
    event = next((e for e in events if (e.metadata or {}).get("webhook") == delivery_id), None)
    if event is not None:
        state, finished, error = event.to_state, event.at, (event.metadata or {}).get("error")
    elif state in TERMINAL:
        finished, error = job.finished_at, job.last_error
    else:
        raise InvalidJob(f"webhook delivery {delivery_id}: {state!r} is not a finished state")
    error = error if state == State.DEAD_LETTER else None
    body = body_for(job, state, finished, result=job.result, error=error)
    return job.webhook_url, body


def send(url, body, job):
    """POST ``body`` for delivery job ``job``, signed now; raise unless 2xx."""
    data = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    # Signed now, not at enqueue: a retry an hour later must still fall inside the
    # receiver's tolerance window.
    return {"status": post(url, data, headers_for(data, job, int(time.time())))}


def deliver(payload, job):
    """The ``queue_app.webhook`` handler: POST the finished job's outcome; raise (so the
    job retries) unless 2xx."""
    return send(*source(payload, job.id), job)
