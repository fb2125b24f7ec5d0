"""wait(): returns when a job ends, woken by the database (LISTEN/NOTIFY on PostgreSQL,
the commit watch on SQLite and MariaDB), never by reading the job over and over."""

import asyncio
import time

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from queue_app import await_job, enqueue, wait
from queue_app.exceptions import JobNotFound, WaitTimeout
from queue_app.models import Job, State
from queue_app.web import auth as api_auth
from queue_app.worker.execution import run_one
from tests import sample_tasks as tasks
from tests import worker_support


@pytest.mark.django_db
def test_wait_returns_an_ended_job_at_once_and_refuses_an_unknown_one():
    job = enqueue("echo", {"x": 1})
    run_one()
    assert wait(job, 5).state == State.COMPLETED
    assert wait(job.id, 5).result == {"x": 1}
    with pytest.raises(JobNotFound):
        wait(987654, 1)


@pytest.mark.django_db(transaction=True)
def test_a_timeout_says_which_job_and_its_state_and_the_job_row_is_not_polled():
    job = enqueue("echo")
    with CaptureQueriesContext(connection) as queries:
        started = time.monotonic()
        with pytest.raises(WaitTimeout, match=rf"job {job.id} did not end within 0.5s \(it is pending\)"):
            wait(job, 0.5)
    assert time.monotonic() - started >= 0.5
    # Its row is read at the start and for the message: the rest is the wake-up's watch.
    job_reads = [q for q in queries.captured_queries if "queue_app_job" in q["sql"]]
    assert len(job_reads) == 2, job_reads


@pytest.mark.django_db(transaction=True)
def test_wait_returns_when_a_real_worker_completes_the_job_and_for_a_task_result_and_async(capsys):
    proc = worker_support.start_worker(concurrency=1, poll=5.0)
    try:
        job = enqueue("sleepy", {"seconds": 0.3})
        done = wait(job, 60)
        returned = timezone.now()
        assert done.state == State.COMPLETED
        with capsys.disabled():
            lag = (returned - done.finished_at).total_seconds() * 1000
            print(f"\nwait() returned {lag:.1f} ms after the job's finished_at ({connection.vendor})")
        result = tasks.add.enqueue(2, 3)
        assert wait(result, 60).return_value == 5
        job = enqueue("sleepy", {"seconds": 0.1})
        assert asyncio.run(await_job(job, 60)).state == State.COMPLETED
        # The API's long poll.
        api = Client(headers={"X-API-Key": api_auth.create("waiter")[1]})
        job = enqueue("sleepy", {"seconds": 0.2})
        body = api.get(f"/api/jobs/{job.id}", {"wait": "30s"}).json()
        assert body["state"] == State.COMPLETED
    finally:
        worker_support.stop(proc, within=60)


@pytest.mark.django_db
def test_the_apis_wait_is_bounded_and_a_bad_duration_is_400(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "API_MAX_WAIT_SECONDS": 0.2}
    api = Client(headers={"X-API-Key": api_auth.create("waiter")[1]})
    job = enqueue("echo")
    started = time.monotonic()
    r = api.get(f"/api/jobs/{job.id}", {"wait": "1h"})
    assert r.status_code == 200 and r.json()["state"] == State.PENDING
    assert time.monotonic() - started < 30
    r = api.get(f"/api/jobs/{job.id}", {"wait": "soon"})
    assert r.status_code == 400 and r.json()["field"] == "wait"
    assert Job.objects.get(id=job.id).state == State.PENDING
