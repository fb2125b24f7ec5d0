"""/metrics over HTTP: the Django view, and a small WSGI server for `manage.py metrics`
and `runworker --metrics-addr`.

Protection: with METRICS_TOKEN set a scrape must send ``Authorization: Bearer <token>``
(or basic auth whose password is the token, for scrapers that only do basic auth).
Without a token only loopback clients are served, unless METRICS_PUBLIC is True.
"""

import base64
import hmac
import ipaddress
import socket
import socketserver
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from django.http import HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from queue_app.conf import settings
from queue_app.core import addresses
from queue_app.ops import metrics


def allowed(authorization, remote_addr, proxied=False):
    """True when a scrape with this Authorization header from this address may read."""
    token = settings.METRICS_TOKEN
    if token:
        scheme, _, value = (authorization or "").partition(" ")
        if scheme.lower() == "bearer":
            return hmac.compare_digest(value.strip().encode(), str(token).encode())
        if scheme.lower() == "basic":
            try:
                _, _, password = base64.b64decode(value.strip()).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return False
            return hmac.compare_digest(password.encode(), str(token).encode())
        return False
    if settings.METRICS_PUBLIC:
        return True
    if proxied:
        # A reverse proxy on this host connects from loopback for everyone on the internet.
        return False
    try:
        return ipaddress.ip_address((remote_addr or "").split("%")[0]).is_loopback
    except ValueError:
        return False


def _refused():
    body = b"metrics need a token (METRICS_TOKEN) or a loopback client\n"
    headers = {"WWW-Authenticate": 'Bearer realm="jobqueue metrics"'}
    return 401, body, headers


@require_GET
def metrics_view(request):
    """GET /metrics: the Prometheus exposition of a fresh snapshot."""
    if not allowed(
        request.headers.get("Authorization"), request.META.get("REMOTE_ADDR"), _proxied(request.META)
    ):
        status, body, headers = _refused()
        return HttpResponse(body, status=status, content_type="text/plain", headers=headers)
    return HttpResponse(metrics.render(), content_type=CONTENT_TYPE_LATEST)


def wsgi_app(environ, start_response):
    """A WSGI app that answers /metrics (any path) for the standalone server."""
    try:
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            status, body, headers = "405 Method Not Allowed", b"GET only\n", {"Allow": "GET"}
        elif not allowed(environ.get("HTTP_AUTHORIZATION"), environ.get("REMOTE_ADDR"), _proxied(environ)):
            code, body, headers = _refused()
            status = f"{code} Unauthorized"
        else:
            status, body, headers = "200 OK", metrics.render(), {"Content-Type": CONTENT_TYPE_LATEST}
    finally:
        # Outside Django's request cycle nobody else closes the connection.
        metrics.close_connections()
    headers = {"Content-Type": "text/plain", **headers, "Content-Length": str(len(body))}
    start_response(status, list(headers.items()))
    return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else body]


def _proxied(meta):
    """Whether the request came through a proxy (it says whom it forwards for)."""
    return any(meta.get(h) for h in ("HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP"))


class _ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    # A thread per connection: one client that connects and sends nothing (a port scan,
    # a stuck scraper) must not block every other scrape.
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):
        pass


def server(addr):
    """A WSGI server for ``addr``, a thread per connection (call serve_forever() on it)."""
    host, port = addresses.parse(addr)
    cls = _ThreadingWSGIServer
    if ":" in host:
        cls = type("WSGIServerV6", (_ThreadingWSGIServer,), {"address_family": socket.AF_INET6})
    return make_server(host, port, wsgi_app, server_class=cls, handler_class=_QuietHandler)
