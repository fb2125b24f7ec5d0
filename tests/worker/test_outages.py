"""worker/outages.py: which errors are waited out, and one log line per episode edge."""

import logging
import threading

import pytest
from django.db import DataError, IntegrityError, InterfaceError, OperationalError

from queue_app.worker import outages


@pytest.mark.parametrize(
    "exc, waited_out",
    [
        (OperationalError("terminating connection due to administrator command"), True),
        (OperationalError("database is locked"), True),
        (OperationalError("database or disk is full"), True),
        (InterfaceError("connection already closed"), True),
        (IntegrityError("UNIQUE constraint failed"), False),
        (DataError("value too long"), False),
        (ValueError("not the database's"), False),
    ],
)
def test_only_a_failing_database_or_connection_is_waited_out(exc, waited_out):
    assert outages.is_outage(exc) is waited_out


def test_an_episode_is_logged_once_when_it_starts_and_once_when_it_ends(caplog):
    outages.forked()  # this process's own bookkeeping, fresh
    with caplog.at_level(logging.WARNING, logger="queue_app"):
        for _ in range(3):  # three threads, or three failed tries, of one outage
            outages.episodes.began("w/0.1", OperationalError("server closed the connection"))
        outages.answered("w/0.1")
        outages.answered("w/0.1")  # nothing left to end
        outages.episodes.began("w/0.1", OperationalError("again"))
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(" ")[0] for line in lines] == ["database", "the", "database"], lines
    assert "server closed the connection" in lines[0] and "answered again after" in lines[1]
    assert outages.episodes.count == 2
    outages.forked()  # leave no open episode to the processes later tests fork from here


@pytest.mark.django_db(transaction=True)
def test_retrying_repeats_a_write_until_the_outage_ends_and_returns_its_value():
    calls = []

    def write():
        calls.append(1)
        if len(calls) < 3:
            raise OperationalError("database is locked")
        return "written"

    outages.forked()
    assert outages.retrying(write, who="w/0.1") == "written"
    assert len(calls) == 3 and outages.episodes.down_since is None


@pytest.mark.django_db(transaction=True)
def test_retrying_gives_up_when_stopping_and_never_retries_the_querys_own_errors():
    stopping = threading.Event()
    stopping.set()
    with pytest.raises(OperationalError):
        outages.retrying(lambda: (_ for _ in ()).throw(OperationalError("down")), who="w", stopping=stopping)
    calls = []

    def bad():
        calls.append(1)
        raise IntegrityError("duplicate")

    with pytest.raises(IntegrityError):
        outages.retrying(bad, who="w")
    assert calls == [1]
