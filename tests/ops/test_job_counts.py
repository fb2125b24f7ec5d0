"""The maintained job counts (JobCount) /metrics reads: exact after every transition,
prune and delete, with `manage.py metrics --verify` to prove it and --repair to fix it."""

import contextlib
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from queue_app import bulk_enqueue, enqueue
from queue_app.core import aborting, transitions
from queue_app.exceptions import JobNotFound
from queue_app.models import DeadLetter, Job, JobCount, State
from queue_app.ops import actions, maintenance, metrics
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

ERROR = {"type": "Boom", "message": "boom", "traceback": ""}


def assert_no_drift():
    assert metrics.verify() == []


def kept(state, kind="echo", queue="default"):
    row = JobCount.objects.filter(state=state, kind=kind, queue_name=queue).first()
    return row.count if row else 0


@pytest.fixture(autouse=True)
def counted():
    """Start from counts that have been initialised (the first fold recounts)."""
    metrics.catch_up()


def test_enqueue_and_bulk_enqueue_are_counted_per_kind_and_queue():
    enqueue("echo", {})
    bulk_enqueue([{"kind": "echo", "payload": {}, "queue_name": "mail"}] * 3)
    assert_no_drift()
    assert kept(State.PENDING) == 1
    assert kept(State.PENDING, queue="mail") == 3


def test_claim_and_complete_move_the_job_along():
    enqueue("echo", {})
    [job] = transitions.claim("w1")
    assert_no_drift()
    assert kept(State.LEASED) == 1
    transitions.complete(job.id, worker_id="w1", attempt=job.attempts)
    assert_no_drift()
    assert (kept(State.PENDING), kept(State.LEASED), kept(State.COMPLETED)) == (0, 0, 1)


def test_complete_many_moves_a_batch():
    bulk_enqueue([{"kind": "echo", "payload": {}}] * 4)
    jobs = transitions.claim("w1", limit=4)
    transitions.complete_many([(j.id, j.attempts, None, None) for j in jobs], worker_id="w1")
    assert_no_drift()
    assert kept(State.COMPLETED) == 4


def test_a_failure_with_attempts_left_is_a_retry_and_the_last_one_dead_letters():
    enqueue("echo", {}, max_attempts=2)
    [job] = transitions.claim("w1")
    transitions.fail(job.id, worker_id="w1", attempt=job.attempts, error=ERROR)
    assert_no_drift()
    assert kept(State.PENDING) == 1
    Job.objects.update(run_at=timezone.now())
    [job] = transitions.claim("w1")
    transitions.fail(job.id, worker_id="w1", attempt=job.attempts, error=ERROR)
    assert_no_drift()
    assert kept(State.DEAD_LETTER) == 1


def test_requeue_brings_a_dead_letter_back():
    job = enqueue("echo", {}, max_attempts=1)
    [job] = transitions.claim("w1")
    transitions.fail(job.id, worker_id="w1", attempt=job.attempts, error=ERROR)
    assert metrics.snapshot().dead_letters == DeadLetter.objects.unresolved().count() == 1
    transitions.requeue(job.id)
    assert_no_drift()
    assert (kept(State.DEAD_LETTER), kept(State.PENDING)) == (0, 1)
    assert metrics.snapshot().dead_letters == DeadLetter.objects.unresolved().count() == 0


def test_cancel_of_a_pending_and_abort_of_a_running_job():
    pending = enqueue("echo", {})
    transitions.cancel(pending.id)
    enqueue("echo", {})
    [job] = transitions.claim("w1")
    aborting.cancel(job.id, reason="stop")
    transitions.abort(job.id, worker_id="w1", attempt=job.attempts, how="cancelled")
    assert_no_drift()
    assert kept(State.CANCELLED) == 2


def test_a_lapsed_lease_recovered():
    enqueue("echo", {})
    transitions.claim("w1", lease_seconds=1)
    transitions.recover(now=timezone.now() + timedelta(seconds=5))
    assert_no_drift()
    assert (kept(State.LEASED), kept(State.PENDING)) == (0, 1)


def test_a_job_waiting_on_dependencies_then_unblocked():
    upstream = enqueue("echo", {})
    enqueue("echo", {}, depends_on=[upstream.id])
    assert_no_drift()
    assert kept(State.WAITING) == 1
    [job] = transitions.claim("w1")
    transitions.complete(job.id, worker_id="w1", attempt=job.attempts)
    assert_no_drift()
    assert (kept(State.WAITING), kept(State.PENDING)) == (0, 1)


