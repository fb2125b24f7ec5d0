"""Fair share on a real worker: one tenant's 50,000 ready jobs, then another tenant's
single job, which starts in the worker's first batch."""

import pytest

from queue_app import bulk_enqueue, enqueue
from queue_app.core import flow
from queue_app.models import Job, State
from tests import worker_support

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_tenants_single_job_starts_in_the_first_batch_behind_another_tenants_50000():
    flow.set_limit("noop", fair=True)
    bulk_enqueue([{"kind": "noop", "concurrency_key": "big"}] * 50_000)
    small = enqueue("noop", concurrency_key="small")
    proc = worker_support.start_worker(concurrency=1, batch=10, poll=0.02, queues=("default",))
    worker_support.wait_for(
        lambda: Job.objects.filter(pk=small.pk, state=State.COMPLETED).exists(),
        timeout=120,
        what="the small tenant's job to complete",
    )
    assert worker_support.stop(proc, within=60) == 0
    small.refresh_from_db()
    # A claim stamps started_at on the whole batch: nothing started before it, and it
    # came with at most nine of the big tenant's jobs.
    assert not Job.objects.filter(started_at__lt=small.started_at).exists()
    assert Job.objects.filter(started_at=small.started_at).count() <= 10
