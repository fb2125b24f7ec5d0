"""How an idle worker child waits for work: sleep for the poll interval, or until the
database says work may have arrived, whichever comes first. The engine says how its
database tells (Engine.wake_up): on PostgreSQL a NOTIFY that an enqueue sends in its
transaction (so it arrives only on commit); on SQLite and MariaDB a value that moves
when another connection commits (wake_version), looked at every few milliseconds. The
engines' modules say why each works and what it misses; the poll interval stays the
worst case everywhere."""

import logging
import time

from django.db import close_old_connections, connection

from queue_app import engines

log = logging.getLogger("queue_app")


class Waiter:
    """How an idle child waits: sleep for the poll interval."""

    @staticmethod
    def for_connection(options):
        """Return the waiter for this database: its wake-up, or a plain sleep (--burst)."""
        how = None if options.burst else engines.of(connection).wake_up()
        if how is not None and how.channel:
            try:
                return ListenWaiter(how.channel)
            except Exception:
                log.exception("LISTEN failed; falling back to polling")
        elif how is not None and how.interval:
            return VersionWaiter(how.interval)
        return Waiter()

    def wait(self, seconds, stopping):
        stopping.wait(seconds)

    def close(self):
        pass


class ListenWaiter(Waiter):
    """Wait until a NOTIFY arrives on ``channel``."""

    def __init__(self, channel):
        self.channel = channel
        self.conn = None
        self._connect()

    def _connect(self):
        self.conn = engines.of(connection).listen(self.channel)

    def wait(self, seconds, stopping):
        # Short slices so a stop request is seen within a fraction of a second.
        end = time.monotonic() + seconds
        try:
            if self.conn is None:
                self._connect()
            while not stopping.is_set():
                left = end - time.monotonic()
                if left <= 0:
                    return
                for _ in self.conn.notifies(timeout=min(left, 0.25), stop_after=1):
                    return
        except Exception as exc:
            # The server went away (restart, failover): sleep out this wait as a plain
            # poll and LISTEN again next time. Raising would end the worker thread.
            log.warning("LISTEN connection lost (%s); polling until it is back", exc)
            self.close()
            self.conn = None
            stopping.wait(max(0.0, end - time.monotonic()))

    def close(self):
        try:
            if self.conn is not None:
                self.conn.close()
        except Exception:
            pass


class VersionWaiter(Waiter):
    """Look at a value that moves when work may have arrived every ``interval``."""

    def __init__(self, interval):
        self.interval = interval

    def _version(self):
        return engines.of(connection).wake_version()

    def wait(self, seconds, stopping):
        end = time.monotonic() + seconds
        try:
            seen = self._version()
            while not stopping.wait(min(self.interval, max(0.0, end - time.monotonic()))):
                if time.monotonic() >= end or self._version() != seen:
                    return
        except Exception as exc:
            # The database went away: sleep out this wait as a plain poll (the next
            # claim retries it). Raising would end the worker thread.
            log.warning("wake-up check failed (%s); polling", exc)
            close_old_connections()
            connection.close()
            stopping.wait(max(0.0, end - time.monotonic()))


# The names by database, as tests/worker/test_wakeup.py uses them.
PgWaiter = ListenWaiter
SqliteWaiter = MariadbWaiter = VersionWaiter
