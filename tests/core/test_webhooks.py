"""Webhooks: delivery jobs POST the outcome to an allow-listed http(s) receiver."""

import hashlib
import hmac
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from queue_app import enqueue
from queue_app.core import transitions, webhooks
from queue_app.exceptions import InvalidJob
from queue_app.models import Event, Job, State
from queue_app.worker.execution import run_one
from tests import worker_support

SECRET = "s3cret"


@pytest.fixture
def hooks(settings):
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"],
        # The receiver is on loopback, which only an explicit network entry opens, over
        # plain http on a random port, which only these two open.
        "WEBHOOK_ALLOWED_NETWORKS": ["127.0.0.1"],
        "WEBHOOK_ALLOWED_SCHEMES": ["http", "https"],
        "WEBHOOK_ALLOWED_PORTS": None,
        "WEBHOOK_SECRET": SECRET,
        "WEBHOOK_TIMEOUT": 2.0,
        "BACKOFF_BASE": 0.05,
    }


@pytest.fixture
def idle_receiver():
    """A real HTTP server on loopback that answers the statuses in ``plan`` in turn, then 200
    (401 if ``secret`` is set and ``webhooks.verify`` rejects the request, as a receiver would);
    bound and listening, but serving only once ``start()`` is called: a test that forks a
    worker does so first, so no serving thread runs (and holds a lock) across the fork."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            server.calls.append((dict(self.headers), body))
            status = server.plan.pop(0) if server.plan else 200
            signature = self.headers[webhooks.SIGNATURE_HEADER]
            if server.secret and not webhooks.verify(body, signature, server.secret):
                status = 401
            self.send_response(status)
            if status in (301, 302):
                self.send_header("Location", "http://10.0.0.1/")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.calls, server.plan, server.secret = [], [], None
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


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url, says",
    [
        ("http://hooks.example.com/x", "scheme 'http' is not in the WEBHOOK_ALLOWED_SCHEMES"),
        ("https://hooks.example.com:8443/x", "port 8443 is not in the WEBHOOK_ALLOWED_PORTS"),
        ("https://hooks.example.com:22/x", "port 22 is not in the WEBHOOK_ALLOWED_PORTS"),
    ],
)
def test_an_allowed_host_is_reached_over_https_on_443_unless_more_is_listed(settings, url, says):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "WEBHOOK_ALLOWED_HOSTS": ["hooks.example.com"]}

    with pytest.raises(InvalidJob, match=says):
        enqueue("echo", webhook_url=url)
    assert (
        enqueue("echo", webhook_url="https://hooks.example.com/x").webhook_url
        == "https://hooks.example.com/x"
    )
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "WEBHOOK_ALLOWED_SCHEMES": ["http", "https"],
        "WEBHOOK_ALLOWED_PORTS": [443, 8443, 80],
    }
    if ":22/" not in url:
        assert enqueue("echo", webhook_url=url).webhook_url == url


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
    # The payload only names the job and its state: the body is read when it is sent.
    assert delivery.payload == {"job_id": job.id, "state": "completed"}
    assert run_one().state == State.COMPLETED
    body = json.loads(receiver.calls[0][1])
    assert (
        body["id"] == job.id
        and body["state"] == "completed"
        and body["result"] == 3
        and body["attempts"] == 1
    )
    assert body["error"] is None and body["finished_at"]


def _sent(receiver):
    headers, raw = receiver.calls[-1]
    stamp = headers[webhooks.TIMESTAMP_HEADER]
    assert webhooks.verify(raw, headers[webhooks.SIGNATURE_HEADER], SECRET, now=int(stamp))
    return json.loads(raw)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "forged",
    [
        {"job_id": "{id}", "state": "completed", "body": {"id": 1, "state": "completed", "result": "forged"}},
        {"url": "http://127.0.0.1:1/elsewhere", "body": {"id": "{id}", "state": "completed", "result": "x"}},
    ],
)
def test_a_delivery_whose_payload_was_tampered_with_still_signs_the_real_rows(hooks, receiver, forged):
    job = enqueue("boom", {"message": "nope"}, max_attempts=1, webhook_url=receiver.url)
    run_one()
    delivery = Job.objects.get(kind=webhooks.KIND)
    # Written straight into the database: no route lets a payload like this in.
    forged = json.loads(json.dumps(forged).replace('"{id}"', str(job.id)))
    Job.objects.filter(id=delivery.id).update(payload=forged)

    assert run_one().state == State.COMPLETED
    body = _sent(receiver)
    assert (body["id"], body["state"], body["result"]) == (job.id, "dead_letter", None)
    assert body["error"]["message"] == "nope"
    assert len(receiver.calls) == 1  # to the job's own webhook_url, not the forged one


@pytest.mark.django_db
def test_a_delivery_enqueued_before_payloads_named_the_job_is_still_sent_from_the_row(hooks, receiver):
    job = enqueue("add", {"a": 1, "b": 2}, webhook_url=receiver.url)
    run_one(kinds=["add"])
    delivery = Job.objects.get(kind=webhooks.KIND)
    old = {"url": receiver.url, "body": {"id": job.id, "state": "completed", "result": 3}}
    Job.objects.filter(id=delivery.id).update(payload=old)
    assert run_one().state == State.COMPLETED
    assert (_sent(receiver)["id"], _sent(receiver)["result"]) == (job.id, 3)


@pytest.fixture
def delivered(hooks, receiver):
    """The headers and raw body of one real delivery, and when it was sent."""
    enqueue("boom", {"message": "nope"}, max_attempts=1, webhook_url=receiver.url)
    run_one()
    before = time.time()
    assert run_one().state == State.COMPLETED
    headers, raw = receiver.calls[0]
    return headers, raw, before


@pytest.mark.django_db
def test_delivery_posts_json_signed_over_the_timestamp_and_body(delivered):
    headers, raw, before = delivered
    stamp = headers[webhooks.TIMESTAMP_HEADER]
    assert before - 1 <= int(stamp) <= time.time()
    mac = hmac.new(SECRET.encode(), f"{stamp}.".encode() + raw, hashlib.sha256).hexdigest()
    assert headers[webhooks.SIGNATURE_HEADER] == f"t={stamp},v1={mac}"
    assert json.loads(raw)["state"] == "dead_letter" and json.loads(raw)["error"]["message"] == "nope"


@pytest.mark.django_db
def test_a_receiver_that_verifies_signatures_accepts_a_real_delivery(hooks, receiver):
    receiver.secret = SECRET
    enqueue("echo", webhook_url=receiver.url)
    run_one()
    assert run_one().state == State.COMPLETED
    assert len(receiver.calls) == 1


@pytest.mark.django_db
def test_a_receiver_that_verifies_signatures_refuses_a_delivery_signed_with_another_secret(hooks, receiver):
    receiver.secret = "another secret"
    enqueue("echo", webhook_url=receiver.url)
    run_one()
    delivery = run_one()
    assert delivery.state == State.PENDING and "401" in delivery.last_error["message"]


@pytest.mark.django_db
def test_verify_refuses_a_tampered_body(delivered):
    headers, raw, _ = delivered
    signature, now = headers[webhooks.SIGNATURE_HEADER], int(headers[webhooks.TIMESTAMP_HEADER])
    tampered = raw.replace(b'"dead_letter"', b'"completed"')
    assert tampered != raw
    assert webhooks.verify(raw, signature, SECRET, now=now)
    assert not webhooks.verify(tampered, signature, SECRET, now=now)
    with pytest.raises(webhooks.InvalidSignature, match="no v1 signature matches"):
        webhooks.check_signature(tampered, signature, SECRET, now=now)


@pytest.mark.django_db
def test_verify_refuses_a_delivery_replayed_after_the_tolerance_window(delivered):
    headers, raw, _ = delivered
    signature, sent = headers[webhooks.SIGNATURE_HEADER], int(headers[webhooks.TIMESTAMP_HEADER])
    assert webhooks.verify(raw, signature, SECRET, now=sent + 300)
    assert not webhooks.verify(raw, signature, SECRET, now=sent + 301)
    assert not webhooks.verify(raw, signature, SECRET, now=sent - 301)  # dated in the future
    assert not webhooks.verify(raw, signature, SECRET, tolerance=60, now=sent + 61)
    with pytest.raises(webhooks.InvalidSignature, match="301s from now; the tolerance is 300s"):
        webhooks.check_signature(raw, signature, SECRET, now=sent + 301)


@pytest.mark.django_db
def test_a_replay_cannot_be_freshened_by_rewriting_the_timestamp(delivered):
    headers, raw, _ = delivered
    signature, sent = headers[webhooks.SIGNATURE_HEADER], int(headers[webhooks.TIMESTAMP_HEADER])
    later = sent + 3600
    freshened = signature.replace(f"t={sent},", f"t={later},")
    assert freshened != signature
    assert not webhooks.verify(raw, freshened, SECRET, now=later)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "malform",
    [
        pytest.param(lambda t, mac: None, id="missing"),
        pytest.param(lambda t, mac: "", id="empty"),
        pytest.param(lambda t, mac: "sha256=" + mac, id="old-format"),
        pytest.param(lambda t, mac: f"v1={mac}", id="no-timestamp"),
        pytest.param(lambda t, mac: f"t={t}", id="no-signature"),
        pytest.param(lambda t, mac: f"t={t};v1={mac}", id="wrong-separator"),
        pytest.param(lambda t, mac: f"t={t},v1={mac},", id="trailing-comma"),
        pytest.param(lambda t, mac: f"t={t},t={t},v1={mac}", id="two-timestamps"),
        pytest.param(lambda t, mac: f"t=+{t},v1={mac}", id="signed-timestamp"),
        pytest.param(lambda t, mac: f"t= {t},v1={mac}", id="spaced-timestamp"),
        pytest.param(lambda t, mac: f"t={t}.0,v1={mac}", id="fractional-timestamp"),
        pytest.param(lambda t, mac: f"t={t},v1={mac}\u00e9", id="non-ascii"),
        pytest.param(lambda t, mac: f"t={t},v1={mac.upper()}", id="upper-case-hex"),
    ],
)
def test_verify_refuses_a_malformed_signature_header(delivered, malform):
    headers, raw, _ = delivered
    sent = int(headers[webhooks.TIMESTAMP_HEADER])
    mac = re.fullmatch(r"t=\d+,v1=([0-9a-f]{64})", headers[webhooks.SIGNATURE_HEADER]).group(1)
    assert webhooks.verify(raw, f"t={sent},v1={mac}", SECRET, now=sent)
    assert not webhooks.verify(raw, malform(sent, mac), SECRET, now=sent)


@pytest.mark.django_db
def test_verify_accepts_any_of_several_v1_signatures_while_a_secret_rotates(delivered):
    headers, raw, _ = delivered
    sent = int(headers[webhooks.TIMESTAMP_HEADER])
    mac = headers[webhooks.SIGNATURE_HEADER].partition(",v1=")[2]
    assert webhooks.verify(raw, f"t={sent},v1={'0' * 64},v1={mac}", SECRET, now=sent)
    assert not webhooks.verify(raw, f"t={sent},v1={'0' * 64}", SECRET, now=sent)


def test_verify_wants_the_raw_body_bytes():
    signature = webhooks.sign(b"{}", SECRET, 1700000000)
    assert webhooks.verify(b"{}", signature, SECRET, now=1700000000)
    with pytest.raises(TypeError, match="raw bytes"):
        webhooks.verify("{}", signature, SECRET, now=1700000000)


@pytest.mark.django_db
def test_a_retry_is_signed_afresh_with_its_own_timestamp_under_the_same_delivery_id(hooks, receiver):
    receiver.plan = [500]
    enqueue("echo", webhook_url=receiver.url)
    run_one()
    first = run_one()
    assert first.state == State.PENDING
    first_stamp = int(receiver.calls[0][0][webhooks.TIMESTAMP_HEADER])
    # Timestamps are whole seconds: wait for the next one (and the retry's backoff).
    time.sleep(max(0, max(first_stamp + 1, first.run_at.timestamp()) - time.time() + 0.01))
    assert run_one().state == State.COMPLETED
    (headers1, raw1), (headers2, raw2) = receiver.calls
    sent1, sent2 = int(headers1[webhooks.TIMESTAMP_HEADER]), int(headers2[webhooks.TIMESTAMP_HEADER])
    assert sent2 > sent1 and raw1 == raw2
    assert headers2[webhooks.SIGNATURE_HEADER].startswith(f"t={sent2},")
    assert webhooks.verify(raw2, headers2[webhooks.SIGNATURE_HEADER], SECRET, now=sent2)
    assert headers1[webhooks.DELIVERY_HEADER] == headers2[webhooks.DELIVERY_HEADER] == str(first.id)
    assert (headers1[webhooks.ATTEMPT_HEADER], headers2[webhooks.ATTEMPT_HEADER]) == ("1", "2")


@pytest.mark.django_db
def test_cancel_is_reported_too(hooks, receiver):
    job = enqueue("echo", webhook_url=receiver.url)
    transitions.cancel(job.id)
    assert Job.objects.get(kind=webhooks.KIND).payload["state"] == "cancelled"
    assert run_one().state == State.COMPLETED
    assert _sent(receiver)["state"] == "cancelled" and _sent(receiver)["error"] is None


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
def test_a_receiver_that_fails_twice_then_accepts_gets_one_delivery_through_a_real_worker(
    hooks, idle_receiver
):
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


# --- deliveries cannot be forged --------------------------------------------------------------


@pytest.mark.django_db
def test_no_enqueue_route_makes_a_delivery_job(hooks, receiver):
    from django.core.management import CommandError, call_command
    from django.test import Client

    from queue_app import bulk_enqueue
    from queue_app.web import auth as api_auth

    forged = {"url": receiver.url, "body": {"id": 1, "state": "completed", "result": "pay me"}}
    with pytest.raises(InvalidJob, match="the queue's own"):
        enqueue(webhooks.KIND, forged)
    with pytest.raises(InvalidJob, match="the queue's own"):
        bulk_enqueue([{"kind": "echo"}, {"kind": webhooks.KIND, "payload": forged}])
    with pytest.raises(InvalidJob, match="the queue's own"):
        enqueue("echo", {}, on_success={"kind": webhooks.KIND, "payload": forged})
    with pytest.raises(CommandError, match="the queue's own"):
        call_command("enqueue", "--kind", webhooks.KIND, "--payload", json.dumps(forged))
    _, raw = api_auth.create("writer")
    r = Client(headers={"X-API-Key": raw}).post(
        "/api/jobs", json.dumps({"kind": webhooks.KIND, "payload": forged}), content_type="application/json"
    )
    assert r.status_code == 400 and r.json()["field"] == "kind"
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_a_deliverys_payload_cannot_be_edited_or_replaced_on_requeue(hooks, receiver, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "WEBHOOK_MAX_ATTEMPTS": 1}
    enqueue("add", {"a": 1, "b": 2}, webhook_url=receiver.url)
    run_one(kinds=["add"])
    delivery = Job.objects.get(kind=webhooks.KIND)
    signed = delivery.payload
    events_before = Event.objects.filter(job_id=delivery.id).count()

    with pytest.raises(InvalidJob, match="webhook delivery"):
        transitions.change_payload(delivery.id, {"url": receiver.url, "body": {"forged": True}})
    transitions.cancel(delivery.id)
    with pytest.raises(InvalidJob, match="webhook delivery"):
        transitions.requeue(delivery.id, payload={"url": receiver.url, "body": {"forged": True}})

    delivery.refresh_from_db()
    assert delivery.payload == signed
    assert Event.objects.filter(job_id=delivery.id).count() == events_before + 1  # only the cancel
    assert transitions.requeue(delivery.id).payload == signed  # as it was: allowed
