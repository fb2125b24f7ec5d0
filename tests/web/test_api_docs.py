"""/api/docs: Swagger UI from this server's static files, working with no internet."""

import os
from urllib.parse import urlsplit

import pytest
from django.contrib.staticfiles import finders

CHROMIUM = "/usr/bin/chromium"
ASSETS = ("ninja/swagger-ui.css", "ninja/swagger-ui-bundle.js", "ninja/swagger-ui-init.js")


def test_the_docs_page_names_only_local_assets(admin_client):
    page = admin_client.get("/api/docs").content.decode()
    for asset in ASSETS:
        assert f'"/static/{asset}"' in page, asset
        assert finders.find(asset), f"{asset} is not among the static files"
    assert "://" not in page, "the docs page refers to another host"


@pytest.mark.browser
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing (apt-get install chromium)")
def test_swagger_ui_renders_every_operation_with_every_other_host_blocked(live_server, admin_user, client):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    client.force_login(admin_user)
    session = client.cookies["sessionid"].value
    host = urlsplit(live_server.url).netloc
    outside = []

    def only_here(route):
        if urlsplit(route.request.url).netloc == host:
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # playwright's loop in this thread
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"]
            )
            context = browser.new_context(base_url=live_server.url)
            context.add_cookies([{"name": "sessionid", "value": session, "url": live_server.url}])
            context.route("**/*", only_here)
            tab = context.new_page()
            tab.goto("/api/docs")
            tab.wait_for_selector(".opblock", timeout=15_000)
            paths = set(tab.locator(".opblock-summary-path").all_inner_texts())
            browser.close()
    finally:
        if before is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = before
    assert {"/api/jobs", "/api/jobs/{job_id}", "/api/stats"} <= {p.replace("\u200b", "") for p in paths}
    assert outside == []
