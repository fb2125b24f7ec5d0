"""What `runworker` serves beside its jobs: /metrics (``--metrics-addr``) and the admin,
dashboard and API (``--web-addr``).

Each runs as a child process of the supervisor, the very command an operator would run
on its own (`manage.py metrics --addr`, `manage.py web --addr`). Not a thread in the
supervisor: the supervisor forks its job children, and each fork would inherit a copy
of a server thread's listening socket and database connection. A server in its own
process dies with the supervisor (PR_SET_PDEATHSIG), so a killed worker leaves no
orphan holding the port, and a worker that cannot serve what it was asked to serve
refuses to start instead of running without it.
"""

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager

from django.conf import settings as django_settings

from queue_app.core import addresses

# How long a server has to start listening (the web server collects static files first).
READY_TIMEOUT = 30.0


class SidecarFailed(Exception):
    """A server asked for beside the worker could not start."""


def check_addresses(metrics_addr=None, web_addr=None):
    """Raise ValueError for a malformed address before anything starts."""
    for flag, addr in (("--metrics-addr", metrics_addr), ("--web-addr", web_addr)):
        if addr:
            try:
                addresses.parse(addr)
            except ValueError as exc:
                raise ValueError(f"{flag} {exc}") from None


@contextmanager
def serving(metrics_addr=None, web_addr=None):
    """Run the asked-for servers for the duration of the block; stop them after it."""
    check_addresses(metrics_addr, web_addr)
    started = []
    try:
        if metrics_addr:
            started.append(_start("metrics server", ["metrics", "--addr", metrics_addr], metrics_addr))
        if web_addr:
            started.append(_start("web server", ["web", "--addr", web_addr], web_addr))
        yield
    finally:
        for proc in started:
            _stop(proc)


def _command(args):
    """`python -m django <args>` with this process's settings and import path."""
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = django_settings.SETTINGS_MODULE
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return [sys.executable, "-m", "django", *args], env


def _die_with_parent():
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the parent's stop is all there is
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    # An ignored SIGINT survives exec (a shell ignores it for background jobs), and
    # _stop() stops the servers with SIGINT.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(what, args, addr):
    host, port = addresses.parse(addr)
    # Refuse a taken port up front: once something answers there, a connect cannot tell
    # our server from the one already listening.
    _check_free(what, addr, host, port)
    argv, env = _command(args)
    proc = subprocess.Popen(argv, env=env, preexec_fn=_die_with_parent)
    deadline = time.monotonic() + READY_TIMEOUT
    while not _listening(host, port):
        if proc.poll() is not None:
            raise SidecarFailed(
                f"the {what} for {addr} exited with status {proc.returncode} (its message is above)"
            )
        if time.monotonic() > deadline:
            _stop(proc)
            raise SidecarFailed(f"the {what} for {addr} did not start listening within {READY_TIMEOUT:.0f}s")
        time.sleep(0.05)
    return proc


def _check_free(what, addr, host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As the servers bind: a port lingering in TIME_WAIT is free, a listening one is not.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise SidecarFailed(f"cannot serve the {what} on {addr}: {exc.strerror or exc}") from None


def _listening(host, port):
    # A wildcard address is reached through loopback.
    target = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    try:
        with socket.create_connection((target, port), timeout=0.5):
            return True
    except OSError:
        return False


def _stop(proc, within=10.0):
    """SIGINT (gunicorn's quick shutdown; KeyboardInterrupt for the metrics server), then kill."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(within)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
