"""The dashboard's pages and actions through Django's test client, per permission,
and `manage.py web` serving them with gunicorn."""

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from queue_app.core import flow, transitions
from queue_app.core.enqueueing import enqueue
from queue_app.handlers import registry
from queue_app.management.commands.web import gunicorn_argv, parse_addr
from queue_app.models import (
    DeadLetter,
    Event,
    EventType,
    Job,
    KindLimit,
    Pause,
    Schedule,
    State,
    Worker,
    WorkerState,
)
from queue_app.ops import dashboard, reads
from queue_app.templatetags import jobqueue_ui
from queue_app.worker import schedules as scheduling
from queue_app.worker.execution import run_one
from tests.factories import DeadLetterFactory, JobFactory, make_staff
from tests.worker_support import end_mark, start_worker, stop, wait_for

pytestmark = pytest.mark.django_db

PAGES = ["overview", "jobs", "running", "dead_letters", "workers", "queues", "schedules"]
READ = ["queue_app.view_job", "queue_app.view_deadletter", "queue_app.view_worker"]


def url(name, *args):
    return reverse(f"queue_app_dashboard:{name}", args=args)


@pytest.fixture
def viewer(client):
    client.force_login(make_staff("viewer", *READ))
    return client


@pytest.fixture
def operator(client):
    perms = [
        *READ,
        "queue_app.change_job",
        "queue_app.delete_job",
        "queue_app.change_worker",
        "queue_app.view_unredacted_payload",
    ]
    client.force_login(make_staff("op", *perms))
    return client


def failed_job(kind="boom", max_attempts=1):
    job = enqueue(kind, {"message": "it broke"}, max_attempts=max_attempts)
    run_one(worker_id="w-test")
    job.refresh_from_db()
    return job


@pytest.mark.parametrize("page", PAGES)
def test_anonymous_visitor_is_sent_to_the_login_page(client, page):
    response = client.get(url(page))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_anonymous_visitor_cannot_post_an_action(client):
    job = JobFactory()
    response = client.post(url("job_action", job.id, "cancel"))
    assert response.status_code == 302
    assert Job.objects.get(id=job.id).state == State.PENDING


@pytest.mark.parametrize("page", PAGES)
def test_staff_without_permission_is_refused_every_page(client, page):
    client.force_login(make_staff("bare"))
    assert client.get(url(page)).status_code == 403


