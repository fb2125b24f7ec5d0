"""Webhooks connect only to vetted addresses: a host name is resolved once at delivery, its
non-public addresses are refused unless WEBHOOK_ALLOWED_NETWORKS lists them, and the
connection goes to the vetted address with the URL's host in Host, SNI and the cert check."""

import ipaddress
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.exceptions import ImproperlyConfigured

from queue_app import enqueue
from queue_app.core import webhooks
from queue_app.exceptions import InvalidJob
from queue_app.models import Job, State
from queue_app.worker.execution import run_one

BODY = {"id": 1, "state": "completed"}
# The delivery job deliver() runs as: never saved, so these tests need no database.
DELIVERY = Job(id=1, attempts=1)


def allow(settings, hosts, networks=()):
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "WEBHOOK_ALLOWED_HOSTS": list(hosts),
        "WEBHOOK_ALLOWED_NETWORKS": list(networks),
        # Test receivers listen over http (or https) on random ports.
        "WEBHOOK_ALLOWED_SCHEMES": ["http", "https"],
        "WEBHOOK_ALLOWED_PORTS": None,
        "WEBHOOK_TIMEOUT": 2.0,
    }


def serve(tls=None):
    """A loopback server that records each POST's Host header (and, over TLS, the SNI name)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            server.hosts.append(self.headers["Host"])
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.hosts, server.sni = [], []
    if tls is not None:
        tls.sni_callback = lambda sock, name, ctx: server.sni.append(name)
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    server.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def plain_server():
    server = serve()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def localhost_cert(tmp_path):
    """A self-signed certificate for the name "localhost" (and no IP address)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture
def tls_server(localhost_cert):
    cert, key = localhost_cert
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = serve(context)
    server.cert = cert
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "224.0.0.1",
        "240.0.0.1",
        "255.255.255.255",
        "::1",
        "::",
        "fe80::1",
        "fc00::1",
        "ff02::1",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "::ffff:10.0.0.1",  # IPv4-mapped
        "2002:7f00:1::1",  # 6to4 of 127.0.0.1
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    ],
)
def test_non_public_addresses_are_refused(settings, address):
    allow(settings, [])
    assert not webhooks.address_allowed(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["93.184.216.34", "2606:4700:4700::1111", "::ffff:93.184.216.34"])
def test_public_addresses_are_allowed(settings, address):
    allow(settings, [])
    assert webhooks.address_allowed(ipaddress.ip_address(address))


def test_allowed_networks_open_exactly_the_addresses_they_cover(settings):
    allow(settings, [], ["127.0.0.0/8", "10.1.2.0/24", "fd00::1"])
    covered = ["127.0.0.1", "127.9.9.9", "::ffff:127.0.0.1", "10.1.2.3", "fd00::1"]
    outside = ["10.1.3.1", "::1", "169.254.169.254", "fd00::2"]
    assert all(webhooks.address_allowed(ipaddress.ip_address(a)) for a in covered)
    assert not any(webhooks.address_allowed(ipaddress.ip_address(a)) for a in outside)


@pytest.mark.django_db
def test_an_allow_listed_private_ip_literal_is_refused_at_enqueue_unless_its_network_is_allowed(settings):
    allow(settings, ["10.0.0.5"])
    with pytest.raises(InvalidJob, match="10.0.0.5 is not public and not in WEBHOOK_ALLOWED_NETWORKS"):
        enqueue("echo", webhook_url="http://10.0.0.5/hook")
    assert not Job.objects.exists()
    allow(settings, ["10.0.0.5"], ["10.0.0.0/8"])
    assert enqueue("echo", webhook_url="http://10.0.0.5/hook").webhook_url == "http://10.0.0.5/hook"


def test_a_name_that_resolves_to_loopback_is_refused_at_delivery(settings, plain_server):
    allow(settings, ["localhost"])
    url = f"http://localhost:{plain_server.port}/hook"
    webhooks.check_url(url)  # a name passes the enqueue-time check: only its addresses can tell
    with pytest.raises(webhooks.DeliveryFailed, match="resolves to 127.0.0.1: not public"):
        webhooks.send(url, BODY, DELIVERY)
    assert plain_server.hosts == []


def test_a_name_that_resolves_into_an_allowed_network_is_delivered_with_its_own_host_header(
    settings, plain_server
):
    allow(settings, ["localhost"], ["127.0.0.0/8"])
    url = f"http://localhost:{plain_server.port}/hook"
    assert webhooks.send(url, BODY, DELIVERY) == {"status": 204}
    assert plain_server.hosts == [f"localhost:{plain_server.port}"]


@pytest.mark.django_db
def test_a_refused_address_fails_the_delivery_attempt_and_it_retries(settings, plain_server):
    allow(settings, ["localhost"])
    enqueue("echo", webhook_url=f"http://localhost:{plain_server.port}/hook")
    run_one()
    delivery = run_one()
    assert delivery.kind == webhooks.KIND and delivery.state == State.PENDING
    assert "WEBHOOK_ALLOWED_NETWORKS" in delivery.last_error["message"]
    assert plain_server.hosts == []


def test_https_connects_to_the_vetted_address_but_sends_and_checks_the_host_name(
    settings, tls_server, monkeypatch
):
    allow(settings, ["localhost"], ["127.0.0.1/32"])
    url = f"https://localhost:{tls_server.port}/hook"
    # The certificate is not trusted yet: verification is on.
    with pytest.raises(webhooks.DeliveryFailed, match="CERTIFICATE_VERIFY_FAILED"):
        webhooks.send(url, BODY, DELIVERY)
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_server.cert))
    assert webhooks.send(url, BODY, DELIVERY) == {"status": 204}
    assert tls_server.sni[-1] == "localhost"
    assert tls_server.hosts == [f"localhost:{tls_server.port}"]


def test_https_to_an_ip_the_certificate_does_not_name_fails(settings, tls_server, monkeypatch):
    allow(settings, ["127.0.0.1"], ["127.0.0.1/32"])
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_server.cert))
    with pytest.raises(webhooks.DeliveryFailed, match="IP address mismatch|doesn't match"):
        webhooks.send(f"https://127.0.0.1:{tls_server.port}/hook", BODY, DELIVERY)
    assert tls_server.hosts == []


def test_a_malformed_allowed_network_is_reported_as_a_configuration_error(settings):
    allow(settings, [], ["10.0.0.0/33"])
    with pytest.raises(ImproperlyConfigured, match="WEBHOOK_ALLOWED_NETWORKS.*10.0.0.0/33"):
        webhooks.address_allowed(ipaddress.ip_address("10.0.0.1"))


def test_the_webhook_sample_refuses_a_host_outside_the_allow_list(settings):
    from queue_app.exceptions import InvalidJob
    from queue_app.ops import samples

    settings.JOBQUEUE = {**settings.JOBQUEUE, "WEBHOOK_ALLOWED_HOSTS": ["hooks.example.com"]}
    with pytest.raises(InvalidJob):
        samples.webhook({"url": "http://169.254.169.254/latest/meta-data", "body": {}})
    assert (
        samples.webhook({"url": "http://169.254.169.254/", "body": {}, "dry_run": True})["delivered"] is False
    )
