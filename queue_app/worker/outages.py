"""Riding out a database that went away: wait for it, then carry on.

A restart, a failover, a killed backend, exhausted connections, a locked or full SQLite
file: each surfaces as a DatabaseError on whatever query was in flight, and each ends
on its own. What the worker holds when that happens is still its own (the lease outlives
a short outage), so the right move is to wait and retry the very write that failed, not
to give the job up: the owner+attempt fence makes a retried settle safe even if the
first try committed and only its answer was lost, or if the lease lapsed meanwhile.

One warning when an episode starts and one line when the database answers again, per
process: a restart is an expected event, not 50 tracebacks.
"""

import contextlib
import logging
import threading
import time

from django.db import DatabaseError, InterfaceError, OperationalError, connection

log = logging.getLogger("queue_app")

# Backoff between reconnect attempts: from FIRST_DELAY doubling to MAX_DELAY.
FIRST_DELAY = 0.05
MAX_DELAY = 2.0
# A long outage says it is still going every this many seconds.
STILL_DOWN_EVERY = 30.0


def is_outage(exc):
    """Whether ``exc`` says the database (or the connection to it) failed, rather than
    the query: worth waiting out. (IntegrityError, DataError and friends are the query's
    own and would fail again.)"""
    return isinstance(exc, (OperationalError, InterfaceError))


class _Episodes:
    """This process's outage bookkeeping, shared by its threads."""

    def __init__(self, on_begin=None):
        self.lock = threading.Lock()
        self.down_since = None
        self.count = 0  # episodes begun: jobqueue_db_reconnects_total, via the Worker row
        self.on_begin = on_begin

    def began(self, who, exc):
        with self.lock:
            if self.down_since is not None:
                return
            self.down_since = time.monotonic()
            self.count += 1
            if self.on_begin is not None:
                self.on_begin()
        log.warning(
            "database unavailable worker=%s (%s: %s); waiting for it, retrying every %s-%ss",
            who,
            type(exc).__name__,
            str(exc).strip().splitlines()[0] if str(exc).strip() else "",
            FIRST_DELAY,
            MAX_DELAY,
        )

    def ended(self, who):
        with self.lock:
            since, self.down_since = self.down_since, None
        if since is not None:
            log.warning("the database answered again after %.1fs worker=%s", time.monotonic() - since, who)


episodes = _Episodes()


def forked(on_begin=None):
    """In a freshly forked child: its parent's episodes are not its own; ``on_begin``
    is called as each of its own begins (to count it where the supervisor sees it)."""
    global episodes
    episodes = _Episodes(on_begin)


def wait_for_database(who, exc, stopping=None, delay=FIRST_DELAY):
    """Wait ``delay``, then until this thread's connection to the database works again,
    backing off. Return the delay to wait before the next try should that fail too, or
    None if ``stopping`` (an Event) was set first."""
    episodes.began(who, exc)
    last_said = time.monotonic()
    while True:
        if stopping is not None:
            if stopping.wait(delay):
                return None
        else:
            time.sleep(delay)
        delay = min(delay * 2, MAX_DELAY)
        _close()
        try:
            connection.ensure_connection()
            if connection.is_usable():
                return delay
        except DatabaseError:
            pass
        if time.monotonic() - last_said > STILL_DOWN_EVERY:
            last_said = time.monotonic()
            log.warning("database still unavailable worker=%s", who)


def answered(who):
    """Note that a retried write went through: the episode (if any) is over."""
    if episodes.down_since is not None:
        episodes.ended(who)


def retrying(func, *args, who, stopping=None, **kwargs):
    """Call ``func`` until it does not fail for an outage; return what it returned.

    Meant for fenced writes (a settle, a release): running one twice is harmless. If
    ``stopping`` is set while the database is down, the last error is raised."""
    delay = FIRST_DELAY
    while True:
        try:
            value = func(*args, **kwargs)
        except Exception as exc:
            if not is_outage(exc):
                raise
            # A file that is full or locked answers the probe but not the write: the
            # delay grows across tries, not only across probes.
            delay = wait_for_database(who, exc, stopping, delay)
            if delay is None:
                raise
            continue
        answered(who)
        return value


def _close():
    with contextlib.suppress(DatabaseError):
        connection.close()
