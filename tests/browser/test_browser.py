"""The dashboard and admin in a real headless Chromium against a live server.

Screenshots land in $JOBQUEUE_ARTIFACTS (default .test-results/screenshots) so a
person can look at what the operator sees.
"""

import os
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from queue_app.core import flow, transitions
from queue_app.core.enqueueing import enqueue
from queue_app.models import Job, Schedule, State, Worker
from queue_app.worker.execution import run_one
from tests.browser.conftest import CHROMIUM

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing (apt-get install chromium)"
    ),
]


def shot(tab, name):
    folder = Path(
        os.environ.get(
            "JOBQUEUE_ARTIFACTS", Path(__file__).resolve().parents[2] / ".test-results" / "screenshots"
        )
    )
    folder.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(folder / f"{name}-{connection.vendor}.png"), full_page=True)


def count(tab, key):
    return tab.inner_text(f'[data-count="{key}"]').strip()


def wait_for_count(tab, key, value):
    tab.wait_for_function(
        '([key, value]) => document.querySelector(`[data-count="${key}"]`)?.textContent.trim() === value',
        arg=[key, value],
    )


def dead_job():
    job = enqueue("boom", {"message": "smtp refused"}, max_attempts=1)
    run_one(worker_id="w-browser", kinds=["boom"])
    return job


@pytest.mark.django_db(transaction=True)
def test_overview_shows_counts_and_updates_itself_when_a_job_arrives(page):
    enqueue("echo", {"n": 1})
    dead_job()
    page.reload()
    assert count(page, "pending") == "1"
    assert count(page, "dead_letter") == "1"
    page.evaluate("window.__sameDocument = true")
    enqueue("echo", {"n": 2})
    wait_for_count(page, "pending", "2")
    # Updated in place: the same document, not a reload.
    assert page.evaluate("window.__sameDocument") is True
    shot(page, "overview")


@pytest.mark.django_db(transaction=True)
def test_refresh_pauses_while_the_tab_is_hidden(page):
    page.wait_for_function("() => Number(document.getElementById('live').dataset.swaps || 0) >= 1")
    page.evaluate(
        """() => {
            Object.defineProperty(document, 'hidden', {configurable: true, get: () => true});
            document.dispatchEvent(new Event('visibilitychange'));
        }"""
    )
    enqueue("echo", {})
    page.wait_for_timeout(2500)
    assert count(page, "pending") == "0"
    assert "Paused" in page.inner_text("#live-status")
    page.evaluate(
        """() => {
            Object.defineProperty(document, 'hidden', {configurable: true, get: () => false});
            document.dispatchEvent(new Event('visibilitychange'));
        }"""
    )
    wait_for_count(page, "pending", "1")


@pytest.mark.django_db(transaction=True)
def test_job_page_shows_the_timeline_and_its_requeue_button_works(page):
    job = dead_job()
    page.goto(f"/dashboard/jobs/{job.id}/")
    timeline = page.inner_text(".timeline")
    assert "Enqueued" in timeline and "Attempt 1 claimed" in timeline and "Dead-lettered" in timeline
    page.click("text=Traceback")
    assert "smtp refused" in page.inner_text(".timeline")
    shot(page, "job")
    page.click("button:has-text('Requeue')")
    page.wait_for_selector(".messages li.success")
    assert "Requeued" in page.inner_text(".timeline")
    assert Job.objects.get(id=job.id).state == State.PENDING


@pytest.mark.django_db(transaction=True)
def test_requeue_from_the_admin_shows_on_the_dashboard_without_a_reload(page):
    job = dead_job()
    page.reload()
    assert count(page, "dead_letter") == "1"
    admin = page.context.new_page()
    admin.goto("/admin/queue_app/job/?status=dead_letter")
    admin.check(f'input[name="_selected_action"][value="{job.id}"]')
    admin.select_option('select[name="action"]', "requeue")
    admin.click('button[name="index"]')
    admin.wait_for_selector(".messagelist")
    assert "Requeue: 1 job done." in admin.inner_text(".messagelist")
    page.bring_to_front()
    wait_for_count(page, "dead_letter", "0")
    assert count(page, "pending") == "1"


