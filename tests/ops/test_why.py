"""Why isn't this job running? Each reason set up for real (pauses, limits, schedules,
workers that serve other queues, a backlog ahead of it), read from Python, the job page,
`manage.py history` and the API."""

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from queue_app.core import flow
from queue_app.core.enqueueing import enqueue
from queue_app.models import KindLimit, Worker, WorkerState
from queue_app.ops.why import why
from tests.factories import JobFactory, WorkerFactory, make_staff

pytestmark = pytest.mark.django_db


@pytest.fixture
def worker():
    return WorkerFactory(last_heartbeat=timezone.now())


def code(job):
    job.refresh_from_db()
    return why(job).code


def test_a_ready_job_with_a_live_worker_and_nothing_ahead_is_eligible(worker):
    job = enqueue("echo", {})
    assert code(job) == "eligible"


def test_scheduled_and_retrying_say_when(worker):
    later = enqueue("echo", {}, run_at=timezone.now() + timedelta(minutes=4, seconds=5))
    reason = why(later)
    assert reason.code == "scheduled" and "in 4m0" in reason.text
    retrying = JobFactory(attempts=3, run_at=timezone.now() + timedelta(seconds=12))
    reason = why(retrying)
    assert reason.code == "retrying" and "after attempt 3" in reason.text and "retry in 1" in reason.text


def test_a_paused_queue_says_by_whom_since_when_and_why(worker):
    job = enqueue("echo", {}, queue_name="mail")
    flow.pause(queue="mail", actor="ops:ana", reason="smtp migration")
    reason = why(job)
    assert reason.code == "queue_paused"
    assert "'mail' is paused by ops:ana since" in reason.text and "(smtp migration)" in reason.text
    flow.resume(queue="mail")
    flow.pause(kind="echo")
    assert code(job) == "kind_paused"


def test_a_kind_at_its_concurrency_limit_says_how_many_are_leased(worker):
    flow.set_limit("export", concurrency=2)
    JobFactory.create_batch(2, leased=True, kind="export")
    job = enqueue("export", {})
    reason = why(job)
    assert reason.code == "concurrency_limit" and "(2 of 2 leased)" in reason.text


def test_a_spent_rate_limit_says_until_when(worker):
    flow.set_limit("api", rate_limit=5, rate_period=60)
    KindLimit.objects.filter(kind="api").update(
        window_start=timezone.now() - timedelta(seconds=10), window_count=5
    )
    job = enqueue("api", {})
    reason = why(job)
    assert reason.code == "rate_limit" and "5 of 5 starts per 1m00s" in reason.text and "in 50" in reason.text


def test_a_concurrency_key_at_its_per_key_limit(worker):
    flow.set_limit("sync", per_key=1)
    JobFactory(leased=True, kind="sync", concurrency_key="tenant-1")
    other = enqueue("sync", {}, concurrency_key="tenant-2")
    job = enqueue("sync", {}, concurrency_key="tenant-1")
    assert code(job) == "per_key_limit"
    assert code(other) == "eligible"


def test_no_worker_at_all_and_workers_that_serve_other_queues():
    job = enqueue("echo", {}, queue_name="reports")
    assert code(job) == "no_worker"
    WorkerFactory(queues=["mail"], last_heartbeat=timezone.now())
    WorkerFactory(queues=["*"], kinds=["export"], last_heartbeat=timezone.now())
    WorkerFactory(queues=["*"], last_heartbeat=timezone.now() - timedelta(hours=1))  # lost
    reason = why(job)
    assert reason.code == "no_worker_serves" and "runworker --queue reports" in reason.text
    WorkerFactory(queues=["reports"], last_heartbeat=timezone.now())
    assert code(job) == "eligible"


def test_a_quiet_or_stopping_worker_serves_nothing_new():
    job = enqueue("echo", {}, queue_name="reports")
    quiet = WorkerFactory(queues=["*"], state=WorkerState.QUIET, last_heartbeat=timezone.now())
    WorkerFactory(queues=["*"], state=WorkerState.STOPPING, last_heartbeat=timezone.now())
    reason = why(job)
    assert reason.code == "no_worker" and "quiet or stopping" in reason.text
    WorkerFactory(queues=["mail"], last_heartbeat=timezone.now())
    assert code(job) == "no_worker_serves"
    Worker.objects.filter(id=quiet.id).update(state=WorkerState.RUNNING)
    assert code(job) == "eligible"


def test_busy_workers_count_the_ready_jobs_that_lease_before_it(worker):
    old = timezone.now() - timedelta(minutes=1)
    JobFactory.create_batch(3, run_at=old)  # earlier, same priority
    JobFactory(priority=5)  # higher priority
    JobFactory(priority=-5, run_at=old)  # lower priority: after it
    JobFactory(queue_name="other", run_at=old)  # another queue
    job = enqueue("echo", {})
    reason = why(job)
    assert reason.code == "busy" and "4 ready job(s) of queue 'default' lease before it" in reason.text


def test_running_waiting_and_ended_jobs_say_so():
    assert why(JobFactory(leased=True)).code == "running"
    assert why(JobFactory(dead=True)).code == "ended"
    upstream = enqueue("echo", {})
    waiting = enqueue("echo", {}, depends_on=[upstream.id])
    assert code(waiting) == "waiting"


def test_the_job_page_history_and_the_api_say_why(client, worker):
    job = enqueue("echo", {}, queue_name="mail")
    flow.pause(queue="mail")
    client.force_login(make_staff("viewer", "queue_app.view_job"))
    page = client.get(f"/dashboard/jobs/{job.id}/").content.decode()
    assert 'data-why="queue_paused"' in page and "is paused" in page
    out = StringIO()
    call_command("history", str(job.id), stdout=out)
    assert "why not running: its queue 'mail' is paused" in out.getvalue()
    out = StringIO()
    call_command("history", str(job.id), "--json", stdout=out)
    assert json.loads(out.getvalue())["why"]["code"] == "queue_paused"
    body = client.get(f"/api/jobs/{job.id}").json()
    assert body["why"]["code"] == "queue_paused" and body["why"]["link"] == "/dashboard/queues/"
    done = JobFactory(state="completed")
    assert client.get(f"/api/jobs/{done.id}").json()["why"] is None


def test_the_reasons_times_are_on_the_sites_clock(worker, settings):
    settings.TIME_ZONE = "Asia/Kolkata"
    at = timezone.now() + timedelta(hours=2)
    later = enqueue("echo", {}, run_at=at)
    shown = timezone.localtime(at, timezone.get_current_timezone()).strftime("%Y-%m-%d %H:%M:%S")
    assert f"at {shown} Asia/Kolkata" in why(later).text
    flow.pause(queue="mail", actor="ops")
    assert why(enqueue("echo", {}, queue_name="mail")).text.count("Asia/Kolkata") == 1
