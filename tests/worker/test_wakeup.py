"""wakeup.py: an idle worker's wait survives the database going away (the next claim
retries it) instead of ending the worker thread."""

import threading
import time

import pytest

from queue_app.worker import wakeup

pytestmark = pytest.mark.django_db


class FailingWaiter(wakeup.SqliteWaiter):
    """Answers once, then fails as a restarted database would."""

    def __init__(self):
        super().__init__(interval=0.01)
        self.calls = 0

    def _version(self):
        self.calls += 1
        if self.calls > 1:
            raise OSError("server closed the connection unexpectedly")
        return 1


def test_a_failing_wake_up_check_sleeps_out_the_wait_instead_of_raising():
    waiter, stopping = FailingWaiter(), threading.Event()
    began = time.monotonic()
    waiter.wait(0.3, stopping)  # must not raise
    took = time.monotonic() - began
    assert waiter.calls == 2
    assert took >= 0.25  # slept out the poll rather than spinning back to claim


def test_a_lost_listen_connection_is_replaced_on_the_next_wait(monkeypatch):
    class Broken:
        def notifies(self, **kwargs):
            raise OSError("connection lost")

        def close(self):
            pass

    connects = []
    monkeypatch.setattr(
        wakeup.PgWaiter, "_connect", lambda self: connects.append(1) or setattr(self, "conn", Broken())
    )
    waiter, stopping = wakeup.PgWaiter("jobqueue"), threading.Event()
    waiter.wait(0.1, stopping)  # must not raise
    assert waiter.conn is None
    waiter.wait(0.1, stopping)
    assert len(connects) == 2  # LISTEN again after the loss
