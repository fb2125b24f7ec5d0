"""Runtime settings with a real worker process: a value set while it runs reaches its
claims (lease length) and its failures (backoff) within a few seconds, no restart."""

import time
from datetime import timedelta

import pytest

from queue_app import enqueue
from queue_app.core import runtime
from queue_app.models import Job, State, Worker
from tests.worker_support import lease_settings, start_worker, stop, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def leased(job):
    return Job.objects.filter(id=job.id, state=State.LEASED, started_at__isnull=False).first()


def test_a_running_worker_picks_up_a_new_lease_and_backoff_within_seconds(settings):
    settings.JOBQUEUE = lease_settings(RUNTIME_SETTINGS_TTL=0.5)
    proc = start_worker()
    wait_for(lambda: Worker.objects.filter(state="running").exists(), what="the worker to register")
    before = enqueue("sleepy", {"seconds": 1})
    started = wait_for(lambda: leased(before), what="a first job to start")
    assert started.lease_expires_at - started.started_at < timedelta(seconds=31)
    wait_for(lambda: Job.objects.get(id=before.id).state == State.COMPLETED, what="the first job to end")

    runtime.set_value("lease-seconds", "5m", actor="test")
    runtime.set_value("backoff-base", 50, actor="test")
    time.sleep(1.5)  # three TTLs: every process of the worker has read the table again
    slow = enqueue("sleepy", {"seconds": 3})
    failing = enqueue("boom", {}, max_attempts=3)

    running = wait_for(lambda: leased(slow), what="the slow job to start")
    assert running.lease_expires_at - running.started_at > timedelta(seconds=250)
    retried = wait_for(
        lambda: Job.objects.filter(id=failing.id, state=State.PENDING, attempts=1).first(),
        what="the failing job's retry",
    )
    assert retried.run_at > running.started_at + timedelta(seconds=40)  # 50 ** 1 s, not 2 ** 1
    assert stop(proc) == 0
