"""Who is asking: the client's address, as django-axes' lockout and the logs should see it.

Behind ``TRUSTED_PROXIES`` reverse proxies, each of which appends the address it was
reached from to ``X-Forwarded-For``, the client is the entry that many places from the
right of that header followed by REMOTE_ADDR (the last proxy). Entries further left were
written by the client and prove nothing. With no trusted proxy the header is ignored, so
a client cannot pick the address it is locked out by; behind one that goes unconfigured
every client shares the proxy's address and one attacker can lock a username out for
everyone (the README says to set it).
"""

from django.conf import settings


def client_ip(request):
    """The client's address: REMOTE_ADDR, or the trusted proxies' view of it."""
    remote = request.META.get("REMOTE_ADDR")
    proxies = int(getattr(settings, "TRUSTED_PROXIES", 0) or 0)
    if proxies <= 0:
        return remote
    forwarded = [a.strip() for a in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if a.strip()]
    chain = [*forwarded, remote]
    if len(chain) <= proxies:
        # Fewer hops than proxies: it did not come through them all; trust only the socket.
        return remote
    return chain[-(proxies + 1)]
