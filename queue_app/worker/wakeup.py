"""How an idle worker child waits for work: sleep for the poll interval, or on
PostgreSQL until an enqueue NOTIFYs the channel (transitions.enqueue sends it in the
enqueuing transaction, so it arrives only on commit), or on SQLite until the database
file changes.

SQLite has no NOTIFY, but ``PRAGMA data_version`` changes whenever another connection
commits to the file, and reading it touches no table (it costs microseconds). So an
idle child reads it every SQLITE_WAKE_INTERVAL and returns to claim as soon as it
moved: enqueue-to-start latency is a few milliseconds instead of half the poll
interval, while an idle queue still costs no claim queries. Any commit wakes it
(heartbeats too); the claim that follows simply finds nothing.

MariaDB has neither, so an idle child there reads the newest event id every
MARIADB_WAKE_INTERVAL: every edge that makes a job ready (enqueue, requeue, retry
now, lease recovery) appends an event in the same transaction, so the id moves on
commit, and MAX() of the primary key is a single index read ("Select tables optimized
away"). Ids are handed out at insert, not at commit, so an enqueue that commits after a
later insert moved MAX() already, or between the empty claim and the first look, is
found by the ordinary poll instead: the poll interval stays the worst case. So is a job
whose retry or schedule comes due later."""

import logging
import time

from django.db import close_old_connections, connection

from queue_app.conf import settings

log = logging.getLogger("queue_app")


class Waiter:
    """How an idle child waits: sleep for the poll interval, or on PostgreSQL until an
    enqueue NOTIFYs the channel (whichever comes first)."""

    @staticmethod
    def for_connection(options):
        channel = settings.NOTIFY_CHANNEL
        if connection.vendor == "postgresql" and channel and not options.burst:
            try:
                return PgWaiter(channel)
            except Exception:
                log.exception("LISTEN failed; falling back to polling")
        if connection.vendor == "sqlite" and settings.SQLITE_WAKE_INTERVAL and not options.burst:
            return SqliteWaiter(float(settings.SQLITE_WAKE_INTERVAL))
        if connection.vendor == "mysql" and settings.MARIADB_WAKE_INTERVAL and not options.burst:
            return MariadbWaiter(float(settings.MARIADB_WAKE_INTERVAL))
        return Waiter()

    def wait(self, seconds, stopping):
        stopping.wait(seconds)

    def close(self):
        pass


class PgWaiter(Waiter):
    def __init__(self, channel):
        self.channel = channel
        self.conn = None
        self._connect()

    def _connect(self):
        import psycopg

        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        self.conn = psycopg.Connection.connect(**params, autocommit=True)
        self.conn.execute(f'LISTEN "{self.channel}"')

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
    """Look at a value that moves when work may have arrived (VERSION) every ``interval``."""

    VERSION = None

    def __init__(self, interval):
        self.interval = interval

    def _version(self):
        with connection.cursor() as cursor:
            cursor.execute(self.VERSION)
            return cursor.fetchone()[0]

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


class SqliteWaiter(VersionWaiter):
    # data_version is per connection: it moves for commits by *other* connections,
    # which is what an enqueue is. The worker's own claims do not wake it.
    VERSION = "PRAGMA data_version"


class MariadbWaiter(VersionWaiter):
    VERSION = "SELECT MAX(id) FROM queue_app_event"
