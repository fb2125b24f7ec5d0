"""The operator's commands through call_command, and bad input through real
`manage.py` subprocesses: exit status 2, a one-line message, nothing written."""
import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from queue_app import enqueue, transitions
from queue_app.models import DeadLetter, Event, EventType, Job, State
from tests.factories import DeadLetterFactory
from tests.worker_support import manage

pytestmark = pytest.mark.django_db


def run(*args, **options):
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO(), **options)
    return out.getvalue()


def dump():
    """Every row the queue owns, to compare before and after a refused command."""
    return (
        list(Job.objects.order_by("id").values()),
        list(Event.objects.order_by("id").values()),
        list(DeadLetter.objects.order_by("id").values()),
    )


def dead_job(kind="email", payload=None):
    job = enqueue(kind, payload or {"to": "nobody"}, max_attempts=1, queue_name="graveyard")
    [claimed] = transitions.claim("w", limit=1, queues=["graveyard"])
    transitions.fail(claimed.id, worker_id="w", attempt=1, error={"type": "ValueError", "message": "bad", "traceback": ""})
    job.refresh_from_db()
    return job


# --- enqueue -----------------------------------------------------------------------------


def test_enqueue_with_flags_prints_the_new_job_id():
    out = run("enqueue", "--kind", "email", "--payload", '{"to": "user@example.com"}', "--priority", "20",
              "--queue", "mail", "--max-attempts", "5", "--timeout", "2m")
    job = Job.objects.get()
    assert f"enqueued job {job.id}" in out
    assert (job.kind, job.queue_name, job.priority, job.max_attempts, job.timeout) == ("email", "mail", 20, 5, 120.0)
    assert job.payload == {"to": "user@example.com"}


def test_enqueue_run_after_and_run_at_schedule_the_job():
    before = timezone.now()
    run("enqueue", "--kind", "email", "--run-after", "5m")
    run("enqueue", "--kind", "email", "--run-at", "2030-01-02T03:04:05Z")
    later, fixed = Job.objects.order_by("id")
    assert timedelta(minutes=5) <= later.run_at - before < timedelta(minutes=5, seconds=5)
    assert fixed.run_at.isoformat() == "2030-01-02T03:04:05+00:00"


def test_enqueue_json_document_form_takes_the_same_fields():
    run("enqueue", '{"kind": "report", "payload": {"values": [1, 2]}, "queue": "reports", '
                   '"priority": -5, "run_after": "30s", "idempotency_key": "r1"}')
    job = Job.objects.get()
    assert (job.kind, job.queue_name, job.priority, job.idempotency_key) == ("report", "reports", -5, "r1")
    assert job.run_at > job.created_at + timedelta(seconds=29)


def test_enqueue_says_when_an_idempotency_key_matched_an_existing_job():
    first = run("enqueue", "--kind", "email", "--idempotency-key", "welcome:42", "--json")
    second = run("enqueue", "--kind", "email", "--idempotency-key", "welcome:42")
    data = json.loads(first)
    assert data["created"] is True
    assert f"matched existing job {data['job']['id']}" in second
    assert Job.objects.count() == 1


def test_enqueue_command_is_refused_unless_shell_jobs_are_enabled(settings):
    with pytest.raises(CommandError, match="shell jobs are disabled") as err:
        run("enqueue", "--command", "echo hi")
    assert err.value.returncode == 2
    settings.JOBQUEUE = {**settings.JOBQUEUE, "SHELL_JOBS": True}
    run("enqueue", "--command", "echo hi")
    assert Job.objects.get().payload == {"command": "echo hi"}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--kind", "email", "--payload", "{bad"], "--payload is not valid JSON"),
        (["--kind", "email", "--priority", "500"], "out of range"),
        (["--kind", "email", "--max-attempts", "0"], "max_attempts 0 is out of range"),
        (["--kind", "email", "--run-at", "tomorrow"], "not an RFC 3339 time"),
        (["--kind", "email", "--run-at", "2030-01-02T03:04:05"], "no UTC offset"),
        (["--payload", "{}"], "say what to run"),
        (['{"kind": "email", "colour": "red"}'], "unknown key(s) in the job document: colour"),
        (['{"kind": "email"}', "--priority", "3"], "not both"),
        (["--kind", "bad kind"], "may hold only"),
    ],
)
def test_enqueue_refuses_bad_input_with_status_2_and_writes_nothing(args, message):
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        run("enqueue", *args)
    assert err.value.returncode == 2
    assert not Job.objects.exists()


