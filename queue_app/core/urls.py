"""Where a webhook may go: the URL check done at enqueue time (validation) and again at
delivery (webhooks), and the address check of every address a host name resolves to.
webhooks.py's docstring says why each rule exists."""

import ipaddress
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from queue_app.conf import settings
from queue_app.exceptions import InvalidJob

URL_MAX_LENGTH = 2000


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
    schemes = settings.WEBHOOK_ALLOWED_SCHEMES or ()
    if parts.scheme not in schemes:
        raise InvalidJob(
            f"webhook_url scheme {parts.scheme!r} is not in the WEBHOOK_ALLOWED_SCHEMES setting ({', '.join(schemes)})",
            field,
        )
    ports = settings.WEBHOOK_ALLOWED_PORTS
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if ports is not None and port not in ports:
        raise InvalidJob(f"webhook_url port {port} is not in the WEBHOOK_ALLOWED_PORTS setting", field)
    if not host:
        raise InvalidJob("webhook_url has no host", field)
    if parts.username or parts.password:
        raise InvalidJob(
            "webhook_url may not carry credentials; set WEBHOOK_SECRET to sign deliveries", field
        )
    if not host_allowed(host):
        raise InvalidJob(f"webhook host {host!r} is not in the WEBHOOK_ALLOWED_HOSTS setting", field)
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        literal = None  # a name: its addresses are vetted when it is resolved, at delivery
    if literal is not None and not address_allowed(literal):
        raise InvalidJob(f"webhook address {host} is not public and not in WEBHOOK_ALLOWED_NETWORKS", field)
    return url


def _embedded_ipv4(ip):
    """The IPv4 address an IPv6 one reaches (IPv4-mapped, 6to4, NAT64), else None."""
    if ip.version != 6:
        return None
    if ip.ipv4_mapped or ip.sixtofour:
        return ip.ipv4_mapped or ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def address_allowed(ip):
    """Whether a webhook may connect to ``ip``: a public address, or one in WEBHOOK_ALLOWED_NETWORKS."""
    # An IPv6 address that carries an IPv4 one reaches that IPv4 host: judge that one.
    target = _embedded_ipv4(ip) or ip
    try:
        networks = [
            ipaddress.ip_network(entry, strict=False) for entry in settings.WEBHOOK_ALLOWED_NETWORKS or ()
        ]
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(f"JOBQUEUE['WEBHOOK_ALLOWED_NETWORKS']: {exc}") from None
    if any(a.version == net.version and a in net for a in (ip, target) for net in networks):
        return True
    return target.is_global and not (
        target.is_loopback
        or target.is_private
        or target.is_link_local
        or target.is_multicast
        or target.is_reserved
        or target.is_unspecified
    )