def test_root_redirects_to_the_dashboard(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"] == url("overview")


def test_overview_shows_counts_by_state_and_the_pending_breakdown(viewer):
    JobFactory.create_batch(3)
    JobFactory(scheduled=True)
    # Retrying: failed once and still waiting out its backoff (past it, it is ready).
    JobFactory(attempts=1, scheduled=True)
    JobFactory(run_at=timezone.now() - timedelta(hours=1))
    JobFactory(leased=True)
    JobFactory.create_batch(2, dead=True)
    response = viewer.get(url("overview"))
    assert response.status_code == 200
    counts = response.context["counts"]
    assert counts[State.PENDING] == 6
    assert counts[State.LEASED] == 1
    assert counts[State.DEAD_LETTER] == 2
    pending = response.context["pending"]
    assert (pending["ready"], pending["scheduled"], pending["retrying"], pending["late"]) == (4, 1, 1, 1)
    assert pending["oldest_age"] == "1h 0m"
    html = response.content.decode()
    assert 'data-count="pending">6<' in html
    assert 'data-count="dead_letter">2<' in html


def test_overview_charts_completions_and_failures_of_the_last_hour(viewer):
    enqueue("echo", {"x": 1})
    run_one(worker_id="w")
    failed_job()
    response = viewer.get(url("overview"))
    chart = response.context["chart"]
    assert (chart.completed, chart.failed) == (1, 1)
    assert len(chart.bars) == 60
    html = response.content.decode()
    assert 'class="ok"' in html and 'class="bad"' in html
    assert "it broke" in html  # recent events


def test_partial_returns_only_the_live_region(viewer):
    JobFactory()
    response = viewer.get(url("overview") + "?partial=1")
    html = response.content.decode()
    assert "<html" not in html
    assert 'data-count="pending">1<' in html


def test_jobs_list_filters_by_status_and_pages_by_cursor(viewer, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "DASHBOARD_PAGE_SIZE": 2}
    dead = [JobFactory(dead=True) for _ in range(3)]
    JobFactory()
    first = viewer.get(url("jobs") + "?status=dead_letter").context["page"]
    assert [j.id for j in first.rows] == [dead[2].id, dead[1].id]
    assert first.older == dead[1].id
    second = viewer.get(url("jobs") + f"?status=dead_letter&before={first.older}").context["page"]
    assert [j.id for j in second.rows] == [dead[0].id]
    assert second.older is None


def test_the_older_link_keeps_a_search_with_an_ampersand_and_a_hash(viewer, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "DASHBOARD_PAGE_SIZE": 1}
    jobs = [JobFactory(kind="a&b#c") for _ in range(2)]
    page = viewer.get(url("jobs") + "?kind=a%26b%23c").content.decode()
    assert f'href="?kind=a%26b%23c&amp;before={jobs[1].id}"' in page
    second = viewer.get(url("jobs") + f"?kind=a%26b%23c&before={jobs[1].id}").context["page"]
    assert [j.id for j in second.rows] == [jobs[0].id]


def test_jobs_list_searches_by_id_and_filters_by_kind_and_queue(viewer):
    a = JobFactory(kind="email", queue_name="mail")
    JobFactory(kind="report")
    assert [j.id for j in viewer.get(url("jobs") + f"?q={a.id}").context["page"].rows] == [a.id]
    assert [j.id for j in viewer.get(url("jobs") + "?kind=email").context["page"].rows] == [a.id]
    assert [j.id for j in viewer.get(url("jobs") + "?queue=mail").context["page"].rows] == [a.id]


def test_job_page_shows_the_whole_timeline_with_the_traceback(viewer):
    job = failed_job()
    response = viewer.get(url("job", job.id))
    assert response.status_code == 200
    types = [e.type for e in response.context["events"]]
    assert types == ["enqueued", "claimed", "dead_lettered"]
    html = response.content.decode()
    assert "Traceback (most recent call last)" in html
    assert "it broke" in html
    assert "Requeue" not in html  # a viewer sees no buttons


def test_job_page_of_a_missing_job_is_404(viewer):
    assert viewer.get(url("job", 999999)).status_code == 404


def test_requeue_button_requeues_and_writes_the_event(operator):
    job = failed_job()
    response = operator.post(url("job_action", job.id, "requeue"))
    assert response.status_code == 302
    job.refresh_from_db()
    assert (job.state, job.attempts) == (State.PENDING, 0)
    event = Event.objects.filter(job=job).last()
    assert (event.type, event.worker) == ("requeued", "admin:op")
    assert DeadLetter.objects.get(job=job).resolution == "requeued"


def test_cancel_and_retry_now_buttons_write_their_events(operator):
    scheduled = JobFactory(scheduled=True)
    operator.post(url("job_action", scheduled.id, "retry_now"))
    scheduled.refresh_from_db()
    assert scheduled.run_at <= timezone.now()
    assert Event.objects.filter(job=scheduled).last().type == "rescheduled"
    operator.post(url("job_action", scheduled.id, "cancel"))
    assert Job.objects.get(id=scheduled.id).state == State.CANCELLED
    assert Event.objects.filter(job=scheduled).last().type == "cancelled"


def test_priority_and_payload_edits_write_their_events(operator):
    job = JobFactory(priority=0)
    operator.post(url("job_action", job.id, "change_priority"), {"priority": "7"})
    operator.post(url("job_action", job.id, "edit_payload"), {"payload": '{"to": "a@b.c"}'})
    job.refresh_from_db()
    assert (job.priority, job.payload) == (7, {"to": "a@b.c"})
    assert [e.type for e in Event.objects.filter(job=job)] == ["priority_changed", "payload_changed"]


@pytest.mark.parametrize(
    "action, data, expected",
    [
        ("edit_payload", {"payload": "{not json"}, "payload is not valid JSON"),
        ("change_priority", {"priority": "500"}, "out of range"),
        ("change_priority", {"priority": "high"}, "whole number"),
    ],
)
def test_invalid_input_is_refused_with_a_message_and_nothing_written(operator, action, data, expected):
    job = JobFactory(priority=1, payload={"keep": True})
    response = operator.post(url("job_action", job.id, action), data, follow=True)
    assert expected in response.content.decode()
    job.refresh_from_db()
    assert (job.priority, job.payload) == (1, {"keep": True})
    assert not Event.objects.filter(job=job).exists()


def test_an_action_the_jobs_state_does_not_allow_is_refused_with_a_message(operator):
    job = JobFactory(dead=True)
    response = operator.post(url("job_action", job.id, "cancel"), follow=True)
    assert "cannot cancel" in response.content.decode()
    assert Job.objects.get(id=job.id).state == State.DEAD_LETTER


def test_viewer_cannot_act_on_a_job(viewer):
    job = JobFactory()
    assert viewer.post(url("job_action", job.id, "cancel")).status_code == 403
    assert Job.objects.get(id=job.id).state == State.PENDING
    assert not Event.objects.filter(job=job).exists()


def test_delete_needs_the_delete_permission(client):
    job = JobFactory()
    client.force_login(make_staff("changer", *READ, "queue_app.change_job"))
    assert client.post(url("job_action", job.id, "delete")).status_code == 403
    assert Job.objects.filter(id=job.id).exists()


def test_delete_button_deletes_the_job_and_its_history(operator):
    job = failed_job()
    assert operator.post(url("job_action", job.id, "delete")).status_code == 302
    assert not Job.objects.filter(id=job.id).exists()
    assert not Event.objects.filter(job_id=job.id).exists()


def test_actions_refuse_get(operator):
    job = JobFactory()
    assert operator.get(url("job_action", job.id, "cancel")).status_code == 405


def test_dead_letters_page_lists_unresolved_then_resolved(viewer):
    letter = DeadLetterFactory()
    assert [d.id for d in viewer.get(url("dead_letters")).context["page"].rows] == [letter.id]
    transitions.requeue(letter.job_id)
    assert viewer.get(url("dead_letters")).context["page"].rows == []
    assert [d.id for d in viewer.get(url("dead_letters") + "?resolved=1").context["page"].rows] == [letter.id]


def test_workers_page_tells_lost_workers_apart_and_stop_asks_them_to_stop(operator):
    now = timezone.now()
    alive = Worker.objects.create(name="a", host="h", pid=1, last_heartbeat=now)
    lost = Worker.objects.create(name="b", host="h", pid=2, last_heartbeat=now - timedelta(hours=1))
    statuses = {row["worker"].name: row["status"] for row in operator.get(url("workers")).context["workers"]}
    assert statuses == {"a": "running", "b": "lost"}
    assert dashboard.workers_summary()["lost"] == 1
    operator.post(url("worker_stop", alive.id))
    assert Worker.objects.get(id=alive.id).stop_requested_at is not None
    assert Worker.objects.get(id=lost.id).stop_requested_at is None


def test_stop_asks_first_on_a_page_of_its_own_and_changes_nothing_until_confirmed(operator):
    worker = Worker.objects.create(name="a", host="h", pid=1, jobs_in_hand=2)
    page = operator.get(url("workers")).content.decode()
    assert url("worker_stop", worker.id) in page
    confirm = operator.get(url("worker_stop", worker.id))
    assert confirm.status_code == 200
    assert "Stop worker a?" in confirm.content.decode() and "It holds 2 jobs now" in confirm.content.decode()
    assert Worker.objects.get(id=worker.id).stop_requested_at is None
    operator.post(url("worker_stop", worker.id))
    assert Worker.objects.get(id=worker.id).stop_requested_at is not None


def test_the_workers_page_lists_each_workers_jobs_in_hand_and_its_kinds(operator):
    now = timezone.now()
    Worker.objects.create(name="w1", host="h", pid=1, kinds=["export"], queues=["bulk"])
    Worker.objects.create(name="w10", host="h", pid=2)
    running = JobFactory(
        leased=True, kind="export", lease_owner="w1/tok/c0", started_at=now - timedelta(seconds=90)
    )
    claimed = JobFactory(leased=True, kind="export", lease_owner="w1/tok/c1", started_at=None)
    other = JobFactory(leased=True, kind="echo", lease_owner="w10/tok/c0", started_at=now)
    JobFactory(state=State.PENDING, kind="export")
    response = operator.get(url("workers"))
    held = {
        row["worker"].name: [(h["job"].id, h["child"]) for h in row["held"]]
        for row in response.context["workers"]
    }
    assert held == {"w1": [(running.id, "c0"), (claimed.id, "c1")], "w10": [(other.id, "c0")]}
    page = response.content.decode()
    assert f'data-held="{running.id}"' in page and "running 1m" in page and "not started" in page
    assert "<td>export</td>" in page


def test_quiet_asks_first_on_a_page_of_its_own_then_the_worker_shows_quiet_requested(operator):
    worker = Worker.objects.create(name="a", host="h", pid=1, jobs_in_hand=2)
    assert url("worker_quiet", worker.id) in operator.get(url("workers")).content.decode()
    confirm = operator.get(url("worker_quiet", worker.id)).content.decode()
    assert "Quiet worker a?" in confirm and "It holds 2 jobs now" in confirm
    assert Worker.objects.get(id=worker.id).quiet_requested_at is None
    operator.post(url("worker_quiet", worker.id))
    assert Worker.objects.get(id=worker.id).quiet_requested_at is not None
    page = operator.get(url("workers")).content.decode()
    assert "quiet requested" in page and url("worker_quiet", worker.id) not in page
    Worker.objects.filter(id=worker.id).update(state=WorkerState.QUIET)
    assert 'data-status="quiet"' in operator.get(url("workers")).content.decode()


def test_viewer_cannot_quiet_a_worker(viewer):
    worker = Worker.objects.create(name="a", host="h", pid=1)
    assert viewer.post(url("worker_quiet", worker.id)).status_code == 403
    assert viewer.get(url("worker_quiet", worker.id)).status_code == 403
    assert Worker.objects.get(id=worker.id).quiet_requested_at is None


def test_viewer_cannot_stop_a_worker(viewer):
    worker = Worker.objects.create(name="a", host="h", pid=1)
    assert viewer.post(url("worker_stop", worker.id)).status_code == 403
    assert viewer.get(url("worker_stop", worker.id)).status_code == 403
    assert Worker.objects.get(id=worker.id).stop_requested_at is None


def test_without_the_unredacted_permission_text_search_matches_the_exception_type_only(viewer):
    JobFactory(kind="email", payload={"password": "hunter2"})
    typed = JobFactory(kind="sync", last_error={"type": "ConnectionError", "message": "token=abc"})
    found = [j.id for j in viewer.get(url("jobs"), {"text": "hunter2"}).context["page"].rows]
    assert found == []  # a search would tell what the [redacted] value holds
    assert [j.id for j in viewer.get(url("jobs"), {"text": "token=abc"}).context["page"].rows] == []
    assert [j.id for j in viewer.get(url("jobs"), {"text": "connectionerr"}).context["page"].rows] == [
        typed.id
    ]


def test_jobs_can_be_found_by_text_in_their_payload_or_their_error(client):
    viewer = client
    viewer.force_login(make_staff("seer", *READ, "queue_app.view_unredacted_payload"))
    hit_payload = JobFactory(kind="email", payload={"to": "ops@example.com", "note": "Quarterly REPORT"})
    hit_error = JobFactory(kind="sync", last_error={"type": "ConnectionError", "message": "refused"})
    JobFactory(kind="email", payload={"to": "x@example.com"}, last_error={"type": "ValueError"})

    def found(text, **more):
        return [j.id for j in viewer.get(url("jobs"), {"text": text, **more}).context["page"].rows]

    assert found("quarterly report") == [hit_payload.id]
    assert found("ConnectionError") == [hit_error.id]
    assert found("ConnectionError", kind="email") == []
    assert found("nothing-like-this") == []
    page = viewer.get(url("jobs"), {"text": "Connection"}).content.decode()
    assert 'name="text" value="Connection"' in page


def test_dead_letters_filter_by_kind_and_exception_and_group_by_them(viewer):
    for _ in range(3):
        DeadLetterFactory(kind="sync", error={"type": "ConnectionError", "message": "refused"})
    DeadLetterFactory(kind="sync", error={"type": "ValueError", "message": "bad"})
    email = DeadLetterFactory(kind="email", error={"type": "ConnectionError", "message": "smtp"})
    response = viewer.get(url("dead_letters"))
    groups = [(g["kind"], g["error_type"], g["n"]) for g in response.context["groups"]]
    assert groups == [
        ("sync", "ConnectionError", 3),
        ("email", "ConnectionError", 1),
        ("sync", "ValueError", 1),
    ]
    shown = viewer.get(url("dead_letters"), {"kind": "email"}).context["page"].rows
    assert [d.id for d in shown] == [email.id]
    shown = viewer.get(url("dead_letters"), {"kind": "sync", "error": "ConnectionError"}).context["page"].rows
    assert len(shown) == 3 and {d.kind for d in shown} == {"sync"}


def test_a_missing_job_gets_the_dashboards_own_404_page(viewer):
    response = viewer.get(url("job", 987654))
    assert response.status_code == 404
    page = response.content.decode()
    assert "<h1>Not found</h1>" in page and 'href="/dashboard/jobs/"' in page


def _row(rows, queue, kind):
    (found,) = [r for r in rows if (r["queue"], r["kind"]) == (queue, kind)]
    return found


COUNTS = (
    "waiting",
    "ready",
    "scheduled",
    "retrying",
    "paused",
    "leased",
    "deadletter",
    "completed",
    "failed",
)


def test_queues_page_counts_live_jobs_per_queue_and_kind_by_status(viewer):
    JobFactory.create_batch(2, queue_name="mail", kind="email", run_at=timezone.now() - timedelta(minutes=5))
    JobFactory(queue_name="mail", kind="email", run_at=timezone.now() + timedelta(hours=1))
    JobFactory(queue_name="mail", kind="email", dead=True)
    JobFactory(queue_name="default", kind="echo", state=State.COMPLETED)
    rows = viewer.get(url("queues")).context["rows"]
    assert [(r["queue"], r["kind"]) for r in rows] == [("mail", "email")]
    row = rows[0]
    assert {k: row[k] for k in COUNTS} == {
        "waiting": 0,
        "ready": 2,
        "scheduled": 1,
        "retrying": 0,
        "paused": 0,
        "leased": 0,
        "deadletter": 1,
        "completed": 0,
        "failed": 0,
    }
    assert 290 < row["oldest_ready_seconds"] < 400
    assert not row["queue_paused"] and not row["kind_paused"]


def test_a_paused_queues_jobs_are_held_not_ready_nor_oldest_on_the_queues_page(viewer):
    transitions_at = timezone.now() - timedelta(minutes=30)
    JobFactory.create_batch(3, queue_name="mail", kind="email", run_at=transitions_at)
    JobFactory(queue_name="default", kind="echo", run_at=timezone.now() - timedelta(seconds=10))
    flow.pause(queue="mail", actor="ops", reason="smtp maintenance")
    response = viewer.get(url("queues"))
    mail = _row(response.context["rows"], "mail", "email")
    assert (mail["ready"], mail["paused"], mail["oldest"], mail["queue_paused"]) == (0, 3, None, True)
    echo = _row(response.context["rows"], "default", "echo")
    assert (echo["ready"], echo["paused"], echo["queue_paused"]) == (1, 0, False)
    page = response.content.decode()
    assert 'data-paused="queue"' in page
    # Why, by whom and since when, beside the badge.
    assert re.search(r'data-pause-why="queue">by ops, \d+s ago: smtp maintenance</small>', page)


def test_the_queues_page_shows_the_windows_attempts_rates_and_wait_and_run_percentiles(viewer):
    enqueue("echo", {"n": 1}, queue_name="fast")
    run_one(worker_id="w-test")
    failed_job(kind="boom")
    response = viewer.get(url("queues"))
    rows = response.context["rows"]
    fast = _row(rows, "fast", "echo")
    assert (fast["enqueued"], fast["completed"], fast["failed"], fast["ready"]) == (1, 1, 0, 0)
    assert fast["completed_per_minute"] == pytest.approx(1 / 60)
    assert fast["sampled"] == 1 and 0 <= fast["wait_p50"] <= fast["wait_p95"] < 60
    assert 0 <= fast["run_p50"] <= fast["run_p95"] < 60
    assert sum(fast["completed_series"]) == 1 and len(fast["completed_series"]) == 60
    boom = _row(rows, "default", "boom")
    assert (boom["completed"], boom["failed"], boom["deadletter"]) == (0, 1, 1)
    page = response.content.decode()
    assert page.count('<svg class="spark"') == 2 and "1 enqueued, 1 completed, 0 failed" in page
    assert "?queue=fast&amp;kind=echo&amp;status=ready" in page
    assert '<td class="n" data-count="completed" title="1 completed in 1h">1/h</td>' in page


@pytest.mark.parametrize(
    "per_minute, shown",
    [(0, "0"), (0.001, "<1/h"), (1 / 60, "1/h"), (0.5, "30/h"), (2.25, "2.2/min"), (1234, "1,234/min")],
)
def test_rates_keep_a_trickle_visible(per_minute, shown):
    assert jobqueue_ui.rate(per_minute) == shown


def test_the_queues_pages_percentiles_come_from_each_attempts_claim_and_completion(viewer):
    now = timezone.now()
    for waited, ran in [(1, 2), (2, 4), (3, 6), (4, 8), (100, 200)]:
        job = JobFactory(
            queue_name="q", kind="k", state=State.COMPLETED, attempts=1, run_at=now - timedelta(seconds=300)
        )
        claimed = now - timedelta(seconds=300 - waited)
        Event.objects.create(job=job, type=EventType.CLAIMED, attempt=1, at=claimed)
        Event.objects.create(
            job=job, type=EventType.COMPLETED, attempt=1, at=claimed + timedelta(seconds=ran)
        )
    row = _row(viewer.get(url("queues") + "?window=15m").context["rows"], "q", "k")
    # From the rollup's sketches: within 10% of the exact nearest-rank percentiles.
    assert (row["wait_p50"], row["wait_p95"]) == pytest.approx((3, 100), rel=0.1)
    assert (row["run_p50"], row["run_p95"]) == pytest.approx((6, 200), rel=0.1)
    assert row["completed"] == 5 and len(row["completed_series"]) == 15


def test_the_queues_window_leaves_out_older_attempts_and_refuses_an_unknown_window(viewer):
    job = JobFactory(queue_name="q", kind="k", state=State.COMPLETED)
    Event.objects.create(
        job=job, type=EventType.COMPLETED, attempt=1, at=timezone.now() - timedelta(minutes=10)
    )
    assert _row(viewer.get(url("queues") + "?window=15m").context["rows"], "q", "k")["completed"] == 1
    assert viewer.get(url("queues") + "?window=5m").context["rows"] == []
    response = viewer.get(url("queues") + "?window=9y", follow=True)
    assert response.context["window"] == "1h" and "Unknown window" in response.content.decode()
    day = viewer.get(url("queues") + "?window=24h").context["rows"]
    assert len(_row(day, "q", "k")["completed_series"]) == 24


def test_pause_and_resume_buttons_pause_and_resume_a_queue_and_a_kind(client):
    client.force_login(make_staff("pauser", *READ, "queue_app.add_pause", "queue_app.delete_pause"))
    JobFactory(queue_name="mail", kind="email")
    page = client.get(url("queues")).content.decode()
    assert "Pause queue" in page and "Pause kind" in page and "Resume" not in page
    response = client.post(url("pause"), {"queue": "mail"}, follow=True)
    assert "Paused queue mail." in response.content.decode()
    assert Pause.objects.get().actor == "admin:pauser"
    assert "Resume queue" in response.content.decode()
    assert Job.objects.paused().count() == 1
    client.post(url("pause"), {"kind": "email"})
    assert set(Pause.objects.values_list("scope", "name")) == {("queue", "mail"), ("kind", "email")}
    response = client.post(url("resume"), {"queue": "mail"}, follow=True)
    assert "Resumed queue mail." in response.content.decode()
    assert set(Pause.objects.values_list("scope", "name")) == {("kind", "email")}


def test_a_pause_naming_nothing_is_refused_and_writes_nothing(client):
    client.force_login(make_staff("pauser", *READ, "queue_app.add_pause"))
    response = client.post(url("pause"), {}, follow=True)
    assert "Pause refused: name a queue or a kind" in response.content.decode()
    assert not Pause.objects.exists()


def test_pausing_from_the_dashboard_needs_the_pause_permissions(viewer):
    JobFactory(queue_name="mail", kind="email")
    flow.pause(kind="email")
    assert "Pause queue" not in viewer.get(url("queues")).content.decode()
    assert viewer.post(url("pause"), {"queue": "mail"}).status_code == 403
    assert viewer.post(url("resume"), {"kind": "email"}).status_code == 403
    assert set(Pause.objects.values_list("scope", "name")) == {("kind", "email")}


def test_capped_paginator_stops_counting_at_the_cap(settings):
    JobFactory.create_batch(5)
    with override_settings(JOBQUEUE={**settings.JOBQUEUE, "OPS_COUNT_CAP": 3}):
        paginator = reads.CappedPaginator(Job.objects.all(), 2)
        assert (paginator.count, paginator.capped) == (4, True)
    with override_settings(JOBQUEUE={**settings.JOBQUEUE, "OPS_COUNT_CAP": 10}):
        paginator = reads.CappedPaginator(Job.objects.all(), 2)
        assert (paginator.count, paginator.capped) == (5, False)


def test_age_reads_like_a_person_would_say_it():
    now = timezone.now()
    assert [
        dashboard.age(now - timedelta(seconds=s), now) for s in (5, 125, 3 * 3600 + 300, 2 * 86400 + 7200)
    ] == [
        "5s",
        "2m",
        "3h 5m",
        "2d 2h",
    ]


# --- serving ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "addr, expected", [(":8080", "0.0.0.0:8080"), ("127.0.0.1:9", "127.0.0.1:9"), ("[::1]:80", "[::1]:80")]
)
def test_web_addr_accepts_host_port_and_bare_port(addr, expected):
    assert parse_addr(addr) == expected
    assert expected in gunicorn_argv(addr)


