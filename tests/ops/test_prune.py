"""prune: old finished jobs go with their events; live jobs and (by default) dead letters stay."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from queue_app.exceptions import InvalidJob
from queue_app.models import DeadLetter, Event, EventCount, Job, State
from queue_app.ops import maintenance, metrics
from tests.factories import DeadLetterFactory, EventFactory, JobFactory

pytestmark = pytest.mark.django_db


def finished(state, days, **kw):
    job = JobFactory(state=state, finished_at=timezone.now() - timedelta(days=days), **kw)
    EventFactory.create_batch(2, job=job)
    return job


def run(*args):
    out = StringIO()
    call_command("prune", *args, stdout=out)
    return out.getvalue()


def test_prune_deletes_old_completed_and_cancelled_jobs_with_their_events_in_batches():
    old = [finished(State.COMPLETED, 8) for _ in range(5)] + [finished(State.CANCELLED, 9)]
    recent = finished(State.COMPLETED, 1)
    pending = JobFactory(created_at=timezone.now() - timedelta(days=30))
    out = run("--older-than", "7d", "--batch-size", "2")
    assert "deleted 6 jobs" in out and "12 events" in out
    assert not Job.objects.filter(id__in=[j.id for j in old]).exists()
    assert not Event.objects.filter(job_id__in=[j.id for j in old]).exists()
    assert set(Job.objects.values_list("id", flat=True)) == {recent.id, pending.id}


def test_prune_keeps_dead_letters_unless_asked():
    letter = DeadLetterFactory(job__finished_at=timezone.now() - timedelta(days=10))
    run("--older-than", "7d")
    assert Job.objects.filter(id=letter.job_id).exists()
    out = run("--older-than", "7d", "--state", "dead_letter")
    assert "deleted 1 jobs" in out and "1 dead letters" in out
    assert not DeadLetter.objects.exists()


def test_prune_dry_run_counts_and_deletes_nothing():
    finished(State.COMPLETED, 8)
    out = run("--older-than", "7d", "--dry-run")
    assert "would delete 1 jobs" in out and "2 events" in out
    assert Job.objects.count() == 1 and Event.objects.count() == 2


def test_prune_counts_events_into_the_metrics_before_deleting_them():
    finished(State.COMPLETED, 8)
    metrics.fold_events()
    job = finished(State.COMPLETED, 8)
    EventFactory(job=job, type="completed")
    run("--older-than", "7d")
    assert EventCount.objects.get(type="completed").count == 1
    assert EventCount.objects.get(type="enqueued").count == 4


@pytest.mark.parametrize(
    "args, message",
    [
        (["--older-than", "7d", "--state", "leased"], "cannot prune leased"),
        (["--older-than", "soon"], "invalid duration"),
    ],
)
def test_prune_refuses_bad_input_and_deletes_nothing(args, message):
    finished(State.COMPLETED, 8)
    with pytest.raises(CommandError, match=message):
        run(*args)
    assert Job.objects.count() == 1


def test_prunable_never_includes_live_jobs():
    with pytest.raises(InvalidJob, match="cannot prune pending"):
        maintenance.prunable(0, [State.PENDING])
