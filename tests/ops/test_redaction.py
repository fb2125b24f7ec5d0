"""Redaction (ops/redaction.py): the rules, the list previews cut by the database, and
the CLI commands that print jobs. The web surfaces: tests/web/test_redaction.py."""

import json
from io import StringIO

import pytest
from django.core.management import call_command
from hypothesis import given
from hypothesis import strategies as st

from queue_app.models import Job
from queue_app.ops import reads, redaction
from tests.factories import DeadLetterFactory, EventFactory, JobFactory

MARK = redaction.MARKER


def secret_job(**extra):
    """A dead job whose payload, result, error, event and output each hide a SECRET."""
    job = JobFactory(
        dead=True,
        kind="login",
        payload={
            "to": "ann@example.com",
            "password": "hunter2-SECRET",
            "headers": {"X-Api-Key": {"nested": "key-SECRET"}, "Accept": "text/plain"},
            "note": "sent with Authorization: Bearer tok-SECRET-abcdef",
        },
        result={"session_token": "sess-SECRET", "ok": True},
        last_error={
            "type": "LoginFailed",
            "message": "login failed for password=pw-SECRET",
            "traceback": "Traceback ...\n  url = 'postgres://bob:db-SECRET@db/x'\n",
        },
        **extra,
    )
    EventFactory(
        job=job,
        type="failed",
        message="failed: api_key=ev-SECRET",
        metadata={"output": {"stdout": "using Bearer out-SECRET-123456\n"}, "error": job.last_error},
    )
    DeadLetterFactory(job=job, error=job.last_error)
    return job


def test_secret_keys_are_replaced_at_any_depth_and_patterns_in_any_string():
    shown = redaction.redact(
        {
            "to": "ann",
            "Password": "x",
            "items": [{"X-Api-Key": {"a": 1}}, {"db_passwd": 2}],
            "header": "Authorization: Bearer abcdefghijkl",
            "url": "https://bob:pw@example.com/",
            "line": "retrying with token=abc123, then",
            "plain": "nothing here",
        }
    )
    assert shown == {
        "to": "ann",
        "Password": MARK,
        "items": [{"X-Api-Key": MARK}, {"db_passwd": MARK}],
        "header": f"Authorization: {MARK}",
        "url": f"https://{MARK}@example.com/",
        "line": f"retrying with {MARK}, then",
        "plain": "nothing here",
    }


def test_the_settings_choose_the_keys_and_patterns(settings):
    settings.JOBQUEUE = {"REDACT_KEYS": ["ssn"], "REDACT_PATTERNS": [r"\d{3}-\d{2}-\d{4}"]}
    assert redaction.redact({"ssn": "1", "password": "p", "t": "id 123-45-6789"}) == {
        "ssn": MARK,
        "password": "p",
        "t": f"id {MARK}",
    }


def test_a_preview_stops_at_the_first_secret_key():
    text = '{"to": "a@b", "note": "a \\"password\\": x", "password": "hunter2", "z": 1}'
    assert redaction.preview(text) == f'{{"to": "a@b", "note": "a \\"password\\": x", "password": "{MARK}"…'
    assert redaction.preview('{"a": "Bearer abcdefghijk') == f'{{"a": "{MARK}'
    assert redaction.preview('{"to": "a@b"}') == '{"to": "a@b"}'


# A JSON value whose secrets are distinct words no key or other value contains.
_words = st.text(alphabet="abcdefgh ", max_size=12)
_values = st.recursive(
    st.none() | st.integers() | _words,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_words, inner, max_size=3),
    max_leaves=8,
)


@given(
    payload=st.dictionaries(_words, _values, max_size=4),
    cut=st.integers(min_value=1, max_value=400),
    compact=st.booleans(),
)
def test_no_cut_of_a_payload_shows_a_secret_in_its_preview(payload, cut, compact):
    # Every database's JSON text (spaced or compact), cut anywhere, as the lists get it.
    payload = {**payload, "inner": [{"Api-Key": "zzSECRETzz"}], "password": "zzSECRETzz"}
    separators = (",", ":") if compact else (", ", ": ")
    text = json.dumps(payload, separators=separators)[:cut]
    assert "SECRET" not in redaction.preview(text)


@pytest.mark.django_db
def test_list_rows_previews_and_details_are_redacted_and_the_rows_unchanged():
    job = secret_job()
    stored = Job.objects.values("payload", "result", "last_error").get(id=job.id)

    row = reads.job_page().rows[0]
    assert "SECRET" not in f"{row.payload_preview}{row.result_preview}{row.last_error_message}"
    assert "ann@example.com" in row.payload_preview
    letter = reads.dead_letter_page().rows[0]
    assert "SECRET" not in f"{letter.payload_preview}{letter.error_message}"
    detail = reads.job_detail(job.id)
    shown = [detail["job"].payload, detail["job"].result, detail["job"].last_error]
    shown += [(e.message, e.metadata) for e in detail["events"]]
    shown += [d.error for d in detail["dead_letters"]]
    assert "SECRET" not in repr(shown)
    assert detail["job"].payload["to"] == "ann@example.com"

    assert "pw-SECRET" in reads.job_page(unredacted=True).rows[0].last_error_message
    assert reads.job_detail(job.id, unredacted=True)["job"].payload["password"] == "hunter2-SECRET"
    assert Job.objects.values("payload", "result", "last_error").get(id=job.id) == stored


@pytest.mark.django_db
@pytest.mark.parametrize(
    "args",
    [
        ["inspect", "--json"],
        ["inspect"],
        ["history", "{id}", "--json"],
        ["history", "{id}"],
        ["deadletters", "--json"],
        ["deadletters"],
    ],
)
def test_commands_that_print_jobs_redact_unless_told_unredacted(args):
    job = secret_job()
    args = [a.format(id=job.id) for a in args]
    out = StringIO()
    call_command(*args, stdout=out)
    assert "SECRET" not in out.getvalue()
    if "--json" in args:
        out = StringIO()
        call_command(*args, "--unredacted", stdout=out)
        assert "hunter2-SECRET" in out.getvalue() or "pw-SECRET" in out.getvalue()
