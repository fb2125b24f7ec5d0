"""One HOST:PORT parser for `web --addr`, `metrics --addr` and runworker's sidecar flags."""

import pytest

from queue_app.core import addresses


@pytest.mark.parametrize(
    "addr, parsed, bind",
    [
        (":8080", ("0.0.0.0", 8080), "0.0.0.0:8080"),
        ("127.0.0.1:9", ("127.0.0.1", 9), "127.0.0.1:9"),
        ("[::1]:80", ("::1", 80), "[::1]:80"),
        ("localhost:65535", ("localhost", 65535), "localhost:65535"),
    ],
)
def test_an_address_parses_to_host_and_port_and_binds_as_gunicorn_takes_it(addr, parsed, bind):
    assert addresses.parse(addr) == parsed
    assert addresses.bind(addr) == bind


@pytest.mark.parametrize(
    "addr", ["8080", "host:", "host:0", "host:99999", "a b:80", "", None, "[::1]", "::1:80"]
)
def test_a_malformed_address_is_refused_with_the_forms_that_work(addr):
    with pytest.raises(ValueError, match=r"is not HOST:PORT or :PORT \(e\.g\. 127\.0\.0\.1:9090 or :9090\)"):
        addresses.parse(addr)
