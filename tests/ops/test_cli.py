"""The operator's commands through call_command, and bad input through real
`manage.py` subprocesses: exit status 2, a one-line message, nothing written."""

import json
import re
from datetime import datetime, timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command, load_command_class
from django.utils import timezone

import queue_app.management.commands
from queue_app import enqueue
from queue_app.core import transitions
from queue_app.models import (
    ApiKey,
    DeadLetter,
    Event,
    EventType,
    Job,
    KindLimit,
    Pause,
    Schedule,
    State,
    Worker,
)
from tests.factories import DeadLetterFactory
from tests.worker_support import manage

pytestmark = pytest.mark.django_db


def run(*args, **options):
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO(), **options)
    return out.getvalue()


COMMANDS = sorted(
    p.stem
    for p in Path(queue_app.management.commands.__file__).parent.glob("*.py")
    if not p.stem.startswith("_")
)


def dump():
    """Every row the queue owns, to compare before and after a refused command."""
    return [
        list(model.objects.order_by("pk").values())
        for model in (Job, Event, DeadLetter, KindLimit, Pause, Schedule, Worker, ApiKey)
    ]


def help_text(name):
    return load_command_class("queue_app", name).create_parser("manage.py", name).format_help()


def dead_job(kind="email", payload=None):
    job = enqueue(kind, payload or {"to": "nobody"}, max_attempts=1, queue_name="graveyard")
    [claimed] = transitions.claim("w", limit=1, queues=["graveyard"])
    transitions.fail(
        claimed.id, worker_id="w", attempt=1, error={"type": "ValueError", "message": "bad", "traceback": ""}
    )
    job.refresh_from_db()
    return job


# --- enqueue -----------------------------------------------------------------------------


def test_enqueue_with_flags_prints_the_new_job_id():
    out = run(
        "enqueue",
        "--kind",
        "email",
        "--payload",
        '{"to": "user@example.com"}',
        "--priority",
        "20",
        "--queue",
        "mail",
        "--max-attempts",
        "5",
        "--timeout",
        "2m",
    )
    job = Job.objects.get()
    assert f"enqueued job {job.id}" in out
    assert (job.kind, job.queue_name, job.priority, job.max_attempts, job.timeout) == (
        "email",
        "mail",
        20,
        5,
        120.0,
    )
    assert job.payload == {"to": "user@example.com"}


def test_enqueue_run_after_and_run_at_schedule_the_job():
    before = timezone.now()
    run("enqueue", "--kind", "email", "--run-after", "5m")
    run("enqueue", "--kind", "email", "--run-at", "2030-01-02T03:04:05Z")
    later, fixed = Job.objects.order_by("id")
    assert timedelta(minutes=5) <= later.run_at - before < timedelta(minutes=5, seconds=5)
    assert fixed.run_at.isoformat() == "2030-01-02T03:04:05+00:00"


def test_enqueue_json_document_form_takes_the_same_fields():
    run(
        "enqueue",
        '{"kind": "report", "payload": {"values": [1, 2]}, "queue": "reports", '
        '"priority": -5, "run_after": "30s", "idempotency_key": "r1"}',
    )
    job = Job.objects.get()
    assert (job.kind, job.queue_name, job.priority, job.idempotency_key) == ("report", "reports", -5, "r1")
    assert job.run_at > job.created_at + timedelta(seconds=29)


def test_enqueue_takes_follow_ups_and_a_webhook_as_flags_and_in_the_document(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "WEBHOOK_ALLOWED_HOSTS": ["hooks.example.com"]}
    run(
        "enqueue",
        "--kind",
        "report",
        "--on-success",
        '{"kind": "email", "payload": {"to": "boss@example.com"}, "priority": 5}',
        "--on-failure",
        '{"kind": "alert"}',
        "--webhook-url",
        "https://hooks.example.com/jobs",
    )
    run(
        "enqueue",
        '{"kind": "report", "on_success": {"kind": "email"}, '
        '"on_failure": {"kind": "alert", "payload": {"team": "ops"}}, '
        '"webhook_url": "https://hooks.example.com/other"}',
    )
    flags, document = Job.objects.order_by("id")
    assert flags.on_success == {"kind": "email", "payload": {"to": "boss@example.com"}, "priority": 5}
    assert (flags.on_failure, flags.webhook_url) == ({"kind": "alert"}, "https://hooks.example.com/jobs")
    assert document.on_success == {"kind": "email"}
    assert document.on_failure == {"kind": "alert", "payload": {"team": "ops"}}
    assert document.webhook_url == "https://hooks.example.com/other"


