"""Fixtures for the browser tests: one headless Chromium per module (Debian's, at
/usr/bin/chromium: Playwright's own download does not work here) and a logged-in tab."""

import os
import re

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
TIMEOUT_MS = 15_000


@pytest.fixture(autouse=True)
def _fast(settings):
    # Refresh every second so the tests watch it happen without waiting five.
    settings.JOBQUEUE = {**getattr(settings, "JOBQUEUE", {}), "DASHBOARD_REFRESH_SECONDS": 1}


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    # Playwright's sync API keeps an event loop running in this thread; Django then
    # refuses ORM calls here unless told that this (test-only) mix is intended.
    before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_api.sync_playwright() as p:
            chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            yield chromium
            chromium.close()
    finally:
        if before is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = before


@pytest.fixture
def page(browser, live_server, django_user_model):
    django_user_model.objects.create_superuser("boss", "boss@example.com", "pw")
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    tab = context.new_page()
    tab.goto("/dashboard/")
    # Not logged in: the admin's login form, then back to the dashboard.
    tab.fill("#id_username", "boss")
    tab.fill("#id_password", "pw")
    tab.click("input[type=submit]")
    tab.wait_for_url(re.compile(r"/dashboard/$"))
    yield tab
    context.close()
