"""django.tasks functions the tests enqueue (module-level, as Django requires)."""

import asyncio
import time
from pathlib import Path

import django
from django.tasks import task

from queue_app.tasks import backend as backends

# Django 6.1's @task passes our options to the backend (tested here); 6.0's refuses them,
# and the tests there use the helper the README documents for it.
options_task = task if django.VERSION >= (6, 1) else backends.task


class TaskBoom(Exception):
    pass


@task
def noop():
    return None


@task
def add(a, b):
    return a + b


@task
def echo(*args, **kwargs):
    return {"args": list(args), "kwargs": kwargs}


@task
def fail(message="boom"):
    raise TaskBoom(message)


@task
def fail_builtin():
    raise ValueError("plain value error")


@task(takes_context=True)
def attempt_number(context):
    result = context.task_result
    return {"attempt": context.attempt, "id": result.id, "workers": result.worker_ids}


@task(takes_context=True)
def fail_until_third_attempt(context):
    if context.attempt < 3:
        raise TaskBoom(f"attempt {context.attempt}")
    return context.attempt


@task
async def async_add(a, b):
    await asyncio.sleep(0)
    return a + b


@task
def returns_set():
    return {1, 2}


@options_task(max_attempts=7, timeout=12.5)
def with_extras():
    return "extras"


@task
def spin(seconds):
    """Busy-loop (never sleeps) so only a worker's timeout can stop it."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "spun"


@task
async def async_rendezvous(path, expected, patience=10):
    """Sign in at ``path``, then wait (awaiting, not blocking) until ``expected`` tasks
    have signed in; return how many had. Only tasks that run at the same time all see
    ``expected``: one that ran alone gives up after ``patience`` seconds with fewer."""
    with open(path, "a") as f:
        f.write("here\n")
    end = time.monotonic() + patience
    while (seen := len(Path(path).read_text().splitlines())) < expected and time.monotonic() < end:
        await asyncio.sleep(0.01)
    return seen


@options_task(backoff={"base": 5, "max": 60, "jitter": False})
def with_backoff():
    return None


@task
def exits(code=3):
    raise SystemExit(code)


@task
def interrupts():
    raise KeyboardInterrupt


@task
def crashes():
    import os

    os._exit(13)


@task
def after(tag="after", parent=None):
    """A follow-up: says what its parent (chaining.py's payload["parent"]) ended as."""
    return {
        "tag": tag,
        "parent": parent and {k: parent[k] for k in ("id", "kind", "state", "result")},
        "error": parent and (parent["error"] or {}).get("type"),
    }


@options_task(
    on_success=after,
    on_failure={"kind": "tests.sample_tasks.after", "payload": {"args": ["failed"], "kwargs": {}}},
)
def double_then_after(x):
    if x < 0:
        raise TaskBoom("negative")
    return 2 * x


@options_task(max_attempts=1)
def mark_once(path, n, seconds=0.0):
    """One line per execution (the chaos tests count them); one attempt only, so any
    execution lost to a fault shows as a dead letter, not as a quiet retry."""
    with open(path, "a") as f:
        f.write(f"{n}\n")
    if seconds:
        time.sleep(seconds)
    return n


@options_task(max_attempts=5)
def mark(path, n, seconds=0.0):
    """mark_once with the retries a fault may need (a kill mid-run spends an attempt)."""
    with open(path, "a") as f:
        f.write(f"{n}\n")
    if seconds:
        time.sleep(seconds)
    return n


@options_task(max_attempts=1, timeout=1)
def overruns(path, n):
    """Marks its execution, then sleeps far past its 1 s timeout (the worker kills it)."""
    with open(path, "a") as f:
        f.write(f"{n}\n")
    time.sleep(60)


@options_task(takes_context=True, max_attempts=4, backoff={"base": 1, "max": 1, "jitter": False})
def mark_flaky(context, path, n, failures=0):
    """Marks its execution, then fails its first ``failures`` attempts (each retried 1 s
    later): a retry storm when enqueued by the thousand."""
    with open(path, "a") as f:
        f.write(f"{n}\n")
    if context.attempt <= failures:
        raise TaskBoom(f"attempt {context.attempt} of {n}")
    return n


@options_task(encrypt=("card",))
def charge(card, amount=0):
    """Its card argument is stored encrypted, by keyword or by position."""
    return {"last4": card[-4:], "amount": amount}