@pytest.mark.parametrize("addr", ["8080", "host:", "host:99999", "a b:80"])
def test_web_refuses_a_malformed_addr(addr):
    with pytest.raises(CommandError, match="is not HOST:PORT"):
        call_command("web", addr=addr)


def test_collectstatic_gathers_the_dashboard_and_admin_assets(tmp_path):
    with override_settings(STATIC_ROOT=tmp_path):
        call_command("collectstatic", interactive=False, verbosity=0)
    assert (tmp_path / "queue_app" / "live.js").exists()
    assert (tmp_path / "admin" / "css" / "base.css.gz").exists()  # whitenoise compressed it


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(address):
    try:
        with urllib.request.urlopen(address, timeout=2) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def _test_database_url():
    # The server's system checks connect (MariaDB asks its version), so point it at
    # the test database this run created.
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    scheme = {"postgresql": "postgres", "mysql": "mysql"}[connection.vendor]
    return f"{scheme}://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or ''}/{db['NAME']}"


# Transactional: a test transaction would hold SQLite's write lock against the server.
@pytest.mark.django_db(transaction=True)
def test_web_serves_admin_and_static_files_with_gunicorn():
    port = _free_port()
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "DATABASE_URL": _test_database_url()}
    proc = subprocess.Popen(
        [sys.executable, str(root / "manage.py"), "web", "--addr", f"127.0.0.1:{port}", "--workers", "1"],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                status, body = _get(base + "/admin/login/")
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    proc.kill()
                    pytest.fail(f"manage.py web did not answer:\n{proc.stdout.read().decode()}")
                time.sleep(0.2)
        assert status == 200 and b"csrfmiddlewaretoken" in body
        status, body = _get(base + "/static/queue_app/dashboard.css")
        assert status == 200 and b".cards" in body
    finally:
        proc.terminate()
        proc.wait(10)


def test_overview_stops_counting_history_at_the_cap_but_counts_live_jobs_exactly(viewer, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "DASHBOARD_COUNT_CAP": 2}
    JobFactory.create_batch(3, state=State.COMPLETED)
    JobFactory.create_batch(3, dead=True)
    response = viewer.get(url("overview"))
    assert response.context["counts"][State.COMPLETED] == 2
    assert response.context["counts"][State.DEAD_LETTER] == 3
    html = response.content.decode()
    assert 'data-count="completed">2+<' in html
    assert 'data-count="dead_letter">3<' in html


def test_the_job_page_refuses_to_requeue_a_shell_job_without_the_shell_permission(operator):
    from tests.factories import JobFactory

    shell = JobFactory(dead=True, kind="shell", payload={"command": "echo hi"})

    response = operator.post(url("job_action", shell.id, "requeue"), follow=True)

    assert "needs the queue_app.enqueue_shell_job permission" in response.content.decode()
    assert Job.objects.get(id=shell.id).state == State.DEAD_LETTER


# --- schedules --------------------------------------------------------------------------


@pytest.fixture
def scheduler(client):
    client.force_login(make_staff("sched", *READ, "queue_app.view_schedule", "queue_app.add_job"))
    return client


def test_the_schedules_page_shows_each_schedules_next_run_and_latest_job(scheduler):
    nightly = Schedule.objects.create(name="nightly", cron="0 3 * * *", kind="echo")
    Schedule.objects.create(name="off", cron="* * * * *", kind="echo", enabled=False)
    scheduling.tick(now=timezone.now())  # nothing due yet: created just now
    tick = timezone.now().replace(microsecond=0)
    enqueue("echo", {}, idempotency_key=scheduling.tick_key(nightly, tick))
    rows = {r["schedule"].name: r for r in scheduler.get(url("schedules")).context["rows"]}
    assert rows["nightly"]["next_run"] is not None and rows["nightly"]["latest_status"] == "ready"
    assert rows["off"]["next_run"] is None and rows["off"]["latest"] is None
    page = scheduler.get(url("schedules")).content.decode()
    assert "disabled" in page and f"{url('jobs')}?schedule=nightly" in page


def test_run_now_enqueues_one_job_of_the_schedule_and_the_schedules_jobs_list_shows_it(scheduler):
    Schedule.objects.create(name="report", cron="0 3 * * *", kind="echo", payload={"r": 1}, queue_name="slow")
    enqueue("echo", {"other": True})
    response = scheduler.post(url("schedule_run_now", "report"), follow=True)
    job = Job.objects.get(idempotency_key__startswith="schedule:report:now:")
    assert (job.kind, job.payload, job.queue_name) == ("echo", {"r": 1}, "slow")
    assert f"job {job.id} enqueued to run now" in response.content.decode()
    shown = [j.id for j in scheduler.get(url("jobs"), {"schedule": "report"}).context["page"].rows]
    assert shown == [job.id]
    assert Schedule.objects.get(name="report").last_tick is None  # the ticks are its own


def test_run_now_of_an_unknown_schedule_is_refused_and_writes_nothing(scheduler):
    response = scheduler.post(url("schedule_run_now", "nope"), follow=True)
    assert "Run now refused: no schedule named &#x27;nope&#x27;" in response.content.decode()
    assert not Job.objects.exists()


def test_run_now_needs_the_enqueue_permission(client):
    client.force_login(make_staff("looker", *READ, "queue_app.view_schedule"))
    Schedule.objects.create(name="report", cron="0 3 * * *", kind="echo")
    assert "Run now" not in client.get(url("schedules")).content.decode()
    assert client.post(url("schedule_run_now", "report")).status_code == 403
    assert not Job.objects.exists()
    assert client.get(url("schedules")).status_code == 200


def test_a_pending_job_that_never_ran_offers_run_now_not_retry_now(operator):
    fresh = JobFactory(run_at=timezone.now() + timedelta(hours=1))
    retrying = JobFactory(attempts=1, run_at=timezone.now() + timedelta(hours=1))
    assert ">Run now</button>" in operator.get(url("job", fresh.id)).content.decode()
    assert ">Retry now</button>" in operator.get(url("job", retrying.id)).content.decode()


def test_the_queues_page_shows_each_kind_limit_and_how_full_it_is(viewer):
    flow.set_limit("export", concurrency=2, rate_limit=10, rate_period=60)
    JobFactory.create_batch(2, leased=True, kind="export")
    JobFactory(kind="export")
    response = viewer.get(url("queues"))
    (limit,) = response.context["limits"]
    assert (limit["limit"].kind, limit["leased"], limit["keys_full"]) == ("export", 2, None)
    page = response.content.decode()
    assert 'data-limit="export"' in page and "2 / 2" in page and "per 1m00s" in page
    (row,) = [r for r in response.context["rows"] if r["kind"] == "export"]
    assert row["limit"]["leased"] == 2
    assert '<span class="warn">2 of 2 leased</span> · 0 of 10 per 1m00s' in page
    assert 'data-fair="off"' in page


def test_the_queues_page_shows_a_fair_kind_its_weights_and_where_its_cycle_resumes(viewer):
    flow.set_limit("report", fair=True, fair_weights={"gold": 3})
    KindLimit.objects.filter(kind="report").update(fair_after="acme")
    page = viewer.get(url("queues")).content.decode()
    assert 'data-fair="on">round-robin by key; weights gold=3; next after acme<' in page


# --- the job page -----------------------------------------------------------------------


def fails_until_third(payload, job):
    if job.attempts < 3:
        raise ConnectionError(f"upstream down (attempt {job.attempts})")
    return {"attempt": job.attempts}


@pytest.fixture
def third_time_lucky():
    registry.register("dash.third", fails_until_third)
    yield "dash.third"
    registry.unregister("dash.third")


def test_the_timeline_shows_each_attempt_as_one_entry_with_its_wait_and_run_time(viewer, third_time_lucky):
    job = enqueue(third_time_lucky, {}, max_attempts=3)
    for _ in range(3):
        Job.objects.filter(id=job.id).update(run_at=timezone.now())
        run_one(worker_id="w-test")
    response = viewer.get(url("job", job.id))
    types = [e.type for e in response.context["events"]]
    assert types == ["enqueued", "claimed", "failed", "claimed", "failed", "claimed", "completed"]
    entries = response.context["timeline"]
    assert [(x["event"].type, x["claim"] is not None) for x in entries] == [
        ("enqueued", False),
        ("failed", True),
        ("failed", True),
        ("completed", True),
    ]
    assert all(x["ran"] >= timedelta(0) and x["waited"] is not None for x in entries[1:])
    html = response.content.decode()
    assert html.count('data-attempt="') == 3 and "<strong>Attempt 3</strong>" in html
    assert response.context["timing"]["ran"] and response.context["timing"]["waited"]


def test_an_open_claim_stays_an_entry_and_the_page_says_how_long_it_has_run(viewer):
    job = JobFactory(leased=True, started_at=timezone.now() - timedelta(seconds=30))
    Event.objects.create(
        job=job,
        type="claimed",
        attempt=1,
        from_state="pending",
        to_state="leased",
        at=timezone.now() - timedelta(seconds=30),
    )
    response = viewer.get(url("job", job.id))
    assert [x["event"].type for x in response.context["timeline"]] == ["claimed"]
    assert response.context["timing"]["running_for"].endswith("s")
    assert 'data-timing="running"' in response.content.decode()


def test_a_retrying_job_says_when_its_next_retry_is(viewer):
    job = JobFactory(attempts=1, run_at=timezone.now() + timedelta(seconds=125))
    html = viewer.get(url("job", job.id)).content.decode()
    assert "next retry in 2m" in html
    fresh = JobFactory(run_at=timezone.now() + timedelta(hours=2, minutes=1))
    assert "runs in 2h" in viewer.get(url("job", fresh.id)).content.decode()


def test_tracebacks_start_at_the_handlers_own_frame(viewer, third_time_lucky):
    job = failed_job(kind=third_time_lucky)
    stored = Job.objects.get(id=job.id).last_error["traceback"]
    assert "/queue_app/worker/execution.py" in stored  # kept in the row
    html = viewer.get(url("job", job.id)).content.decode()
    shown = re.findall(r'<pre class="code tb">(.*?)</pre>', html, re.S)
    assert len(shown) == 2  # the last error, and the timeline's failed attempt
    for tb in shown:
        assert "queue_app/worker/execution.py" not in tb
        assert "frames of jobqueue&#x27;s worker left out" in tb and "in fails_until_third" in tb


def test_user_traceback_keeps_a_traceback_that_is_all_machinery_whole():
    text = 'Traceback (most recent call last):\n  File "/x/queue_app/worker/execution.py", line 1, in f\n    g()\nKeyError: 1'
    assert dashboard.user_traceback(text) == text
    assert dashboard.user_traceback("") == ""


def test_a_refused_payload_edit_shows_the_page_again_with_what_was_typed(operator):
    job = JobFactory(payload={"keep": True})
    typed = '{"to": "ops@example.com", "oops": }'
    response = operator.post(url("job_action", job.id, "edit_payload"), {"payload": typed})
    assert response.status_code == 400
    html = response.content.decode()
    assert "Edit payload refused" in html
    assert "{&quot;to&quot;: &quot;ops@example.com&quot;, &quot;oops&quot;: }" in html
    assert Job.objects.get(id=job.id).payload == {"keep": True}


def test_the_job_page_is_live_its_partial_holds_status_and_timeline_not_the_actions(operator):
    job = JobFactory()
    partial = operator.get(url("job", job.id), {"partial": "1"}).content.decode()
    assert 'data-status="ready"' in partial and 'class="timeline"' in partial
    assert "<textarea" not in partial and "Cancel</button>" not in partial
    page = operator.get(url("job", job.id)).content.decode()
    assert 'data-refresh="' in page and "Cancel</button>" in page


def test_badges_say_states_in_words(viewer):
    job = JobFactory(dead=True)
    listing = viewer.get(url("jobs")).content.decode()
    assert 'data-status="dead_letter" title="dead_letter">dead letter</span>' in listing
    page = viewer.get(url("job", job.id)).content.decode()
    assert 'data-status="dead_letter" title="dead_letter">dead letter</span>' in page


def test_the_running_now_page_lists_leased_jobs_with_worker_child_runtime_progress_and_lease(viewer):
    now = timezone.now()
    w1 = Worker.objects.create(name="w1", host="h", pid=1)
    long = JobFactory(
        leased=True, kind="export", lease_owner="w1/tok/c0", started_at=now - timedelta(minutes=3)
    )
    Job.objects.filter(id=long.id).update(progress=40, progress_message="rows 4,000 of 10,000")
    fresh = JobFactory(leased=True, kind="email", lease_owner="w1/tok/c1", started_at=None)
    Worker.objects.filter(id=w1.id).update(running_threads={str(long.id): 1})
    lapsed = JobFactory(
        expired=True, kind="sync", lease_owner="gone/tok/c0", started_at=now - timedelta(hours=1)
    )
    JobFactory(kind="echo")  # pending: not running
    response = viewer.get(url("running"))
    rows = response.context["rows"]
    assert [r["job"].id for r in rows] == [lapsed.id, long.id, fresh.id]
    assert (rows[1]["worker"], rows[1]["child"], rows[1]["running_for"]) == ("w1", "c0", "3m")
    # The thread from the worker's heartbeat; none for a job no heartbeat saw running.
    assert [r["thread"] for r in rows] == [None, 1, None]
    page = response.content.decode()
    assert (
        "rows 4,000 of 10,000" in page and "not started" in page and "lapsed: recovery takes it back" in page
    )


def test_a_workers_in_hand_count_links_to_running_now_narrowed_to_that_worker(viewer):
    Worker.objects.create(name="w1", host="h", pid=1, jobs_in_hand=1)
    Worker.objects.create(name="w10", host="h", pid=2, jobs_in_hand=1)
    mine = JobFactory(leased=True, lease_owner="w1/tok/c0")
    JobFactory(leased=True, lease_owner="w10/tok/c0")  # "w1" starts its name, not its owner
    assert url("running") + "?worker=w1" in viewer.get(url("workers")).content.decode()
    response = viewer.get(url("running") + "?worker=w1")
    assert [r["job"].id for r in response.context["rows"]] == [mine.id]
    assert "The jobs worker <strong>w1</strong> holds" in response.content.decode()


def test_a_schedule_is_disabled_and_enabled_from_its_page(client):
    client.force_login(make_staff("sched", *READ, "queue_app.view_schedule", "queue_app.change_schedule"))
    Schedule.objects.create(name="nightly", cron="0 3 * * *", kind="echo")
    assert ">Disable</button>" in client.get(url("schedules")).content.decode()
    response = client.post(url("schedule_enable", "nightly"), {"enabled": "0"}, follow=True)
    assert "Schedule nightly disabled." in response.content.decode()
    assert Schedule.objects.get(name="nightly").enabled is False
    assert ">Enable</button>" in response.content.decode()
    client.post(url("schedule_enable", "nightly"), {"enabled": "1"})
    assert Schedule.objects.get(name="nightly").enabled is True
    response = client.post(url("schedule_enable", "nope"), {"enabled": "1"}, follow=True)
    assert "no schedule named" in response.content.decode()


def test_toggling_a_schedule_needs_change_schedule(scheduler):
    Schedule.objects.create(name="nightly", cron="0 3 * * *", kind="echo")
    assert ">Disable</button>" not in scheduler.get(url("schedules")).content.decode()
    assert scheduler.post(url("schedule_enable", "nightly"), {"enabled": "0"}).status_code == 403
    assert Schedule.objects.get(name="nightly").enabled is True


# --- bulk actions from the jobs list ------------------------------------------------------


def bulk(client, **data):
    return client.post(url("bulk"), data, follow=True)


def test_a_bulk_cancel_over_the_filter_restates_it_with_the_count_then_acts_once_confirmed(operator):
    emails = JobFactory.create_batch(3, kind="email")
    other = JobFactory(kind="report")
    page = operator.get(url("jobs"), {"kind": "email"}).content.decode()
    assert 'id="bulk"' in page and 'name="f_kind" value="email"' in page and 'form="bulk"' in page
    confirm = bulk(operator, action="cancel", scope="matching", f_kind="email")
    text = confirm.content.decode()
    assert "<strong>kind</strong> = <code>email</code>" in text and "3 jobs can take it now" in text
    assert not Event.objects.filter(type="cancelled").exists()  # nothing until confirmed
    done = bulk(operator, action="cancel", scope="matching", f_kind="email", confirm="yes")
    assert "Cancel: 3 jobs done." in done.content.decode()
    assert all(Job.objects.get(id=j.id).state == State.CANCELLED for j in emails)
    assert Job.objects.get(id=other.id).state == State.PENDING


def test_a_bulk_action_over_an_empty_filter_is_refused_even_confirmed(operator):
    JobFactory.create_batch(2)
    before = Event.objects.count()
    for confirm in ("", "yes"):
        response = bulk(operator, action="cancel", scope="matching", confirm=confirm)
        assert "no filter is set, so it would be every job" in response.content.decode()
    assert Event.objects.count() == before


def test_a_bulk_requeue_of_the_selected_jobs(operator):
    a, b = JobFactory(dead=True), JobFactory(dead=True)
    untouched = JobFactory(dead=True)
    confirm = bulk(operator, action="requeue", scope="selected", ids=[a.id, b.id])
    assert "2 jobs can take it now" in confirm.content.decode()
    done = bulk(operator, action="requeue", scope="selected", ids=[a.id, b.id, "x"], confirm="yes")
    assert "Requeue: 2 jobs done." in done.content.decode()
    assert {Job.objects.get(id=j.id).state for j in (a, b)} == {State.PENDING}
    assert Job.objects.get(id=untouched.id).state == State.DEAD_LETTER
    assert "no job is selected" in bulk(operator, action="requeue", scope="selected").content.decode()


def test_bulk_actions_need_their_permission(viewer):
    job = JobFactory(kind="email")
    refused = viewer.post(url("bulk"), {"action": "cancel", "scope": "selected", "ids": [job.id]})
    assert refused.status_code == 403
    assert 'id="bulk"' not in viewer.get(url("jobs")).content.decode()
    assert Job.objects.get(id=job.id).state == State.PENDING


def test_a_bulk_action_not_on_offer_is_refused(operator):
    job = JobFactory(kind="email")
    response = bulk(operator, action="edit_payload", scope="selected", ids=[job.id], confirm="yes")
    assert "choose a bulk action" in response.content.decode()
    assert Job.objects.get(id=job.id).state == State.PENDING


def test_every_stamp_and_the_clock_note_use_the_sites_time_zone_24_hour(viewer, settings):
    settings.TIME_ZONE = "Asia/Kolkata"  # +05:30 all year: no daylight saving to dodge
    job = enqueue("echo", {"n": 1})
    created = job.created_at.astimezone(ZoneInfo("Asia/Kolkata"))
    page = viewer.get(url("job", job.id)).content.decode()
    assert created.strftime("%Y-%m-%d %H:%M:%S") in page
    assert 'data-tz="Asia/Kolkata"' in page and "times in Asia/Kolkata, 24-hour" in page
    overview = viewer.get(url("overview")).content.decode()
    assert re.search(r"Read at \d\d:\d\d:\d\d Asia/Kolkata", overview)
    assert " UTC" not in overview


@pytest.mark.django_db(transaction=True)
def test_running_now_shows_the_thread_a_real_worker_runs_each_job_on(viewer, tmp_path):
    # Both run until the test has read the page (a third line in their file): two 4 s jobs
    # could end before a loaded machine's heartbeat and page caught them running.
    marks = tmp_path / "marks"
    jobs = [enqueue("mark", {"path": str(marks), "seconds": 60, "until_lines": 3}) for _ in range(2)]
    ids = {str(j.id) for j in jobs}
    proc = start_worker(name="threads", concurrency=1, threads=2, batch=2, heartbeat=0.2)
    try:
        wait_for(
            lambda: (
                set(
                    Worker.objects.filter(name="threads").values_list("running_threads", flat=True).first()
                    or ()
                )
                == ids
            ),
            timeout=30,
            what="a heartbeat to see both jobs running",
        )
        response = viewer.get(url("running"))
        rows = {r["job"].id: r for r in response.context["rows"]}
        assert {rows[j.id]["thread"] for j in jobs} == {0, 1}
        assert {rows[j.id]["worker"] for j in jobs} == {"threads"}
        assert response.content.decode().count("<td data-thread>") == 2
    finally:
        end_mark(marks)
        stop(proc, within=30)
    # Stopped: it runs nothing, so it shows no thread.
    assert Worker.objects.get(name="threads").running_threads == {}


def test_the_queues_pages_live_counts_are_the_job_tables_after_real_transitions(viewer):
    # The page reads the maintained JobCount and index seeks, not the job table: after
    # jobs move through real transitions (each folded from its event), both agree.
    viewer.get(url("queues"))  # the first fold
    failed_job(kind="boom", max_attempts=1)
    failed_job(kind="boom", max_attempts=3)
    for n in range(3):
        enqueue("echo", {"n": n}, queue_name="mail")
    enqueue("echo", {}, queue_name="mail", run_at=timezone.now() + timedelta(hours=1))
    transitions.claim("w-test/t/c0", queues=["mail"], limit=1)
    enqueue("report", {}, queue_name="mail")
    flow.pause(kind="report")
    rows = viewer.get(url("queues")).context["rows"]
    for r in rows:
        jobs = Job.objects.filter(queue_name=r["queue"], kind=r["kind"])
        expected = {name: jobs.status(name).count() for name in ("ready", "scheduled", "retrying", "paused")}
        expected.update(
            waiting=jobs.filter(state=State.WAITING).count(),
            leased=jobs.filter(state=State.LEASED).count(),
            deadletter=jobs.filter(state=State.DEAD_LETTER).count(),
        )
        assert {k: r[k] for k in expected} == expected, (r["queue"], r["kind"])
    mail = _row(rows, "mail", "echo")
    assert (mail["ready"], mail["scheduled"], mail["leased"]) == (2, 1, 1) and mail["oldest"] is not None
    assert _row(rows, "mail", "report")["paused"] == 1
