"""axe-core (the copy axe-playwright-python ships) in the real headless Chromium on every
dashboard page, with something on each page to check: a test fails on any serious or
critical violation, and says which rule, where."""

import os
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from queue_app.core import canvas, flow, transitions
from queue_app.core.enqueueing import enqueue
from queue_app.models import Schedule, Worker
from queue_app.worker.execution import run_one
from tests.browser.conftest import CHROMIUM
from tests.browser.test_browser import shot

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing (apt-get install chromium)"
    ),
]

BLOCKING = ("serious", "critical")


def blocking(tab):
    """The page's serious and critical axe violations, as readable lines."""
    axe = pytest.importorskip("axe_playwright_python.sync_playwright", reason="axe-playwright-python missing")
    results = axe.Axe().run(tab)
    return [
        f"{v['id']} ({v['impact']}): {v['help']} at {', '.join(t for n in v['nodes'] for t in n['target'])}"
        for v in results.response["violations"]
        if v["impact"] in BLOCKING
    ]


@pytest.fixture
def world():
    """A job in each state the pages show, a worker holding one, a pause, a schedule, a
    workflow; the ids the pages need."""
    done = enqueue("echo", {"n": 1}, queue_name="mail")
    run_one(worker_id="w-a11y/t/c0")
    dead = enqueue("boom", {"message": "smtp refused"}, max_attempts=1)
    run_one(worker_id="w-a11y/t/c0", kinds=["boom"])
    later = enqueue("echo", {"n": 2}, run_at=timezone.now() + timedelta(minutes=5))
    enqueue("echo", {"n": 3}, queue_name="held")
    flow.pause(queue="held", actor="ops", reason="maintenance")
    worker = Worker.objects.create(name="w-a11y", host="h", pid=1, queues=["mail"], kinds=["echo"])
    running = enqueue("echo", {"n": 4})
    transitions.claim("w-a11y/t/c0", limit=1)
    Schedule.objects.create(name="nightly", cron="0 3 * * *", kind="echo")
    group = canvas.group([{"kind": "echo", "payload": {}}])
    return {
        "done": done.id,
        "dead": dead.id,
        "later": later.id,
        "running": running.id,
        "worker": worker.id,
        "group": group.id,
    }


def pages(world):
    job = lambda key: reverse("queue_app_dashboard:job", args=[world[key]])  # noqa: E731
    return [
        ("overview", reverse("queue_app_dashboard:overview")),
        ("jobs", reverse("queue_app_dashboard:jobs")),
        ("jobs filtered", reverse("queue_app_dashboard:jobs") + "?status=dead_letter&q=boom"),
        ("job completed", job("done")),
        ("job dead letter", job("dead")),
        ("job scheduled", job("later")),
        ("job running", job("running")),
        ("workflow", reverse("queue_app_dashboard:workflow", args=[world["later"]])),
        ("dead letters", reverse("queue_app_dashboard:dead_letters")),
        ("running now", reverse("queue_app_dashboard:running")),
        ("workers", reverse("queue_app_dashboard:workers")),
        ("stop worker", reverse("queue_app_dashboard:worker_stop", args=[world["worker"]])),
        ("quiet worker", reverse("queue_app_dashboard:worker_quiet", args=[world["worker"]])),
        ("queues", reverse("queue_app_dashboard:queues")),
        ("queues 24h", reverse("queue_app_dashboard:queues") + "?window=24h"),
        ("queues 7d", reverse("queue_app_dashboard:queues") + "?window=7d"),
        ("schedules", reverse("queue_app_dashboard:schedules")),
        ("not found", "/dashboard/jobs/999999999/"),
    ]


def test_every_dashboard_page_has_no_serious_accessibility_violation(page, world):
    found = {}
    for name, path in pages(world):
        page.goto(path)
        if name in ("queues", "workers", "running now"):
            shot(page, name.replace(" ", "-"))
        problems = blocking(page)
        if problems:
            found[name] = problems
    assert found == {}


def test_the_bulk_confirmation_page_has_no_serious_accessibility_violation(page, world):
    page.goto(reverse("queue_app_dashboard:jobs") + "?kind=echo")
    page.select_option('#bulk select[name="action"]', "cancel")
    page.click('#bulk button[value="matching"]')
    page.wait_for_selector('[data-count="bulk"]')
    assert blocking(page) == []


def test_the_check_fails_on_a_page_with_a_serious_violation(page):
    page.goto(reverse("queue_app_dashboard:overview"))
    # Planted: a button with no accessible name (axe's button-name rule, critical).
    page.evaluate("() => document.querySelector('main').append(document.createElement('button'))")
    assert any(line.startswith("button-name (critical)") for line in blocking(page))
