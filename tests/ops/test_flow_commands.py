"""manage.py pause / resume / limits."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from queue_app.models import KindLimit, Pause, Schedule
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def run(*args):
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_pause_list_and_resume_a_queue():
    JobFactory.create_batch(2, queue_name="mail")
    assert "paused queue mail" in run("pause", "--queue", "mail", "--reason", "smtp down")
    listing = run("pause", "--list")
    assert "mail" in listing and "2 pending" in listing and "smtp down" in listing
    assert "resumed queue mail" in run("resume", "--queue", "mail")
    assert not Pause.objects.exists()


def test_resume_of_something_not_paused_exits_2():
    with pytest.raises(CommandError, match="not paused") as err:
        run("resume", "--kind", "echo")
    assert err.value.returncode == 2


def test_pause_refuses_a_bad_name_with_status_2_and_writes_nothing():
    with pytest.raises(CommandError) as err:
        run("pause", "--kind", "no spaces")
    assert err.value.returncode == 2
    assert not Pause.objects.exists()


def test_limits_set_show_and_clear():
    out = run("limits", "echo", "--concurrency", "3", "--rate", "10", "--per", "60")
    assert "0/3 leased" in out and "0/10 per 60s" in out
    run("limits", "echo", "--concurrency", "off")
    assert KindLimit.objects.get().concurrency is None
    assert "cleared echo" in run("limits", "echo", "--clear")


def test_limits_set_show_and_clear_a_per_key_limit():
    JobFactory(kind="sync", concurrency_key="a", leased=True)
    JobFactory(kind="sync", concurrency_key="b", leased=True)
    JobFactory(kind="sync", concurrency_key="b", leased=True)
    out = run("limits", "sync", "--per-key", "2")
    assert KindLimit.objects.get().per_key == 2
    assert "3 leased (no cap)" in out and "2 per key (1 at limit)" in out
    run("limits", "sync", "--per-key", "off")
    assert KindLimit.objects.get().per_key is None
    assert "no per-key cap" in run("limits")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--rate", "-2"], "rate_limit must be a positive integer"),
        (["--concurrency", "-3"], "concurrency must be a positive integer"),
        (["--concurrency", "many"], "invalid _optional_int value"),
        ([], "give --concurrency, --per-key"),
        (["--per-key", "-1"], "per_key must be a positive integer"),
        # The good value is not written either.
        (["--concurrency", "2", "--per", "0"], "rate_period"),
    ],
)
def test_limits_refuse_bad_values_with_status_2_and_write_nothing(args, message):
    with pytest.raises(CommandError, match=message) as err:
        run("limits", "echo", *args)
    assert err.value.returncode == 2
    assert not KindLimit.objects.exists()


def test_limits_and_schedules_sync_refuse_a_bad_setting_with_status_2_and_write_nothing(settings):
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "LIMITS": {"echo": {"concurrency": 2}, "add": {"concurrency": -1}},
        "SCHEDULES": {"ok": {"cron": "0 2 * * *", "kind": "echo"}, "bad": {"cron": "never", "kind": "echo"}},
    }
    with pytest.raises(CommandError, match=r"concurrency must be a positive integer") as err:
        run("limits", "--sync")
    assert err.value.returncode == 2
    with pytest.raises(CommandError, match=r"SCHEDULES\['bad'\]") as err:
        run("schedules", "--sync")
    assert err.value.returncode == 2
    assert not KindLimit.objects.exists()
    assert not Schedule.objects.exists()
