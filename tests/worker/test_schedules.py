"""Cron schedules: each due tick enqueued exactly once, missed ticks by policy."""

import time
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from queue_app.exceptions import InvalidJob
from queue_app.models import Event, EventType, Job, Schedule
from queue_app.worker import schedules as scheduling
from tests.conftest import run_processes
from tests.worker_support import lease_settings, start_worker, stop

T0 = datetime(2026, 3, 2, 12, 0, 0, tzinfo=UTC)


def make(**fields):
    fields = {"name": "report", "cron": "*/5 * * * *", "kind": "echo", "created_at": T0, **fields}
    return Schedule.objects.create(**fields)


def keys():
    return sorted(Job.objects.values_list("idempotency_key", flat=True))


@pytest.mark.django_db
def test_a_due_tick_is_enqueued_once_however_often_tick_runs():
    s = make(payload={"to": "ops"}, priority=5, queue_name="reports")
    assert scheduling.tick(now=T0 + timedelta(minutes=4)) == []
    for _ in range(3):
        scheduling.tick(now=T0 + timedelta(minutes=5, seconds=1))
    job = Job.objects.get()
    assert job.idempotency_key == "schedule:report:2026-03-02T12:05:00+00:00"
    assert (job.kind, job.payload, job.priority, job.queue_name) == ("echo", {"to": "ops"}, 5, "reports")
    s.refresh_from_db()
    assert s.last_tick == T0 + timedelta(minutes=5)


@pytest.mark.django_db
def test_every_tick_within_the_grace_period_runs_each_once():
    make(cron="* * * * * */10")  # every ten seconds
    scheduling.tick(now=T0 + timedelta(seconds=35))
    assert len(keys()) == 3
    scheduling.tick(now=T0 + timedelta(seconds=41))
    assert keys()[-1].endswith("12:00:40+00:00") and len(keys()) == 4


@pytest.mark.django_db
def test_missed_ticks_after_downtime_run_once_by_default():
    make(last_tick=T0)
    scheduling.tick(now=T0 + timedelta(hours=3, minutes=2))
    # 36 ticks were missed: one run for all of them (the latest), none within the grace.
    assert keys() == ["schedule:report:2026-03-02T15:00:00+00:00"]
    scheduling.tick(now=T0 + timedelta(hours=3, minutes=5, seconds=1))
    assert keys()[-1] == "schedule:report:2026-03-02T15:05:00+00:00" and len(keys()) == 2


@pytest.mark.django_db
def test_missed_ticks_are_dropped_with_the_skip_policy(settings):
    make(last_tick=T0, missed_ticks="skip")
    scheduling.tick(now=T0 + timedelta(hours=3, minutes=2))
    assert keys() == []
    scheduling.tick(now=T0 + timedelta(hours=3, minutes=5, seconds=1))
    assert keys() == ["schedule:report:2026-03-02T15:05:00+00:00"]


@pytest.mark.django_db
def test_the_setting_sets_the_default_policy(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "SCHEDULE_MISSED_TICKS": "skip"}
    make(last_tick=T0)
    scheduling.tick(now=T0 + timedelta(hours=1, minutes=2))
    assert keys() == []


@pytest.mark.django_db
def test_schedules_follow_their_timezone():
    make(cron="0 9 * * *", timezone="Europe/Paris")
    # 9:00 in Paris is 08:00 UTC in winter.
    scheduling.tick(now=datetime(2026, 3, 3, 8, 0, 5, tzinfo=UTC))
    assert keys() == ["schedule:report:2026-03-03T08:00:00+00:00"]


@pytest.mark.django_db
def test_disabled_schedules_do_not_run():
    make(enabled=False)
    scheduling.tick(now=T0 + timedelta(minutes=5, seconds=1))
    assert keys() == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    "fields, field",
    [
        ({"cron": "every day"}, "cron"),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"kind": ""}, "kind"),
        ({"missed_ticks": "all"}, "missed_ticks"),
    ],
)
def test_bad_schedules_are_refused(fields, field):
    with pytest.raises(InvalidJob) as exc:
        scheduling.validate(**{"name": "x", "cron": "* * * * *", "kind": "echo", **fields})
    assert exc.value.field == field


@pytest.mark.django_db
def test_schedules_from_settings_are_synced_keeping_their_last_tick(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "SCHEDULES": {"nightly": {"cron": "0 3 * * *", "kind": "echo"}}}
    scheduling.sync_schedules()
    Schedule.objects.filter(name="nightly").update(last_tick=T0)
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "SCHEDULES": {"nightly": {"cron": "0 4 * * *", "kind": "echo", "priority": 3}},
    }
    scheduling.sync_schedules()
    s = Schedule.objects.get()
    assert (s.cron, s.priority, s.last_tick, s.from_settings) == ("0 4 * * *", 3, T0, True)
    settings.JOBQUEUE = {**settings.JOBQUEUE, "SCHEDULES": {}}
    scheduling.sync_schedules()
    assert not Schedule.objects.exists()


@pytest.mark.django_db
def test_a_bad_schedule_in_settings_is_refused_with_its_name(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "SCHEDULES": {"oops": {"cron": "nope", "kind": "echo"}}}
    with pytest.raises(InvalidJob, match="oops"):
        scheduling.sync_schedules()


@pytest.mark.django_db
def test_the_schedules_command_lists_each_with_its_next_run():
    make(last_tick=timezone.now())
    make(name="off", enabled=False)
    out = StringIO()
    call_command("schedules", stdout=out)
    text = out.getvalue()
    assert "report" in text and "*/5 * * * *" in text and "off" in text and "disabled" in text


@pytest.mark.django_db
def test_the_schedules_command_refuses_a_bad_sync(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "SCHEDULES": {"oops": {"cron": "nope", "kind": "echo"}}}
    with pytest.raises(CommandError, match="oops"):
        call_command("schedules", "--sync", stdout=StringIO())


def _tick_for(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        scheduling.tick()
        time.sleep(0.02)


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_four_processes_ticking_a_per_second_schedule_enqueue_each_second_once():
    start = timezone.now()
    make(cron="* * * * * *", created_at=start)
    assert run_processes(_tick_for, [(3.0,)] * 4) == [0] * 4
    ticks = [datetime.fromisoformat(k.split(":", 2)[2]) for k in keys()]
    assert len(ticks) == len(set(ticks)) >= 2
    # Consecutive seconds, none skipped and none twice.
    assert [int((t - ticks[0]).total_seconds()) for t in ticks] == list(range(len(ticks)))


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_three_real_workers_for_ten_seconds_enqueue_each_tick_of_a_per_second_schedule_once(settings):
    """The issue's figure: a schedule every second, 3 workers, 10 s. Every supervisor
    ticks it (several times a second here); each second's tick lands once, none skipped."""
    settings.JOBQUEUE = lease_settings(SCHEDULE_INTERVAL=0.2)
    start = timezone.now()
    make(cron="* * * * * *", created_at=start)
    workers = [start_worker(concurrency=1) for _ in range(3)]
    try:
        time.sleep(10)
    finally:
        codes = [stop(proc, within=30) for proc in workers]
    assert codes == [0, 0, 0]
    ticks = [datetime.fromisoformat(k.split(":", 2)[2]) for k in keys()]
    assert len(ticks) >= 8, ticks
    assert [int((t - ticks[0]).total_seconds()) for t in ticks] == list(range(len(ticks)))
    # One enqueue per tick: no tick's job was written and then refused or replaced.
    assert Job.objects.filter(kind="echo").count() == len(ticks)
    assert Event.objects.filter(type=EventType.ENQUEUED).count() == len(ticks)
