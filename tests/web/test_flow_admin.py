"""Flow control in the admin and on the dashboard."""

import pytest

from queue_app.core import flow
from queue_app.models import KindLimit, Schedule
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def test_the_admin_refuses_a_schedule_with_a_bad_cron_and_saves_a_good_one(admin_client):
    base = {
        "name": "nightly",
        "kind": "echo",
        "payload": "{}",
        "queue_name": "default",
        "priority": 0,
        "timezone": "UTC",
        "enabled": "on",
        "missed_ticks": "",
    }
    bad = admin_client.post("/admin/queue_app/schedule/add/", {**base, "cron": "every night"})
    assert bad.status_code == 200 and b"not a valid cron expression" in bad.content
    assert not Schedule.objects.exists()
    good = admin_client.post("/admin/queue_app/schedule/add/", {**base, "cron": "0 3 * * *"})
    assert good.status_code == 302 and Schedule.objects.get().cron == "0 3 * * *"
    listing = admin_client.get("/admin/queue_app/schedule/")
    assert b"nightly" in listing.content


def test_the_admin_edits_a_limit_at_runtime(admin_client):
    resp = admin_client.post(
        "/admin/queue_app/kindlimit/add/", {"kind": "echo", "concurrency": 2, "rate_period": 60}
    )
    assert resp.status_code == 302 and KindLimit.objects.get().concurrency == 2
    zero = admin_client.post(
        "/admin/queue_app/kindlimit/add/", {"kind": "add", "concurrency": 0, "rate_period": 60}
    )
    assert zero.status_code == 200 and not KindLimit.objects.filter(kind="add").exists()


def test_the_admin_sets_a_per_key_limit_and_refuses_zero(admin_client):
    resp = admin_client.post(
        "/admin/queue_app/kindlimit/add/", {"kind": "sync", "per_key": 1, "rate_period": 60}
    )
    assert resp.status_code == 302 and KindLimit.objects.get().per_key == 1
    zero = admin_client.post(
        "/admin/queue_app/kindlimit/add/", {"kind": "add", "per_key": 0, "rate_period": 60}
    )
    assert zero.status_code == 200 and not KindLimit.objects.filter(kind="add").exists()
    assert b"per key" in admin_client.get("/admin/queue_app/kindlimit/").content.lower()


def test_the_dashboard_shows_what_is_paused(admin_client):
    JobFactory.create_batch(3, queue_name="mail")
    assert b"data-paused" not in admin_client.get("/dashboard/").content
    flow.pause(queue="mail", reason="smtp down")
    page = admin_client.get("/dashboard/").content.decode()
    assert 'data-paused="1"' in page and "queue mail" in page and "smtp down" in page


def test_the_admin_marks_a_kind_fair_and_refuses_fair_with_per_key(admin_client):
    resp = admin_client.post(
        "/admin/queue_app/kindlimit/add/", {"kind": "report", "fair": "on", "rate_period": 60}
    )
    assert resp.status_code == 302 and KindLimit.objects.get(kind="report").fair is True
    both = admin_client.post(
        "/admin/queue_app/kindlimit/add/", {"kind": "sync", "fair": "on", "per_key": 1, "rate_period": 60}
    )
    assert both.status_code == 200 and b"fair and per_key" in both.content
    assert not KindLimit.objects.filter(kind="sync").exists()
    heavy = admin_client.post(
        "/admin/queue_app/kindlimit/add/",
        {"kind": "mail", "fair": "on", "fair_weights": '{"gold": 0}', "rate_period": 60},
    )
    assert heavy.status_code == 200 and b"from 1 to 1000" in heavy.content
    weighted = admin_client.post(
        "/admin/queue_app/kindlimit/add/",
        {"kind": "mail", "fair": "on", "fair_weights": '{"gold": 3}', "rate_period": 60},
    )
    assert weighted.status_code == 302 and KindLimit.objects.get(kind="mail").fair_weights == {"gold": 3}
