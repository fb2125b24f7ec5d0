"""HOST:PORT addresses of the servers (``web``, ``metrics`` and their sidecars beside a
worker): one parser, so every flag accepts and refuses the same strings."""

import re

_ADDR = re.compile(r"^(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9.\-]*):(?P<port>\d{1,5})$")


def parse(addr):
    """':9090' -> ('0.0.0.0', 9090); '[::1]:80' -> ('::1', 80). Raise ValueError when malformed."""
    m = _ADDR.match(addr or "")
    if not m or not 0 < int(m["port"]) < 65536:
        raise ValueError(f"{addr!r} is not HOST:PORT or :PORT (e.g. 127.0.0.1:9090 or :9090)")
    return m["host"].strip("[]") or "0.0.0.0", int(m["port"])


def bind(addr):
    """The form gunicorn's --bind takes: ':8080' -> '0.0.0.0:8080'; '[::1]:80' as given."""
    host, port = parse(addr)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