def test_prune_takes_the_deleted_jobs_out_even_ones_whose_events_were_never_folded():
    done = []
    for _ in range(3):
        job = enqueue("echo", {})
        [job] = transitions.claim("w1")
        transitions.complete(job.id, worker_id="w1", attempt=job.attempts)
        done.append(job.id)
    Job.objects.filter(id__in=done).update(finished_at=timezone.now() - timedelta(days=30))
    maintenance.prune(7 * 86400, batch_size=2)
    assert not Job.objects.filter(id__in=done).exists()
    assert_no_drift()
    assert kept(State.COMPLETED) == 0


def test_admin_delete_one_job_and_a_filter_of_them():
    one = enqueue("echo", {})
    bulk_enqueue([{"kind": "echo", "payload": {}, "queue_name": "mail"}] * 3)
    actions.apply("delete", one.id)
    assert_no_drift()
    actions.apply_many("delete", Job.objects.filter(queue_name="mail"))
    assert not Job.objects.exists()
    assert_no_drift()
    assert (kept(State.PENDING), kept(State.PENDING, queue="mail")) == (0, 0)


def test_bulk_requeue_and_cancel():
    bulk_enqueue([{"kind": "echo", "payload": {}, "max_attempts": 1}] * 3)
    for job in transitions.claim("w1", limit=3):
        transitions.fail(job.id, worker_id="w1", attempt=job.attempts, error=ERROR)
    actions.apply_many("requeue", Job.objects.all())
    assert_no_drift()
    actions.apply_many("cancel", Job.objects.all())
    assert_no_drift()
    assert kept(State.CANCELLED) == 3


def test_scrape_reads_the_kept_counts_not_the_job_table():
    enqueue("echo", {})
    metrics.catch_up()
    JobCount.objects.filter(state=State.PENDING, kind="echo").update(count=41)
    snap = metrics.snapshot()
    assert snap.jobs[State.PENDING] == 41


def test_verify_reports_drift_and_repair_fixes_it():
    enqueue("echo", {})
    JobFactory(kind="echo", state=State.COMPLETED)  # written behind the event log's back
    [drift] = metrics.verify()
    assert (drift.state, drift.kind, drift.kept, drift.actual) == (State.COMPLETED, "echo", 0, 1)
    out = StringIO()
    with pytest.raises(SystemExit) as exit_:
        call_command("metrics", "--verify", stdout=out)
    assert exit_.value.code == 1
    assert "drift: completed echo default: kept 0, counted 1" in out.getvalue()
    assert "manage.py metrics --repair" in out.getvalue()
    call_command("metrics", "--repair", stdout=StringIO())
    assert_no_drift()
    out = StringIO()
    call_command("metrics", "--verify", stdout=out)
    assert "no drift" in out.getvalue()
    # Folding on after the repair stays exact.
    [job] = transitions.claim("w1")
    transitions.complete(job.id, worker_id="w1", attempt=job.attempts)
    assert_no_drift()


def _work(worker_id, rounds):
    """Claim, then complete or fail (every third job), until nothing is pending."""
    for _ in range(rounds):
        jobs = transitions.claim(worker_id, limit=5)
        if not jobs and not Job.objects.filter(state=State.PENDING).exists():
            return
        for job in jobs:
            if job.id % 3:
                transitions.complete(job.id, worker_id=worker_id, attempt=job.attempts)
            else:
                transitions.fail(job.id, worker_id=worker_id, attempt=job.attempts, error=ERROR, retry=False)


def _scrape_and_delete(rounds):
    """What an operator and Prometheus do meanwhile: scrape, delete jobs, prune."""
    for i in range(rounds):
        metrics.snapshot()
        victim = Job.objects.filter(state=State.PENDING).order_by("?").values_list("id", flat=True).first()
        if victim is not None:
            with contextlib.suppress(JobNotFound):  # pruned meanwhile
                actions.apply("delete", victim)
        if i % 5 == 0 and i < rounds // 2:
            maintenance.prune(0, states=[State.COMPLETED])


def _either(target, *args):
    target(*args)


@pytest.mark.django_db(transaction=True)
def test_counts_stay_exact_while_workers_run_and_an_operator_scrapes_deletes_and_prunes():
    from tests.conftest import run_processes

    metrics.catch_up()
    bulk_enqueue([{"kind": "echo", "payload": {"i": i}, "queue_name": f"q{i % 3}"} for i in range(300)])
    codes = run_processes(_either, [(_work, "w1", 200), (_work, "w2", 200), (_scrape_and_delete, 40)])
    assert codes == [0, 0, 0]
    assert not Job.objects.filter(state__in=[State.PENDING, State.LEASED]).exists()
    assert 0 < Job.objects.count() < 300  # some deleted or pruned, some kept
    assert_no_drift()
    assert sum(JobCount.objects.values_list("count", flat=True)) == Job.objects.count()
