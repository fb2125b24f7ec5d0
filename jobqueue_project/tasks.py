"""Example django.tasks functions; with TASKS pointing at our backend they run on runworker.

    from jobqueue_project.tasks import send_welcome_email
    result = send_welcome_email.enqueue("ada@example.com")
    result.id                      # the job's id: `manage.py history <id>`
    result.refresh(); result.status, result.return_value

Per call: ``send_welcome_email.using(priority=50, run_after=later, idempotency_key="welcome:42")``.
"""

import asyncio
import logging
import time

import django
from django.tasks import task

from queue_app import handler
from queue_app.tasks import backend as backends

# Our extras ride on Django 6.1's @task; on 6.0 backends.task takes them instead.
options_task = task if django.VERSION >= (6, 1) else backends.task

log = logging.getLogger(__name__)


@task
def add(a, b):
    """A plain task: its return value is stored as the job's result."""
    return a + b


@task
def welcome_sent(parent=None):
    """A follow-up: enqueued when send_welcome_email completes; ``parent`` is its outcome."""
    return {"after": parent["id"], "sent_to": parent["result"]["sent_to"]} if parent else None


@options_task(priority=10, max_attempts=5, timeout=60, on_success=welcome_sent)
def send_welcome_email(address):
    """Our extras (max_attempts, timeout, on_success...) ride on @task as keyword arguments."""
    log.info("would send a welcome email to %s", address)
    return {"sent_to": address}


@task(takes_context=True)
def flaky_report(context, day):
    """Fails on its first attempt; the retry (context.attempt == 2) succeeds."""
    if context.attempt < 2:
        raise RuntimeError(f"report for {day} not ready yet (attempt {context.attempt})")
    return {"day": day, "attempt": context.attempt, "job": context.task_result.id}


@task
async def fetch_status(url):
    """``async def`` tasks run on an event loop in the worker (one per worker thread)."""
    await asyncio.sleep(0.01)
    return {"url": url, "status": "ok"}


@task
def stamp():
    """Return the time it started: benchmarks/task_vs_native.py's no-op (@task path)."""
    return time.time()


@handler("bench.stamp")
def native_stamp(payload):
    """The same as a native handler, for the benchmark's native path."""
    return time.time()
