"""queue_app.tasks.backend.task: @task with our job options on Django 6.0 (no passthrough) as
on 6.1. The suite runs on the pinned Django; this file's tests hold on either."""

import pytest
from django.tasks import Task

from queue_app.models import Job
from queue_app.tasks import backend as backends
from queue_app.tasks.backend import QueueTask


def report(day):
    return day


@pytest.mark.django_db
def test_backends_task_gives_djangos_arguments_to_django_and_ours_to_the_job():
    made = backends.task(priority=3, queue_name="default", max_attempts=4, timeout=2, backoff=3)(report)
    assert isinstance(made, QueueTask) and made.func is report
    assert (made.priority, made.max_attempts, made.timeout, made.backoff_base) == (3, 4, 2, 3)

    job = Job.objects.get(id=int(made.enqueue("mon").id))
    assert (job.kind, job.priority, job.max_attempts, job.timeout, job.backoff_base) == (
        "tests.tasks.test_backends_compat.report",
        3,
        4,
        2.0,
        3.0,
    )
    assert job.payload == {"args": ["mon"], "kwargs": {}}


def test_backends_task_without_options_is_djangos_own():
    bare, called = backends.task(report), backends.task()(report)
    for made in (bare, called):
        assert isinstance(made, Task) and made.func is report
        assert made.max_attempts is None


def test_backends_task_refuses_an_option_nobody_knows():
    with pytest.raises(TypeError):
        backends.task(retries=4)(report)