# --- inspect, status, history ------------------------------------------------------------


def test_inspect_shows_counts_jobs_and_events_with_filters():
    enqueue("email", {"to": "a@example.com"})
    enqueue("report", {}, queue_name="reports")
    dead_job("report")
    data = json.loads(run("inspect", "--json", "--kind", "report"))
    assert data["states"]["dead_letter"] == 1 and data["states"]["pending"] == 1
    assert {j["kind"] for j in data["jobs"]} == {"report"}
    assert data["events"][0]["type"] == "dead_lettered"
    only_dead = json.loads(run("inspect", "--json", "--state", "dead_letter"))
    assert [j["state"] for j in only_dead["jobs"]] == ["dead_letter"]
    table = run("inspect", "--queue", "reports")
    assert "Jobs by state" in table and "reports" in table


def test_inspect_refuses_an_unknown_state():
    with pytest.raises(CommandError, match="unknown state 'done'") as err:
        run("inspect", "--state", "done")
    assert err.value.returncode == 2


def test_status_counts_states_workers_and_recent_throughput():
    job = enqueue("email", {"to": "a@example.com"})
    transitions.claim("w", limit=1)
    transitions.complete(job.id, worker_id="w", attempt=1, result=None)
    dead_job()
    data = json.loads(run("stats", "--json"))
    assert data["states"]["completed"] == 1 and data["states"]["dead_letter"] == 1
    assert data["throughput"]["last_minute"] == {"completed": 1, "failed": 1, "per_minute": 1.0}
    assert data["dead_letters_open"] == 1
    assert "Throughput" in run("status")


def test_history_shows_every_event_and_each_attempts_error():
    job = enqueue("email", {"to": "nobody"}, max_attempts=2)
    for attempt in (1, 2):
        transitions.retry_now(job.id)
        transitions.claim("w", limit=1)
        transitions.fail(job.id, worker_id="w", attempt=attempt,
                         error={"type": "ValueError", "message": f"bad {attempt}", "traceback": "Traceback: here"})
    data = json.loads(run("history", str(job.id), "--json"))
    assert [e["type"] for e in data["events"]] == [
        "enqueued", "rescheduled", "claimed", "failed", "rescheduled", "claimed", "dead_lettered"]
    assert [(a["attempt"], a["outcome"], a["error"]["message"]) for a in data["attempts"]] == [
        (1, "failed", "bad 1"), (2, "dead_lettered", "bad 2")]
    text = run("history", str(job.id))
    assert "ValueError: bad 2" in text and "Traceback: here" in text and "dead_lettered" in text


def test_history_of_an_unknown_job_exits_2():
    with pytest.raises(CommandError, match="job 999 does not exist") as err:
        run("history", "999")
    assert err.value.returncode == 2


# --- requeue, deadletters, cancel -----------------------------------------------------------


def test_requeue_with_a_corrected_payload_and_budget():
    job = dead_job()
    out = run("requeue", str(job.id), "--payload", '{"to": "fixed@example.com"}', "--max-attempts", "4")
    job.refresh_from_db()
    assert "payload replaced" in out
    assert (job.state, job.payload, job.max_attempts, job.attempts) == (
        State.PENDING, {"to": "fixed@example.com"}, 4, 0)
    assert job.events.last().type == EventType.REQUEUED
    assert DeadLetter.objects.get(job=job).resolution == "requeued"


def test_requeue_of_a_pending_job_is_refused_and_writes_nothing():
    job = enqueue("email", {})
    before = dump()
    with pytest.raises(CommandError, match="is pending; cannot requeue") as err:
        run("requeue", str(job.id))
    assert err.value.returncode == 2
    assert dump() == before