@pytest.mark.django_db(transaction=True)
def test_bulk_cancel_by_filter_in_the_admin(page, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "OPS_BATCH_SIZE": 3}
    for n in range(7):
        enqueue("bulk", {"n": n})
    keep = enqueue("echo", {})
    page.goto("/admin/queue_app/job/?kind=bulk")
    page.select_option('select[name="action"]', "cancel_matching")
    page.click('button[name="index"]')
    page.wait_for_selector('input[name="confirm"]', state="attached")
    assert "that can take it: 7 jobs" in page.inner_text("#content")
    assert Job.objects.filter(state=State.CANCELLED).count() == 0
    page.click('input[type="submit"]')
    page.wait_for_selector(".messagelist")
    assert "Cancel: 7 jobs done." in page.inner_text(".messagelist")
    shot(page, "admin-bulk-cancel")
    assert Job.objects.filter(kind="bulk", state=State.CANCELLED).count() == 7
    assert Job.objects.get(id=keep.id).state == State.PENDING


@pytest.mark.django_db(transaction=True)
def test_the_pause_refresh_button_stops_updates_until_resumed(page):
    page.wait_for_function("() => Number(document.getElementById('live').dataset.swaps || 0) >= 1")
    page.click("#live-toggle")
    assert page.get_attribute("#live-toggle", "aria-pressed") == "true"
    enqueue("echo", {})
    page.wait_for_timeout(2500)
    assert count(page, "pending") == "0"
    assert "Paused" in page.inner_text("#live-status")
    page.click("#live-toggle")
    wait_for_count(page, "pending", "1")
    assert "UTC" in page.inner_text("#live-status")


@pytest.mark.django_db(transaction=True)
def test_a_refresh_in_flight_when_paused_changes_nothing(page):
    """Pause while a refresh is on its way: its answer, arriving after, must neither
    show the new counts nor say "Updated" (a CI run caught that race)."""
    page.wait_for_function("() => Number(document.getElementById('live').dataset.swaps || 0) >= 1")
    held = []

    def hold(route):
        held.append(route)

    page.route(re.compile(r"[?&]partial=1"), hold)
    enqueue("echo", {})
    page.wait_for_timeout(50)
    deadline = timezone.now() + timedelta(seconds=10)
    while not held and timezone.now() < deadline:
        page.wait_for_timeout(50)  # Playwright hands the held request over while it waits
    assert held, "no refresh was sent"
    page.click("#live-toggle")
    held[0].continue_()
    page.wait_for_timeout(1500)
    page.unroute(re.compile(r"[?&]partial=1"))
    assert count(page, "pending") == "0"
    assert "Paused" in page.inner_text("#live-status")
    page.click("#live-toggle")
    wait_for_count(page, "pending", "1")


def mark_focused(tab):
    """Tag the focused element (a property on the node itself, which a swap would lose)."""
    tab.evaluate("() => { document.activeElement.__marked = true; }")


def still_marked_and_focused(tab):
    return tab.evaluate(
        "() => document.activeElement.__marked === true && document.getElementById('live').contains(document.activeElement)"
    )


def swaps(tab):
    return int(tab.evaluate("() => Number(document.getElementById('live').dataset.swaps || 0)"))


@pytest.mark.django_db(transaction=True)
def test_a_refresh_that_adds_a_row_keeps_focus_on_the_same_link(page):
    a = enqueue("echo", {"n": 1})
    page.goto("/dashboard/jobs/")
    page.wait_for_function("() => Number(document.getElementById('live').dataset.swaps || 0) >= 1")
    page.focus(f"#live a[href$='/dashboard/jobs/{a.id}/']")
    mark_focused(page)
    b = enqueue("echo", {"n": 2})
    # The refresh happens with focus in the list (no hold) and puts the new row above it.
    page.wait_for_selector(f"#job-row-{b.id}")
    assert still_marked_and_focused(page)
    assert page.evaluate("() => document.activeElement.getAttribute('href')").endswith(f"/jobs/{a.id}/")
    assert "Held" not in page.inner_text("#live-status")
    # Keyboard navigation goes on from there: Tab reaches the next focusable element in the row order.
    page.keyboard.press("Shift+Tab")
    assert page.evaluate("() => document.activeElement.closest('tr').id") == f"job-row-{a.id}"


