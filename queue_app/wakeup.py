"""How an idle worker child waits for work: sleep for the poll interval, or on
PostgreSQL until an enqueue NOTIFYs the channel (transitions.enqueue sends it in the
enqueuing transaction, so it arrives only on commit)."""
import logging
import time

from django.db import connection

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
        return Waiter()

    def wait(self, seconds, stopping):
        stopping.wait(seconds)

    def close(self):
        pass


class PgWaiter(Waiter):
    def __init__(self, channel):
        import psycopg

        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        self.conn = psycopg.Connection.connect(**params, autocommit=True)
        self.conn.execute(f'LISTEN "{channel}"')

    def wait(self, seconds, stopping):
        # Short slices so a stop request is seen within a fraction of a second.
        end = time.monotonic() + seconds
        while not stopping.is_set():
            left = end - time.monotonic()
            if left <= 0:
                return
            for _ in self.conn.notifies(timeout=min(left, 0.25), stop_after=1):
                return

    def close(self):
        try:
            self.conn.close()
        except Exception:
            pass
