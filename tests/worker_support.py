"""Handlers for the worker tests, registered on import so that a `manage.py runworker
--import tests.worker_handlers` subprocess has them too."""
import os
import time
from pathlib import Path

from queue_app import registry
from tests import handlers


def spin(payload):
    """Busy-loop in Python for ``seconds``: never sleeps, never yields to a timer."""
    end = time.monotonic() + payload.get("seconds", 60)
    n = 0
    while time.monotonic() < end:
        n += 1
    return n


def mark(payload):
    """Append a line to ``path`` (one line per run), then sleep ``seconds``."""
    with open(payload["path"], "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(payload.get("seconds", 0))
    return "marked"


def flaky(payload):
    """Fail until the marker file has ``fails`` lines, then succeed."""
    path = Path(payload["path"])
    with open(path, "a") as f:
        f.write("x\n")
    if len(path.read_text().splitlines()) <= payload.get("fails", 2):
        raise handlers.Boom("not yet")
    return "ok"


def noop(payload):
    return None


ALL = {"spin": spin, "mark": mark, "flaky": flaky, "noop": noop}


def register_all():
    handlers.register_all()
    for kind, func in ALL.items():
        registry.register(kind, func)


register_all()