@pytest.mark.django_db(transaction=True)
def test_a_refresh_that_changes_other_rows_keeps_a_focused_checkbox_focused_and_picked(page):
    a = enqueue("echo", {"n": 1})
    b = enqueue("echo", {"n": 2})
    page.goto("/dashboard/jobs/")
    box = f'input[name="ids"][value="{a.id}"]'
    page.focus(box)
    page.keyboard.press("Space")
    assert page.is_checked(box)
    mark_focused(page)
    transitions.cancel(b.id, actor="test")  # another row changes: its status cell
    page.wait_for_selector(f'#job-row-{b.id} [data-status="cancelled"]')
    assert still_marked_and_focused(page)
    assert page.is_checked(box)
    # Space again unpicks the same box: it is the element the user is on.
    page.keyboard.press("Space")
    assert not page.is_checked(box)


@pytest.mark.django_db(transaction=True)
def test_a_refresh_keeps_the_scroll_of_a_table_inside_its_card(page):
    for n in range(3):
        enqueue("a-rather-long-kind-name.that_spills", {"n": n}, queue_name="a-long-queue-name")
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto("/dashboard/queues/")
    scroller = "#live table.grid"  # on a phone the table scrolls inside its card
    page.eval_on_selector(scroller, "(el) => { el.scrollLeft = 150; el.__marked = true; }")
    before = page.eval_on_selector(scroller, "(el) => el.scrollLeft")
    assert before > 0
    n = swaps(page)
    enqueue("a-rather-long-kind-name.that_spills", {"n": 9}, queue_name="a-long-queue-name")
    wait_for_count(page, "ready", "4")
    assert swaps(page) > n
    assert page.eval_on_selector(scroller, "(el) => [el.__marked, el.scrollLeft]") == [True, before]


@pytest.mark.django_db(transaction=True)
def test_a_traceback_opened_on_the_job_page_stays_open_across_a_refresh(page):
    job = dead_job()
    page.goto(f"/dashboard/jobs/{job.id}/")
    page.click("summary:has-text('Traceback')")
    opened = "#live details:has(pre.tb)"
    assert page.eval_on_selector(opened, "(el) => el.open")
    transitions.requeue(job.id, actor="test")
    page.wait_for_selector('#live [data-status="ready"]')
    assert "Requeued" in page.inner_text(".timeline")
    assert page.eval_on_selector(opened, "(el) => el.open")


@pytest.mark.django_db(transaction=True)
def test_the_pages_work_without_javascript(browser, live_server, django_user_model):
    django_user_model.objects.create_superuser("boss", "boss@example.com", "pw")
    job = enqueue("echo", {"n": 1})
    context = browser.new_context(base_url=live_server.url, java_script_enabled=False)
    tab = context.new_page()
    try:
        tab.goto("/dashboard/jobs/")
        tab.fill("#id_username", "boss")
        tab.fill("#id_password", "pw")
        tab.click("input[type=submit]")
        tab.wait_for_url(re.compile(r"/dashboard/jobs/$"))
        assert tab.locator(f"#job-row-{job.id}").count() == 1
        assert "reload the page if scripts are off" in tab.inner_text("#live-status")
        # Without the script nothing refreshes in place: a reload does.
        enqueue("echo", {"n": 2})
        tab.wait_for_timeout(1500)
        assert tab.locator("#live tbody tr").count() == 1
        tab.reload()
        assert tab.locator("#live tbody tr").count() == 2
        tab.click(f"#job-row-{job.id} a")
        tab.wait_for_url(re.compile(rf"/dashboard/jobs/{job.id}/$"))
        assert tab.get_attribute("#live [data-status]", "data-status") == "ready"
        tab.click("button:has-text('Cancel')")
        tab.wait_for_selector(".messages li.success")
        assert Job.objects.get(id=job.id).state == State.CANCELLED
    finally:
        context.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "path", ["/dashboard/", "/dashboard/jobs/", "/dashboard/workers/", "/dashboard/queues/"]
)
def test_on_a_phone_the_page_is_no_wider_than_the_screen_and_the_nav_reaches_admin(page, path):
    for n in range(3):
        enqueue("a-rather-long-kind-name.that_spills", {"n": n}, queue_name="a-long-queue-name")
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(path)
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
    admin = page.locator(".top nav a", has_text="Admin")
    admin.scroll_into_view_if_needed()
    box = admin.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390


