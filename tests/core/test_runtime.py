"""Runtime settings in the store (core/runtime.py): a stored value overrides JOBQUEUE's,
each change leaves an audit row, a bad value is refused with the settings check's message,
and a process reads the table at most once per RUNTIME_SETTINGS_TTL."""

import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from queue_app import enqueue
from queue_app.checks import runtime_options
from queue_app.conf import settings as queue_settings
from queue_app.core import runtime
from queue_app.exceptions import InvalidJob
from queue_app.models import RuntimeSetting, SettingChange

pytestmark = pytest.mark.django_db


def test_a_stored_value_overrides_jobqueue_and_unset_goes_back():
    assert queue_settings.LEASE_SECONDS == 30.0

    runtime.set_value("lease-seconds", "2m", actor="ann")
    assert queue_settings.LEASE_SECONDS == 120.0
    runtime.unset("stale-worker-timeout", actor="bob")  # the same setting

    assert queue_settings.LEASE_SECONDS == 30.0
    assert not RuntimeSetting.objects.exists()
    trail = [(c.name, c.old, c.new, c.actor) for c in runtime.changes()]
    assert trail == [("LEASE_SECONDS", 120.0, 30.0, "bob"), ("LEASE_SECONDS", 30.0, 120.0, "ann")]


def test_a_stored_max_attempts_is_what_an_enqueue_gets():
    runtime.set_value("max-attempts", 7)
    assert enqueue("echo", {}).max_attempts == 7


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("max-attempts", 0, 'JOBQUEUE["DEFAULT_MAX_ATTEMPTS"] must be a whole number in 1..1000, got 0'),
        ("backoff-base", 500, 'JOBQUEUE["BACKOFF_BASE"] must be in 1..100'),
        ("lease-seconds", 0, 'JOBQUEUE["LEASE_SECONDS"] must be more than 0'),
        ("aging-interval", -1, 'JOBQUEUE["AGING_INTERVAL"] must be at least 0'),
        ("recovery-interval", "soon", 'JOBQUEUE["RECOVERY_INTERVAL"]: invalid duration'),
    ],
)
def test_a_bad_value_is_refused_with_the_settings_checks_message_and_nothing_written(name, value, message):
    with pytest.raises(InvalidJob) as refused:
        runtime.set_value(name, value)
    assert str(refused.value).startswith(message)
    assert not RuntimeSetting.objects.exists() and not SettingChange.objects.exists()


def test_the_settings_check_gives_the_same_message_for_a_jobqueue_value(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "DEFAULT_MAX_ATTEMPTS": 0}
    with pytest.raises(InvalidJob) as refused:
        runtime.set_value("max-attempts", 0)
    assert [(e.id, e.msg) for e in runtime_options()] == [("queue_app.E006", str(refused.value))]


def test_an_unknown_name_is_refused_naming_the_allowed_ones():
    with pytest.raises(InvalidJob, match="lease-seconds"):
        runtime.set_value("max-retries-ever", 3)


def test_reads_within_the_ttl_make_no_query_and_a_change_elsewhere_shows_after_it(
    settings, django_assert_num_queries, monkeypatch
):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "RUNTIME_SETTINGS_TTL": 60}
    clock = [1000.0]
    monkeypatch.setattr("queue_app.conf.time.monotonic", lambda: clock[0])
    assert queue_settings.LEASE_SECONDS == 30.0  # the one read of the table
    # Another process stores a value: this one does not ask again within the TTL ...
    RuntimeSetting.objects.create(name="LEASE_SECONDS", value=90.0)
    with django_assert_num_queries(0):
        for _ in range(1000):
            assert queue_settings.LEASE_SECONDS == 30.0
    clock[0] += 61  # ... and sees it once the TTL has passed, with one read
    with django_assert_num_queries(3) as context:  # in a transaction: inside a savepoint
        assert queue_settings.LEASE_SECONDS == 90.0
        assert queue_settings.AGING_INTERVAL == 30.0
    reads = [q["sql"] for q in context.captured_queries if "runtimesetting" in q["sql"]]
    assert len(reads) == 1


def test_config_command_sets_lists_and_unsets(capsys):
    call_command("config", "set", "backoff-cap", "10m")
    call_command("config", "list", "--json")
    listed = {row["name"]: row for row in json.loads(capsys.readouterr().out.split("\n", 1)[1])}
    assert (listed["backoff-cap"]["value"], listed["backoff-cap"]["source"]) == (600.0, "store")
    assert listed["max-attempts"]["source"] == "settings"
    call_command("config", "unset", "backoff-cap")
    assert queue_settings.BACKOFF_MAX_SECONDS == 3600.0
    assert SettingChange.objects.filter(actor__startswith="cli").count() == 2


def test_config_command_exits_2_on_a_bad_value():
    with pytest.raises(CommandError) as refused:
        call_command("config", "set", "max-attempts", "lots")
    assert refused.value.returncode == 2
    assert not SettingChange.objects.exists()
