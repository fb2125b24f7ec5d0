"""Dedupe windows (unique_for): within the window the key returns the existing job,
after it a new job takes the key; race-free through the unique index."""

import json
import multiprocessing
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from queue_app import enqueue
from queue_app.exceptions import InvalidJob
from queue_app.models import Event, Job
from queue_app.web import auth as api_auth
from tests.conftest import run_processes


def age(job, seconds):
    Job.objects.filter(id=job.id).update(created_at=timezone.now() - timedelta(seconds=seconds))


@pytest.mark.django_db
def test_a_duplicate_within_the_window_returns_the_existing_job():
    first = enqueue("echo", {"n": 1}, idempotency_key="k", unique_for=60)
    again = enqueue("echo", {"n": 2}, idempotency_key="k", unique_for=60)
    assert again.id == first.id and again.was_created is False
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_after_the_window_a_new_job_takes_the_key_and_the_event_says_so():
    first = enqueue("echo", {"n": 1}, idempotency_key="k", unique_for=60)
    age(first, 61)
    second = enqueue("echo", {"n": 2}, idempotency_key="k", unique_for=60)
    assert second.was_created and second.id != first.id
    first.refresh_from_db()
    assert first.idempotency_key is None and first.state == "pending"
    event = Event.objects.get(job_id=second.id, type="enqueued")
    assert event.metadata["dedupe_released"] == {"job": first.id, "key": "k"}


@pytest.mark.django_db
def test_without_unique_for_a_key_dedupes_for_as_long_as_the_job_exists():
    first = enqueue("echo", idempotency_key="k")
    age(first, 10**6)
    assert enqueue("echo", idempotency_key="k").id == first.id


@pytest.mark.django_db
@pytest.mark.parametrize(
    "options",
    [
        {"unique_for": 60},
        {"unique_for": 0, "idempotency_key": "k"},
        {"unique_for": "x", "idempotency_key": "k"},
    ],
)
def test_bad_unique_for_is_refused_and_nothing_is_written(options):
    with pytest.raises(InvalidJob) as exc:
        enqueue("echo", **options)
    assert exc.value.field == "unique_for"
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_the_api_answers_409_naming_the_job_in_strict_mode():
    client = Client(headers={"X-API-Key": api_auth.create("script")[1]})
    body = {"kind": "echo", "idempotency_key": "order-7", "unique_for": 300, "strict": True}
    first = client.post("/api/jobs", json.dumps(body), content_type="application/json")
    assert first.status_code == 201
    dup = client.post("/api/jobs", json.dumps(body), content_type="application/json")
    assert dup.status_code == 409
    assert dup.json()["job_id"] == first.json()["id"] and dup.json()["field"] == "idempotency_key"
    lenient = client.post("/api/jobs", json.dumps({**body, "strict": False}), content_type="application/json")
    assert lenient.status_code == 200


PROCESSES = 8


def _enqueue_at_once(barrier, out):
    barrier.wait(timeout=60)
    out.put(enqueue("echo", idempotency_key="nightly", unique_for=60).id)


@pytest.mark.django_db(transaction=True)
def test_eight_processes_enqueueing_one_key_after_its_window_make_exactly_one_new_job():
    old = enqueue("echo", idempotency_key="nightly", unique_for=60)
    age(old, 120)
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(PROCESSES), ctx.SimpleQueue()
    assert run_processes(_enqueue_at_once, [(barrier, out)] * PROCESSES) == [0] * PROCESSES
    ids = {out.get() for _ in range(PROCESSES)}
    assert Job.objects.count() == 2
    new = Job.objects.get(idempotency_key="nightly")
    assert ids == {new.id} and new.id != old.id
