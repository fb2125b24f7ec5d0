"""Uniqueness by state with a real worker running a long job: repeated enqueues while it
runs queue exactly one follow-up, which runs after it."""

import pytest

from queue_app import enqueue
from queue_app.models import Job, State
from tests.worker_support import start_worker, stop, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_enqueues_while_a_job_runs_queue_exactly_one_follow_up(tmp_path):
    marks = tmp_path / "marks"
    options = {"unique_key": "report:1", "unique_while": "pending"}
    # The first job runs until the test lets it end (a second line in the file), however
    # long the 20 enqueues take on a loaded machine.
    first = enqueue("mark", {"path": str(marks), "seconds": 60, "until_lines": 2}, **options)
    worker = start_worker(concurrency=1, threads=1, batch=1)
    wait_for(lambda: marks.exists(), timeout=30, what="the first job to start")
    assert Job.objects.get(id=first.id).state == State.LEASED
    ids = [enqueue("mark", {"path": str(marks), "seconds": 0}, **options).id for _ in range(20)]
    assert Job.objects.get(id=first.id).state == State.LEASED  # all came while it ran
    follow_up = Job.objects.exclude(id=first.id).get()
    assert set(ids) == {follow_up.id} and follow_up.id != first.id
    with open(marks, "a") as f:
        f.write("released\n")
    wait_for(
        lambda: Job.objects.filter(state=State.COMPLETED).count() == 2, timeout=60, what="both to complete"
    )
    assert stop(worker) == 0
    assert Job.objects.count() == 2 and len(marks.read_text().splitlines()) == 3  # two runs, one release