@pytest.mark.django_db(transaction=True)
def test_pages_load_no_missing_files_and_offer_a_skip_link(page):
    missing = []
    page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
    page.goto("/dashboard/queues/")
    page.wait_for_load_state("networkidle")
    assert missing == []
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.textContent") == "Skip to content"


@pytest.mark.django_db(transaction=True)
def test_the_job_page_updates_itself_when_the_job_runs(page):
    job = enqueue("echo", {"n": 1})
    page.goto(f"/dashboard/jobs/{job.id}/")
    assert page.get_attribute("#live [data-status]", "data-status") == "ready"
    page.evaluate("window.__sameDocument = true")
    run_one(worker_id="w-browser")
    page.wait_for_selector('#live [data-status="completed"]')
    assert page.evaluate("window.__sameDocument") is True
    assert "Attempt 1" in page.inner_text(".timeline")


@pytest.mark.django_db(transaction=True)
def test_a_paused_queues_job_is_not_late_and_its_page_says_why(page):
    job = enqueue("echo", {}, queue_name="mail", run_at=timezone.now() - timedelta(hours=1))
    flow.pause(queue="mail", actor="ops", reason="maintenance")
    page.goto(f"/dashboard/jobs/{job.id}/")
    why = page.inner_text('[data-why="queue_paused"]')
    assert "queue 'mail' is paused by ops" in why and "(maintenance)" in why
    assert page.locator("[data-late]").count() == 0
    page.goto("/dashboard/")
    assert count(page, "late") == "0" and count(page, "paused") == "1"


@pytest.mark.django_db(transaction=True)
def test_bulk_cancel_by_filter_in_the_dashboard_restates_the_count_and_needs_confirming(page):
    for n in range(4):
        enqueue("bulk", {"n": n})
    keep = enqueue("echo", {})
    page.goto("/dashboard/jobs/?kind=bulk")
    page.select_option('#bulk select[name="action"]', "cancel")
    page.click('#bulk button[value="matching"]')
    page.wait_for_selector('[data-count="bulk"]')
    assert "4 jobs can take it now" in page.inner_text('[data-count="bulk"]')
    assert Job.objects.filter(state=State.CANCELLED).count() == 0
    page.click("button:has-text('Cancel 4 jobs')")
    page.wait_for_selector(".messages li.success")
    assert "Cancel: 4 jobs done." in page.inner_text(".messages")
    assert Job.objects.filter(kind="bulk", state=State.CANCELLED).count() == 4
    assert Job.objects.get(id=keep.id).state == State.PENDING


@pytest.mark.django_db(transaction=True)
def test_rows_picked_for_a_bulk_action_stay_picked_across_a_refresh(page):
    a = enqueue("echo", {"n": 1})
    page.goto("/dashboard/jobs/")
    page.check(f'input[name="ids"][value="{a.id}"]')
    page.focus("#live-toggle")  # focus out of the list: the refresh may swap it
    swaps = int(page.evaluate("() => Number(document.getElementById('live').dataset.swaps || 0)"))
    enqueue("echo", {"n": 2})
    page.wait_for_function(
        "(n) => Number(document.getElementById('live').dataset.swaps || 0) > n && document.querySelectorAll('#live tbody tr').length >= 2",
        arg=swaps,
    )
    assert page.is_checked(f'input[name="ids"][value="{a.id}"]')


