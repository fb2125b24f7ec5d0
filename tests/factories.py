from datetime import timedelta

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.utils import timezone

from queue_app.models import DeadLetter, Event, Job, State, Worker


class JobFactory(factory.django.DjangoModelFactory):
    """A job row written directly (bypassing enqueue) so tests can set any field."""

    class Meta:
        model = Job

    kind = "echo"
    queue_name = "default"
    payload = factory.Sequence(lambda n: {"n": n})
    priority = 0
    state = State.PENDING
    max_attempts = 3
    created_at = factory.LazyFunction(timezone.now)
    run_at = factory.LazyAttribute(lambda o: o.created_at)

    class Params:
        leased = factory.Trait(
            state=State.LEASED,
            attempts=1,
            lease_owner="worker-1",
            lease_expires_at=factory.LazyFunction(lambda: timezone.now() + timedelta(seconds=30)),
            # Running, as its supervisor's renewal saw it (started_attempt=None: claimed
            # and never started).
            started_attempt=factory.LazyAttribute(lambda o: o.attempts),
        )
        expired = factory.Trait(
            state=State.LEASED,
            attempts=1,
            lease_owner="worker-1",
            lease_expires_at=factory.LazyFunction(lambda: timezone.now() - timedelta(seconds=1)),
            started_attempt=factory.LazyAttribute(lambda o: o.attempts),
        )
        dead = factory.Trait(
            state=State.DEAD_LETTER,
            attempts=3,
            finished_at=factory.LazyFunction(timezone.now),
            last_error={"type": "Boom", "message": "boom", "traceback": ""},
        )
        scheduled = factory.Trait(run_at=factory.LazyFunction(lambda: timezone.now() + timedelta(hours=1)))


class EventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Event

    job = factory.SubFactory(JobFactory)
    type = "enqueued"


class DeadLetterFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = DeadLetter

    job = factory.SubFactory(JobFactory, dead=True)
    kind = factory.SelfAttribute("job.kind")
    payload = factory.SelfAttribute("job.payload")
    attempts = factory.SelfAttribute("job.attempts")
    error = {"type": "Boom", "message": "boom", "traceback": ""}


def make_staff(username, *perms):
    """A staff user holding ``perms`` ("app_label.codename" each), password "pw"."""
    user = get_user_model().objects.create_user(username, password="pw", is_staff=True)
    for perm in perms:
        app, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    return user


class WorkerFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Worker

    name = factory.Sequence(lambda n: f"host:{100 + n}:abc{n}")
    host = "host"
    pid = factory.Sequence(lambda n: 100 + n)
    queues = ["*"]
