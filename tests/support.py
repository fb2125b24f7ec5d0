"""Helpers several test modules use: a job's events as rows or as types, its last event.
(Worker processes have their own module, tests/worker_support.py.)"""

from queue_app.models import Event


def events(job):
    """The job's Event rows, oldest first."""
    return list(Event.objects.filter(job_id=job.id).order_by("id"))


def event_types(job):
    """The job's event types, oldest first."""
    return list(Event.objects.filter(job_id=job.id).order_by("id").values_list("type", flat=True))


def last_event(job):
    return Event.objects.filter(job_id=job.id).order_by("-id").first()