@pytest.mark.django_db(transaction=True)
def test_refresh_holds_while_the_pointer_moves_over_the_rows_and_resumes_when_it_rests(page):
    enqueue("echo", {"n": 1})
    page.goto("/dashboard/jobs/")
    page.wait_for_function("() => Number(document.getElementById('live').dataset.swaps || 0) >= 1")
    row = page.locator("#live tbody tr").first.bounding_box()
    enqueue("echo", {"n": 2})
    for i in range(30):  # 3 s of small moves over the first row: longer than two refreshes
        page.mouse.move(row["x"] + 20 + i % 5, row["y"] + row["height"] / 2)
        page.wait_for_timeout(100)
    assert page.locator("#live tbody tr").count() == 1
    assert "Held while the pointer moves over the rows" in page.inner_text("#live-status")
    # Resting: the next refresh shows the new job.
    page.wait_for_function("() => document.querySelectorAll('#live tbody tr').length >= 2")


@pytest.mark.django_db(transaction=True)
def test_the_footers_clock_is_the_sites_time_zone(page, settings):
    settings.TIME_ZONE = "Asia/Kolkata"
    page.reload()
    page.wait_for_function("() => Number(document.getElementById('live').dataset.swaps || 0) >= 1")
    status = page.inner_text("#live-status")
    assert re.search(r"Updated \d\d:\d\d:\d\d Asia/Kolkata", status), status
    assert "times in Asia/Kolkata" in page.inner_text("footer")


@pytest.mark.django_db(transaction=True)
def test_the_job_page_says_why_for_each_reason_set_up_for_real(page):
    def why(job):
        page.goto(f"/dashboard/jobs/{job.id}/")
        cell = page.locator("[data-why]")
        return cell.get_attribute("data-why"), cell.inner_text()

    alone = enqueue("echo", {}, queue_name="solo")
    assert why(alone)[0] == "no_worker"
    Worker.objects.create(name="w-mail", host="h", pid=1, queues=["mail"])
    code, text = why(alone)
    assert code == "no_worker_serves" and "runworker --queue solo" in text
    Worker.objects.create(name="w-all", host="h", pid=2, queues=["*"])

    later = enqueue("echo", {}, run_at=timezone.now() + timedelta(minutes=4))
    code, text = why(later)
    assert code == "scheduled" and re.search(r"in [34]m\d\ds, at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", text), (
        text
    )

    flaky = enqueue("boom", {"message": "smtp refused"}, max_attempts=3, queue_name="retry")
    run_one(worker_id="w-all/t/c0", queues=["retry"])
    code, text = why(flaky)
    assert code == "retrying" and "backing off after attempt 1 (retry in" in text

    flow.pause(kind="report", actor="ops", reason="quota")
    report = enqueue("report", {})
    code, text = why(report)
    assert code == "kind_paused" and "by ops" in text and "(quota)" in text

    flow.set_limit("export", concurrency=1)
    enqueue("export", {"n": 1}, queue_name="exports")
    transitions.claim("w-all/t/c0", queues=["exports"], kinds=["export"])
    held = enqueue("export", {"n": 2}, queue_name="exports")
    code, text = why(held)
    assert code == "concurrency_limit" and "(1 of 1 leased)" in text

    flow.set_limit("sync", rate_limit=1, rate_period=600)
    enqueue("sync", {"n": 1}, queue_name="syncs")
    assert transitions.claim("w-all/t/c0", queues=["syncs"])
    spent = enqueue("sync", {"n": 2}, queue_name="syncs")
    code, text = why(spent)
    assert code == "rate_limit" and "(1 of 1 starts per 10m" in text and "UTC (in " in text

    first = enqueue("echo", {"n": 1}, queue_name="busy", priority=5)
    second = enqueue("echo", {"n": 2}, queue_name="busy")
    code, text = why(second)
    assert code == "busy" and "1 ready job(s) of queue 'busy' lease before it" in text
    assert why(first)[0] == "eligible"


