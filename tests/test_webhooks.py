"""Webhooks: delivery jobs POST the outcome to an allow-listed http(s) receiver."""
import hashlib
import hmac
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from queue_app import enqueue, transitions, webhooks
from queue_app.exceptions import InvalidJob
from queue_app.execution import run_one
from queue_app.models import Event, Job, State
from tests import worker_support

SECRET = "s3cret"


@pytest.fixture
def hooks(settings):
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"],
        # The receiver is on loopback, which only an explicit network entry opens.
        "WEBHOOK_ALLOWED_NETWORKS": ["127.0.0.1"],
        "WEBHOOK_SECRET": SECRET,
        "WEBHOOK_TIMEOUT": 2.0,
        "BACKOFF_BASE": 0.05,
    }


@pytest.fixture
def idle_receiver():
    """A real HTTP server on loopback that answers the statuses in ``plan`` in turn, then 200;
    bound and listening, but serving only once ``start()`` is called: a test that forks a
    worker does so first, so no serving thread runs (and holds a lock) across the fork."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            server.calls.append((dict(self.headers), body))
            status = server.plan.pop(0) if server.plan else 200
            self.send_response(status)
            if status in (301, 302):
                self.send_header("Location", "http://10.0.0.1/")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.calls, server.plan = [], []
    server.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    server.start = thread.start
    yield server
    if thread.is_alive():
        server.shutdown()
    server.server_close()


@pytest.fixture
def receiver(idle_receiver):
    idle_receiver.start()
    return idle_receiver


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url, says",
    [
        ("http://169.254.169.254/latest", "not in the WEBHOOK_ALLOWED_HOSTS"),
        ("ftp://127.0.0.1/x", "http or https"),
        ("file:///etc/passwd", "http or https"),
        ("http://user:pw@127.0.0.1/", "credentials"),
        ("http://127.0.0.1:99999/", "not a valid URL"),
    ],
)
def test_webhook_urls_outside_the_rules_are_refused_at_enqueue(hooks, url, says):
    with pytest.raises(InvalidJob, match=says):
        enqueue("echo", webhook_url=url)
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_with_no_allow_list_every_webhook_is_refused():
    with pytest.raises(InvalidJob, match="WEBHOOK_ALLOWED_HOSTS"):
        enqueue("echo", webhook_url="https://example.com/hook")


def test_allow_list_entries_with_a_dot_cover_subdomains(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "WEBHOOK_ALLOWED_HOSTS": [".example.com", "hooks.test"]}
    assert webhooks.host_allowed("a.example.com") and webhooks.host_allowed("example.com")
    assert webhooks.host_allowed("HOOKS.test")
    assert not webhooks.host_allowed("evil-example.com") and not webhooks.host_allowed("x.hooks.test")


@pytest.mark.django_db
def test_a_finished_job_enqueues_its_delivery_in_the_same_transaction(hooks, receiver):
    job = enqueue("add", {"a": 1, "b": 2}, webhook_url=receiver.url)
    run_one(kinds=["add"])
    delivery = Job.objects.get(kind=webhooks.KIND)
    assert Event.objects.get(job_id=job.id, type="completed").metadata == {"webhook": delivery.id}
    body = delivery.payload["body"]
    assert body["id"] == job.id and body["state"] == "completed" and body["result"] == 3 and body["attempts"] == 1
    assert body["error"] is None and body["finished_at"]


@pytest.mark.django_db
def test_delivery_posts_signed_json_to_the_receiver(hooks, receiver):
    enqueue("boom", {"message": "nope"}, max_attempts=1, webhook_url=receiver.url)
    run_one()
    delivered = run_one()
    assert delivered.kind == webhooks.KIND and delivered.state == State.COMPLETED
    headers, raw = receiver.calls[0]
    expected = "sha256=" + hmac.new(SECRET.encode(), raw, hashlib.sha256).hexdigest()
    assert headers[webhooks.SIGNATURE_HEADER] == expected
    assert json.loads(raw)["state"] == "dead_letter" and json.loads(raw)["error"]["message"] == "nope"


@pytest.mark.django_db
def test_cancel_is_reported_too(hooks, receiver):
    job = enqueue("echo", webhook_url=receiver.url)
    transitions.cancel(job.id)
    assert Job.objects.get(kind=webhooks.KIND).payload["body"]["state"] == "cancelled"


@pytest.mark.django_db
def test_a_redirect_is_not_followed_and_fails_the_attempt(hooks, receiver):
    receiver.plan = [302]
    enqueue("echo", webhook_url=receiver.url)
    run_one()
    delivery = run_one()
    assert delivery.state == State.PENDING and "302" in delivery.last_error["message"]
    assert len(receiver.calls) == 1


@pytest.mark.django_db
def test_delivery_refuses_a_host_removed_from_the_allow_list_since_enqueue(hooks, receiver, settings):
    enqueue("echo", webhook_url=receiver.url)
    run_one()
    settings.JOBQUEUE = {**settings.JOBQUEUE, "WEBHOOK_ALLOWED_HOSTS": []}
    delivery = run_one()
    assert delivery.state == State.PENDING and "WEBHOOK_ALLOWED_HOSTS" in delivery.last_error["message"]
    assert receiver.calls == []


@pytest.mark.django_db(transaction=True)
def test_a_receiver_that_fails_twice_then_accepts_gets_one_delivery_through_a_real_worker(hooks, idle_receiver):
    receiver = idle_receiver
    receiver.plan = [500, 503]
    job = enqueue("echo", {"hello": "world"}, webhook_url=receiver.url)
    proc = worker_support.start_worker(max_jobs=4, batch=1, poll=0.02)
    receiver.start()  # after the fork; the worker's requests wait in the listen backlog till then
    assert worker_support.join(proc, within=30) == 0
    delivery = Job.objects.get(kind=webhooks.KIND)
    assert delivery.state == State.COMPLETED and delivery.attempts == 3
    assert [e.type for e in delivery.events.all()].count("failed") == 2
    assert len(receiver.calls) == 3
    assert [json.loads(body)["id"] for _, body in receiver.calls] == [job.id] * 3
