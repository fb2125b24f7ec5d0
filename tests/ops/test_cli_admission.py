"""manage.py enqueue takes the debounce and unique options as flags and in the document."""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from queue_app.models import AdmissionKey, Event, Job

pytestmark = pytest.mark.django_db


def run(*args):
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_enqueue_debounces_by_flag_and_by_document_and_says_so():
    flags = ("--debounce-key", "reindex:42", "--debounce-for", "30s", "--debounce-max-wait", "5m")
    first = json.loads(run("enqueue", "--kind", "reindex", "--payload", '{"n": 1}', *flags, "--json"))
    assert first["created"] is True
    said = run("enqueue", "--kind", "reindex", "--payload", '{"n": 2}', *flags)
    assert said.startswith(f"debounced job {first['job']['id']} (pending): now runs at")
    doc = {"kind": "reindex", "payload": {"n": 3}, "debounce_key": "reindex:42", "debounce_for": "1m"}
    again = json.loads(run("enqueue", json.dumps({**doc, "debounce_mode": "keep"}), "--json"))
    assert again["created"] is False and again["job"]["payload"] == {"n": 2}
    assert Job.objects.count() == 1 and Event.objects.filter(type="debounced").count() == 2


def test_enqueue_unique_key_returns_the_pending_job_and_takes_states_separated_by_commas():
    first = json.loads(run("enqueue", "--kind", "sync", "--unique-key", "s:1", "--json"))["job"]
    said = run("enqueue", "--kind", "sync", "--unique-key", "s:1", "--unique-while", "pending,leased")
    assert said == f"unique key 's:1' matched existing job {first['id']} (pending); nothing new enqueued\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--debounce-key", "k"), "debounce_key needs debounce_for"),
        (("--debounce-key", "k", "--debounce-for", "soon"), "debounce_for: invalid duration"),
        (("--unique-key", "k", "--unique-while", "running"), "'running' is not a state"),
        (("--debounce-key", "k", "--debounce-for", "1s", "--run-after", "5"), "does not go with run_after"),
    ],
)
def test_enqueue_refuses_bad_options_and_writes_nothing(args, message):
    with pytest.raises(CommandError, match=message):
        run("enqueue", "--kind", "sync", *args)
    assert not Job.objects.exists() and not AdmissionKey.objects.exists()