@pytest.mark.django_db(transaction=True)
def test_the_queues_page_pauses_a_queue_with_its_reason_and_switches_windows(page):
    enqueue("echo", {}, queue_name="mail")
    run_one(worker_id="w-browser")
    enqueue("echo", {"n": 2}, queue_name="mail")
    page.goto("/dashboard/queues/")
    row = 'tr[data-queue="mail"][data-kind="echo"]'
    assert page.inner_text(f'{row} [data-count="ready"]') == "1"
    assert page.inner_text(f'{row} [data-count="completed"]') != "0"
    page.click(f"{row} button:has-text('Pause queue')")
    page.wait_for_selector(".messages li.success")
    assert page.inner_text(f'{row} [data-count="paused"]') == "1"
    assert page.inner_text(f'{row} [data-count="ready"]') == "0"
    assert "by admin:boss" in page.inner_text(f'{row} [data-pause-why="queue"]')
    page.click('nav.windows a[data-window="7d"]')
    page.wait_for_url(re.compile(r"window=7d"))
    assert page.inner_text('nav.windows [aria-current="true"]') == "7d"
    assert "1 completed" in page.get_attribute(f"{row} svg.spark", "aria-label")
    page.click(f"{row} button:has-text('Resume queue')")
    page.wait_for_selector(".messages li.success")
    assert page.inner_text(f'{row} [data-count="ready"]') == "1"


@pytest.mark.django_db(transaction=True)
def test_running_now_lists_a_workers_job_and_quiet_asks_before_it_acts(page):
    worker = Worker.objects.create(name="w-run", host="h", pid=1, queues=["*"], kinds=["export"])
    enqueue("export", {})
    (job,) = transitions.claim("w-run/t/c0", kinds=["export"])
    Worker.objects.filter(id=worker.id).update(running_threads={str(job.id): 0}, jobs_in_hand=1)
    page.goto("/dashboard/workers/")
    page.click('[data-worker="w-run"] [data-worker-jobs]')
    page.wait_for_url(re.compile(r"/dashboard/running/\?worker=w-run"))
    running = f'[data-running="{job.id}"]'
    assert "w-run" in page.inner_text(running) and page.inner_text(f"{running} [data-thread]") == "0"
    page.goto("/dashboard/workers/")
    page.click('[data-worker="w-run"] a:has-text("Quiet")')
    page.wait_for_selector("button:has-text('Quiet w-run')")
    assert Worker.objects.get(id=worker.id).quiet_requested_at is None  # asked, not done
    page.click("button:has-text('Quiet w-run')")
    page.wait_for_selector(".messages li.success")
    assert Worker.objects.get(id=worker.id).quiet_requested_at is not None
    assert "quiet requested" in page.inner_text('[data-worker="w-run"]')


@pytest.mark.django_db(transaction=True)
def test_the_jobs_list_finds_an_error_text_and_a_schedule_runs_now(page):
    enqueue("boom", {"message": "ConnectionError: smtp down"}, max_attempts=1)
    run_one(worker_id="w-browser", kinds=["boom"])
    enqueue("echo", {"n": 1})
    page.goto("/dashboard/jobs/")
    page.fill('input[name="text"]', "ConnectionError")
    page.click("form.filters button:has-text('Filter')")
    page.wait_for_url(re.compile(r"text=ConnectionError"))
    assert page.locator("#live tbody tr").count() == 1
    assert "boom" in page.inner_text("#live tbody tr")
    Schedule.objects.create(name="nightly", cron="0 3 * * *", kind="echo")
    page.goto("/dashboard/schedules/")
    page.click('[data-schedule="nightly"] button:has-text("Run now")')
    page.wait_for_url(re.compile(r"/dashboard/jobs/\d+/$"))
    assert "Schedule nightly" in page.inner_text(".messages")
    page.goto("/dashboard/schedules/")
    page.click('[data-schedule="nightly"] a[href*="schedule=nightly"]')
    assert page.locator("#live tbody tr").count() == 1
