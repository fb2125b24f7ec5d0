"""Helpers several test modules use: a job's events as rows or as types, its last event,
a lease run out. (Worker processes have their own module, tests/worker_support.py.)"""

import contextlib
from datetime import timedelta

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from queue_app.models import Event, Job


def events(job):
    """The job's Event rows, oldest first."""
    return list(Event.objects.filter(job_id=job.id).order_by("id"))


def event_types(job):
    """The job's event types, oldest first."""
    return list(Event.objects.filter(job_id=job.id).order_by("id").values_list("type", flat=True))


def last_event(job):
    return Event.objects.filter(job_id=job.id).order_by("-id").first()


def lapse(job, *, started=True):
    """Let ``job``'s lease run out, as if its worker had stalled or died. With ``started``
    a lease renewal had seen its attempt running first (Job.started_attempt), so
    recovery spends the attempt; without, it was claimed and never started, and recovery
    gives the attempt back."""
    changes = {"started_attempt": F("attempts")} if started else {}
    Job.objects.filter(id=job.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1), **changes)


def drain(limit=500):
    """Run ready jobs in this process (execution.run_one) until none is left; return their
    ids in run order. Fails if ``limit`` runs leave the queue not empty."""
    from queue_app.worker.execution import run_one

    ran = []
    for _ in range(limit):
        job = run_one()
        if job is None:
            return ran
        ran.append(job.id)
    raise AssertionError("the queue did not drain")


@contextlib.contextmanager
def shared_rows(django_db_blocker):
    """Rows written inside this block are seen by every test run inside it, and rolled
    back at its end: Django's TestCase.setUpTestData for pytest fixtures (module- or
    class-scoped). Each test's own transaction nests in this one as a savepoint, so what
    a test writes is undone after it and the next test sees the rows as they were made.
    Only for tests without transaction=True (those flush the database)."""
    with django_db_blocker.unblock(), transaction.atomic():
        yield
        transaction.set_rollback(True)
