"""The dashboard's pages and actions through Django's test client, per permission,
and `manage.py web` serving them with gunicorn."""

import os
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from queue_app.core import transitions
from queue_app.core.enqueueing import enqueue
from queue_app.management.commands.web import gunicorn_argv, parse_addr
from queue_app.models import DeadLetter, Event, Job, State, Worker
from queue_app.ops import dashboard, reads
from queue_app.worker.execution import run_one
from tests.factories import DeadLetterFactory, JobFactory, make_staff

pytestmark = pytest.mark.django_db

PAGES = ["overview", "jobs", "dead_letters", "workers", "queues"]
READ = ["queue_app.view_job", "queue_app.view_deadletter", "queue_app.view_worker"]


def url(name, *args):
    return reverse(f"queue_app_dashboard:{name}", args=args)


@pytest.fixture
def viewer(client):
    client.force_login(make_staff("viewer", *READ))
    return client


@pytest.fixture
def operator(client):
    perms = [*READ, "queue_app.change_job", "queue_app.delete_job", "queue_app.change_worker"]
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


def test_viewer_cannot_stop_a_worker(viewer):
    worker = Worker.objects.create(name="a", host="h", pid=1)
    assert viewer.post(url("worker_stop", worker.id)).status_code == 403
    assert Worker.objects.get(id=worker.id).stop_requested_at is None


def test_queues_page_counts_live_jobs_per_queue_and_kind(viewer):
    JobFactory.create_batch(2, queue_name="mail", kind="email")
    JobFactory(queue_name="mail", kind="email", dead=True)
    JobFactory(queue_name="default", kind="echo", state=State.COMPLETED)
    rows = viewer.get(url("queues")).context["rows"]
    assert rows == [
        {"queue": "mail", "kind": "email", "waiting": 0, "pending": 2, "leased": 0, "deadletter": 1}
    ]


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