def test_enqueue_unique_for_dedupes_a_key_only_within_the_window_as_a_flag_and_in_the_document():
    first = json.loads(run("enqueue", "--kind", "digest", "--idempotency-key", "d:1", "--json"))["job"]
    Job.objects.filter(id=first["id"]).update(created_at=timezone.now() - timedelta(hours=2))

    within = run("enqueue", '{"kind": "digest", "idempotency_key": "d:1", "unique_for": "3h"}')
    assert f"matched existing job {first['id']}" in within
    after = json.loads(
        run("enqueue", "--kind", "digest", "--idempotency-key", "d:1", "--unique-for", "1h", "--json")
    )
    assert after["created"] is True and after["job"]["id"] != first["id"]
    assert Job.objects.count() == 2


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
        (["--kind", "email", "--unique-for", "1h"], "unique_for needs an idempotency_key"),
        (["--kind", "email", "--idempotency-key", "k", "--unique-for", "0"], "unique_for"),
        (["--kind", "email", "--unique-for", "soon"], "invalid duration 'soon'"),
        (["--kind", "email", "--on-success", "{bad"], "--on-success is not valid JSON"),
        (["--kind", "email", "--on-success", "[1]"], "on_success must be a dict with a kind"),
        (
            ["--kind", "email", "--on-failure", '{"kind": "alert", "colour": 1}'],
            "on_failure: unknown field(s) colour",
        ),
        (["--kind", "email", "--on-failure", '{"kind": "alert", "priority": 500}'], "on_failure: priority"),
        (["--kind", "email", "--webhook-url", "ftp://hooks.example.com/x"], "must be http or https"),
        (
            ["--kind", "email", "--webhook-url", "https://hooks.example.com/x"],
            "not in the WEBHOOK_ALLOWED_HOSTS",
        ),
        (
            ['{"kind": "email", "unique_for": "soon", "idempotency_key": "k"}'],
            '"unique_for": invalid duration',
        ),
        (['{"kind": "email", "on_success": "email"}'], "on_success must be a dict with a kind"),
        (['{"kind": "email", "webhook_url": "nope"}'], "must be http or https"),
        (['{"kind": "email"}', "--webhook-url", "https://hooks.example.com/x"], "not both"),
    ],
)
def test_enqueue_refuses_bad_input_with_status_2_and_writes_nothing(args, message):
    with pytest.raises(CommandError, match=re.escape(message)) as err:
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
        transitions.fail(
            job.id,
            worker_id="w",
            attempt=attempt,
            error={"type": "ValueError", "message": f"bad {attempt}", "traceback": "Traceback: here"},
        )
    data = json.loads(run("history", str(job.id), "--json"))
    assert [e["type"] for e in data["events"]] == [
        "enqueued",
        "rescheduled",
        "claimed",
        "failed",
        "rescheduled",
        "claimed",
        "dead_lettered",
    ]
    assert [(a["attempt"], a["outcome"], a["error"]["message"]) for a in data["attempts"]] == [
        (1, "failed", "bad 1"),
        (2, "dead_lettered", "bad 2"),
    ]
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
        State.PENDING,
        {"to": "fixed@example.com"},
        4,
        0,
    )
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
    assert set(Job.objects.filter(id__in=[j.id for j in emails]).values_list("state", flat=True)) == {
        State.PENDING
    }
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


def test_the_command_list_is_read_from_the_commands_directory():
    assert {"enqueue", "runworker", "work", "apikey", "web"} <= set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_help_with_examples(name):
    text = help_text(name)
    assert "examples:" in text and re.search(rf"manage\.py {name}\b", text)


# --- --json: the keys each command's help documents ------------------------------------------


def documented(name, keys):
    """Assert each of ``keys`` is named in ``name``'s --help."""
    text = help_text(name)
    missing = [k for k in keys if not re.search(rf"\b{k}\b", text)]
    assert not missing, f"{name} --help does not mention {missing}"


def test_enqueue_json_is_created_and_the_job_with_the_keys_its_help_names():
    data = json.loads(run("enqueue", "--kind", "email", "--payload", '{"to": "a@example.com"}', "--json"))
    assert set(data) == {"created", "job"} and data["created"] is True
    job = data["job"]
    assert set(job) == {
        "id",
        "kind",
        "queue",
        "state",
        "status",
        "priority",
        "payload",
        "attempts",
        "max_attempts",
        "crashes",
        "idempotency_key",
        "concurrency_key",
        "ordering_key",
        "run_at",
        "created_at",
        "started_at",
        "finished_at",
        "lease_owner",
        "lease_expires_at",
        "timeout",
        "result",
        "last_error",
        "progress",
        "progress_message",
        "metadata",
        "cancel_requested_at",
    }
    assert (type(job["id"]), job["kind"], job["state"], job["payload"]) == (
        int,
        "email",
        "pending",
        {"to": "a@example.com"},
    )
    assert datetime.fromisoformat(job["run_at"])
    documented("enqueue", [*data, *job])