def test_requeue_all_matching_requeues_only_matching_dead_jobs_with_yes():
    emails = [dead_job("email") for _ in range(3)]
    report = dead_job("report")
    out = run("requeue", "--all-matching", "--kind", "email", "--yes")
    assert "requeued 3 jobs" in out
    assert set(Job.objects.filter(id__in=[j.id for j in emails]).values_list("state", flat=True)) == {State.PENDING}
    report.refresh_from_db()
    assert report.state == State.DEAD_LETTER


def test_requeue_all_matching_without_a_terminal_needs_yes():
    dead_job()
    before = dump()
    with pytest.raises(CommandError, match="pass --yes") as err:
        run("requeue", "--all-matching")
    assert err.value.returncode == 2
    assert dump() == before


def test_deadletters_lists_open_ones_filtered_by_kind_and_age():
    old = DeadLetterFactory(kind="email", created_at=timezone.now() - timedelta(days=2))
    new = dead_job("email")
    dead_job("report")
    rows = json.loads(run("deadletters", "--kind", "email", "--since", "1d", "--json"))
    assert [r["job_id"] for r in rows] == [new.id]
    assert old.job_id not in [r["job_id"] for r in rows]
    assert "ValueError: bad" in run("deadletters")


def test_cancel_cancels_a_pending_job_and_refuses_a_finished_one():
    job = enqueue("email", {})
    assert f"cancelled job {job.id}" in run("cancel", str(job.id), "--reason", "oops")
    job.refresh_from_db()
    assert job.state == State.CANCELLED
    assert job.events.last().message == "oops"
    with pytest.raises(CommandError, match="is cancelled; cannot cancel") as err:
        run("cancel", str(job.id))
    assert err.value.returncode == 2


def test_every_command_has_help_with_examples():
    from django.core.management import load_command_class

    for name in ("enqueue", "inspect", "status", "history", "requeue", "deadletters", "cancel",
                 "prune", "seed", "demo"):
        cmd = load_command_class("queue_app", name)
        text = cmd.create_parser("manage.py", name).format_help()
        assert "examples:" in text and f"manage.py {name}" in text, name


# --- bad input: exit status 2 and nothing written -----------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["enqueue", "--kind", "email", "--payload", "{not json"], "not valid JSON"),
        (["enqueue", "--kind", "email", "--max-attempts", "-1"], "out of range"),
        (["requeue", "987654"], "does not exist"),
        (["prune", "--older-than", "7d", "--state", "pending"], "cannot prune pending"),
    ],
)
def test_bad_input_is_refused_with_status_2_and_leaves_the_database_unchanged(args, message):
    dead_job()
    enqueue("email", {"to": "a@example.com"})
    before = dump()
    with pytest.raises(CommandError, match=message) as err:
        run(*args)
    assert err.value.returncode == 2
    assert dump() == before


# Through a real process, once for each way a command refuses: argparse's own error and a
# CommandError, both printed as one line with exit status 2.
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "args, message",
    [
        (["enqueue", "--kind", "email", "--run-at", "2030-01-01T00:00:00Z", "--run-after", "5s"], "not allowed with"),
        (["history", "987654"], "does not exist"),
    ],
)
def test_bad_input_in_a_real_process_exits_2_and_leaves_the_database_unchanged(args, message):
    dead_job()
    enqueue("email", {"to": "a@example.com"})
    before = dump()
    proc = manage(*args)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, out
    assert message in out
    assert dump() == before


@pytest.mark.django_db(transaction=True)
def test_enqueue_then_inspect_end_to_end_in_real_processes():
    proc = manage("enqueue", "--kind", "email", "--payload", '{"to": "user@example.com"}', "--priority", "20")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    job = Job.objects.get()
    assert f"enqueued job {job.id}" in out
    proc = manage("inspect", "--json")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert json.loads(out)["jobs"][0]["id"] == job.id
