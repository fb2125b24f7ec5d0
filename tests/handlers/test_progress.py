"""Progress and metadata reported by running handlers: stored on the job (no events),
throttled, visible while the job runs and afterwards in history, admin, dashboard, API."""

import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection
from django.tasks import task
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from queue_app import current_job, enqueue
from queue_app.exceptions import InvalidJob
from queue_app.handlers import context as running
from queue_app.handlers import registry
from queue_app.models import EventType, Job, State
from queue_app.ops import reads as inspection
from queue_app.worker import execution
from tests.factories import JobFactory
from tests.worker_support import lease_settings, start_worker, stop, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
# The tests that run all they test in this process (no worker process, no second
# connection) need no commit: a transaction rolled back after each, not a flush of every
# table.
in_process = pytest.mark.django_db


def halfway(payload):
    """Report 40%, then wait for the test's go-ahead file before finishing."""
    job = current_job()
    job.progress(40, "halfway")
    job.set_metadata(rows=3, source="s3")
    go = Path(payload["go"])
    end = time.monotonic() + 30
    while not go.exists() and time.monotonic() < end:
        time.sleep(0.02)
    job.progress(100, "done")
    job.set_metadata(rows=7)
    return "ok"


def chatty(payload):
    """Report progress many times in a tight loop (the throttle keeps the writes few)."""
    job = current_job()
    for n in range(1, 51):
        job.progress(n * 2, f"step {n}")
    return n


@task(takes_context=True)
def context_task(context, rows):
    context.progress(50, "half")
    context.set_metadata({"rows": rows})
    return context.cancelled()


@pytest.fixture(autouse=True)
def _progress_handlers():
    registry.register("halfway", halfway)
    registry.register("chatty", chatty)


def test_progress_of_a_running_job_is_visible_from_another_connection_and_in_history_after(tmp_path, capsys):
    go = tmp_path / "go"
    job = enqueue("halfway", {"go": str(go)})
    proc = start_worker(concurrency=1, batch=1)
    try:
        # The worker is another process: this is another connection reading the row.
        # The metadata came within the throttle interval: a timer writes it while it waits.
        seen = wait_for(
            lambda: Job.objects.leased().filter(id=job.id, progress=40, metadata__isnull=False).first(),
            what="progress while it runs",
        )
        assert (seen.progress_message, seen.metadata) == ("halfway", {"rows": 3, "source": "s3"})
        go.write_text("go")
        wait_for(
            lambda: Job.objects.filter(id=job.id, state=State.COMPLETED).exists(), what="the job to finish"
        )
    finally:
        assert stop(proc) == 0
    data = inspection.history(job.id)["job"]
    assert (data["progress"], data["progress_message"]) == (100, "done")
    assert data["metadata"] == {"rows": 7, "source": "s3"}
    # Progress is not a transition: no event for it.
    assert list(Job.objects.get(id=job.id).events.values_list("type", flat=True)) == [
        EventType.ENQUEUED,
        EventType.CLAIMED,
        EventType.COMPLETED,
    ]
    call_command("history", str(job.id))
    out = capsys.readouterr().out
    assert "progress: 100% (done)" in out and '"rows":7' in out.replace(" ", "")


@in_process
def test_progress_writes_are_throttled_and_the_last_value_lands_when_the_handler_ends(settings):
    settings.JOBQUEUE = lease_settings(PROGRESS_INTERVAL=60)
    job = enqueue("chatty")

    with CaptureQueriesContext(connection) as queries:
        done = execution.run_one(worker_id="here/0.0")

    sqls = [q["sql"] for q in queries.captured_queries]
    writes = [sql for sql in sqls if sql.startswith("UPDATE") and "progress_message" in sql]
    # The first report at once, the other 49 held back, the latest written at the end.
    assert len(writes) == 2
    assert (done.state, done.progress, done.progress_message) == (State.COMPLETED, 100, "step 50")
    assert job.id == done.id


@in_process
def test_a_django_task_reports_progress_through_its_context():
    result = context_task.enqueue(rows=12)

    done = execution.run_one(worker_id="here/0.0")

    assert done.id == int(result.id) and done.state == State.COMPLETED
    assert (done.progress, done.progress_message) == (50, "half")
    assert (done.metadata, done.result) == ({"rows": 12}, False)


@in_process
def test_bad_progress_and_metadata_are_refused_and_nothing_is_written():
    job = JobFactory(leased=True)
    with running.activate(job, worker_id="worker-1") as ctx:
        for bad in (101, -1, float("nan"), True, "50", None):
            with pytest.raises(InvalidJob, match="progress must be"):
                ctx.progress(bad)
        with pytest.raises(InvalidJob, match="metadata is not JSON-serializable"):
            ctx.set_metadata(when=object())
        with pytest.raises(InvalidJob, match="metadata must be a JSON object"):
            ctx.set_metadata([1, 2])
    job.refresh_from_db()
    assert (job.progress, job.progress_message, job.metadata) == (None, None, None)


@in_process
def test_a_worker_that_lost_its_lease_writes_no_progress_and_is_told_to_stop():
    job = JobFactory(leased=True, lease_owner="someone-else")
    with running.activate(job, worker_id="worker-1") as ctx:
        assert not ctx.cancelled()
        ctx.progress(10, "mine?")
        assert ctx.cancelled()
    job.refresh_from_db()
    assert job.progress is None


@in_process
def test_current_job_outside_a_handler_says_where_it_works():
    with pytest.raises(LookupError, match="only available while a queue worker runs"):
        current_job()


@in_process
def test_progress_and_metadata_show_in_the_api_admin_and_dashboard(admin_client):
    job = JobFactory(leased=True, progress=62.5, progress_message="copying files", metadata={"files": 9})

    body = admin_client.get(f"/api/jobs/{job.id}").json()
    assert (body["progress"], body["progress_message"]) == (62.5, "copying files")
    assert body["metadata"] == {"files": 9}
    admin_page = admin_client.get(reverse("admin:queue_app_job_change", args=[job.id])).content.decode()
    assert "62.5" in admin_page and "copying files" in admin_page
    page = admin_client.get(reverse("queue_app_dashboard:job", args=[job.id])).content.decode()
    assert 'value="62.5"' in page and "copying files" in page and "&quot;files&quot;: 9" in page
    assert ">Abort</button>" in page
