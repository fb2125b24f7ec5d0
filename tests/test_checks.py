"""The system check that warns about SQLite options under which workers fail at random."""

from django.core import checks

from queue_app.checks import sqlite_options, sqlite_warnings


def ids(databases):
    return [w.id for w in sqlite_warnings(databases)]


def test_sqlite_with_djangos_defaults_is_warned_about_twice_with_the_fix():
    defaults = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "x.db"}}
    assert ids(defaults) == ["queue_app.W001", "queue_app.W002"]
    assert '"transaction_mode": "IMMEDIATE"' in sqlite_warnings(defaults)[0].hint


def test_the_projects_sqlite_options_and_other_databases_pass():
    good = {
        "ENGINE": "django.db.backends.sqlite3",
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode = WAL;"},
    }
    assert ids({"default": good, "pg": {"ENGINE": "django.db.backends.postgresql"}}) == []
    wal_only = {**good, "OPTIONS": {"init_command": "PRAGMA journal_mode=WAL"}}
    assert ids({"default": wal_only}) == ["queue_app.W001"]


def test_the_check_is_registered_with_django_and_the_projects_settings_pass_it():
    assert sqlite_options in checks.registry.registry.get_checks()
    assert sqlite_options() == []


def test_redaction_settings_that_would_fail_every_page_are_errors(settings):
    from queue_app.checks import redaction_options

    assert redaction_options() == []
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "REDACT_KEYS": "password",
        "REDACT_PATTERNS": ["ok", "(unclosed"],
    }
    errors = redaction_options()
    assert [e.id for e in errors] == ["queue_app.E001", "queue_app.E002"]
    assert "REDACT_PATTERNS\"][1] '(unclosed' is not a regular expression" in errors[1].msg
    settings.JOBQUEUE = {**settings.JOBQUEUE, "REDACT_KEYS": ["token"], "REDACT_PATTERNS": r"\d+"}
    assert [e.id for e in redaction_options()] == ["queue_app.E002"]
