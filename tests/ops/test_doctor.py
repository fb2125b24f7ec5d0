"""manage.py doctor on a live installation: healthy exits 0, each planted problem is one
line with its fix and exit 1."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from queue_app.ops import doctor
from tests.factories import JobFactory, WorkerFactory

pytestmark = pytest.mark.django_db


def run_doctor():
    out = StringIO()
    try:
        call_command("doctor", stdout=out)
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, out.getvalue().splitlines()


def test_doctor_on_a_healthy_installation_says_so_and_exits_0():
    JobFactory(leased=True)  # a lease still running is no finding
    WorkerFactory()
    assert run_doctor() == (0, ["healthy: nothing to fix"])


def test_doctor_finds_an_expired_lease_with_no_live_worker_and_says_to_start_one():
    JobFactory(expired=True)
    code, lines = run_doctor()
    assert code == 1
    assert lines == [
        "1 leased job(s) have expired leases and no live worker to recover them: "
        "start a worker (manage.py runworker), which takes them back"
    ]


def test_doctor_leaves_an_expired_lease_to_a_live_worker():
    JobFactory(expired=True)
    WorkerFactory()
    assert doctor.findings() == []


def test_doctor_names_a_lost_worker():
    lost = WorkerFactory(last_heartbeat=timezone.now() - timedelta(hours=1))
    code, lines = run_doctor()
    assert code == 1
    (line,) = lines
    assert line.startswith(f"worker {lost.name} is lost (last heartbeat ")
    assert "restart it" in line


@pytest.mark.django_db(transaction=True)
def test_doctor_finds_sqlite_with_synchronous_off():
    if connection.vendor != "sqlite":
        pytest.skip("journal mode and synchronous are SQLite's")
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA synchronous=OFF")
    try:
        (line,) = doctor.findings()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA synchronous=NORMAL")
    assert line.startswith("SQLite synchronous is OFF")