def test_workers_json_is_a_list_of_workers_with_the_keys_its_help_names():
    Worker.objects.create(
        name="w1", host="h", pid=42, queues=["*"], kinds=["email"], stop_requested_at=timezone.now()
    )
    [row] = json.loads(run("workers", "--json"))
    assert set(row) == {
        "name",
        "host",
        "pid",
        "status",
        "queues",
        "kinds",
        "concurrency",
        "threads",
        "jobs_in_hand",
        "jobs_done",
        "started_at",
        "heartbeat_age",
        "stop_requested",
        "quiet_requested",
    }
    assert (row["name"], row["pid"], row["status"], row["queues"], row["kinds"], row["stop_requested"]) == (
        "w1",
        42,
        "running",
        ["*"],
        ["email"],
        True,
    )
    assert isinstance(row["heartbeat_age"], float)
    assert datetime.fromisoformat(row["started_at"])
    documented("workers", row)


def test_every_other_json_output_has_the_keys_its_help_names():
    job = dead_job()
    documented("status", json.loads(run("status", "--json")))
    documented("inspect", json.loads(run("inspect", "--json")))
    documented("history", json.loads(run("history", str(job.id), "--json")))
    documented("deadletters", json.loads(run("deadletters", "--json"))[0])


# --- bad input: exit status 2 and nothing written -----------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["enqueue", "--kind", "email", "--payload", "{not json"], "not valid JSON"),
        (["enqueue", "--kind", "email", "--max-attempts", "-1"], "out of range"),
        (["requeue", "987654"], "does not exist"),
        (["prune", "--older-than", "7d", "--state", "pending"], "cannot prune pending"),
        (["prune", "--older-than", "soon"], "invalid duration 'soon'"),
        (["inspect", "--limit", "-1"], "must be at least 1"),
        (["limits", "email", "--concurrency", "-3"], "concurrency must be a positive integer"),
        (["limits", "email", "--rate", "10", "--per", "-5"], "rate_period"),
        (["limits", "email"], "give --concurrency, --per-key"),
        (["pause", "--kind", "no spaces"], "kind"),
        (["resume", "--kind", "email"], "kind email is not paused"),
        (["stopworkers", "--worker", "nosuch"], "no running worker named nosuch"),
        (["apikey", "revoke", "nosuch"], "no active key named 'nosuch'"),
        (["apikey", "create", "ops"], "a key named 'ops' already exists"),
        (["apikey", "create", " "], "the key name must be 1 to 100 characters"),
        (["apikey", "rotate"], "invalid choice: 'rotate'"),
        (["metrics", "--addr", "bogus"], "--addr 'bogus' is not HOST:PORT"),
        (["web", "--addr", "bogus"], "--addr 'bogus' is not HOST:PORT"),
        (["web", "--workers", "0"], "must be at least 1"),
        (["web", "--timeout", "-5"], "must be at least 1"),
        (["deadletters", "--since=-1h"], "invalid duration"),
    ],
)
def test_bad_input_is_refused_with_status_2_and_leaves_the_database_unchanged(args, message):
    dead_job()
    enqueue("email", {"to": "a@example.com"})
    a_row_in_every_table()
    before = dump()
    with pytest.raises(CommandError, match=re.escape(message)) as err:
        run(*args)
    assert err.value.returncode == 2
    assert dump() == before


def a_row_in_every_table():
    """A row in each table dump() compares, so that a refused command has something to change."""
    from queue_app.core import flow
    from queue_app.web import auth as api_auth

    flow.set_limit("email", concurrency=2)
    flow.pause(kind="report", actor="test")
    api_auth.create("ops")
    Worker.objects.create(name="w1", host="h", pid=1, queues=["*"])
    Schedule.objects.create(name="nightly", cron="0 2 * * *", kind="report")


# Through a real process, once for each way a command refuses: argparse's own error and a
# CommandError, both printed as one line with exit status 2.
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["enqueue", "--kind", "email", "--run-at", "2030-01-01T00:00:00Z", "--run-after", "5s"],
            "not allowed with",
        ),
        (["history", "987654"], "does not exist"),
        (["enqueue", "--kind", "email", "--webhook-url", "ftp://x.example.com/"], "must be http or https"),
        (["runworker", "--poll", "0"], "invalid duration '0': must be longer than 0"),
        (["runworker", "--import", "no.such.mod"], "--import no.such.mod"),
        (["stopworkers", "--worker", "nosuch"], "no running worker named nosuch"),
        (["limits", "email", "--concurrency", "-3"], "concurrency must be a positive integer"),
        (["apikey", "revoke", "nosuch"], "no active key named 'nosuch'"),
    ],
)
def test_bad_input_in_a_real_process_exits_2_and_leaves_the_database_unchanged(args, message):
    dead_job()
    enqueue("email", {"to": "a@example.com"})
    a_row_in_every_table()
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
