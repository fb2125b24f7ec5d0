"""Brute force against the one login (the admin's: the way into the dashboard and the
API's sessions): after AXES_FAILURE_LIMIT wrong passwords even the right one is refused."""

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

pytestmark = pytest.mark.django_db


def login(client, password, username="ops"):
    return client.post("/admin/login/?next=/dashboard/", {"username": username, "password": password})


@pytest.fixture
def ops():
    User.objects.create_user("ops", password="right", is_staff=True)
    User.objects.create_user("other", password="right", is_staff=True)


def test_the_right_password_after_five_wrong_ones_is_refused(ops):
    client = Client()
    for _ in range(4):
        assert login(client, "wrong").status_code == 200  # the form again, with its error
    assert login(client, "wrong").status_code == 429  # the fifth locks

    r = login(client, "right")

    assert r.status_code == 429
    assert "_auth_user_id" not in client.session
    assert Client().get("/dashboard/").status_code == 302  # still the way to the login page


def test_fewer_failures_than_the_limit_still_let_the_right_password_in(ops):
    client = Client()
    for _ in range(4):
        login(client, "wrong")

    r = login(client, "right")

    assert r.status_code == 302 and r["Location"] == "/dashboard/"


def test_a_lockout_is_per_username_and_lifted_by_axes_reset(ops):
    client = Client()
    for _ in range(5):
        login(client, "wrong")

    assert login(Client(), "right", username="other").status_code == 302
    call_command("axes_reset", verbosity=0)
    assert login(Client(), "right").status_code == 302


def _via_proxy(client_address):
    # One reverse proxy (127.0.0.1) appending the address it was reached from.
    return Client(REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR=client_address)


def test_behind_a_trusted_proxy_a_lockout_is_the_clients_not_everyones(ops, settings):
    settings.TRUSTED_PROXIES = 1
    attacker = _via_proxy("203.0.113.9")
    for _ in range(5):
        login(attacker, "wrong")
    assert login(attacker, "right").status_code == 429
    # The real operator, from elsewhere through the same proxy, still gets in.
    assert login(_via_proxy("198.51.100.7"), "right").status_code == 302


def test_a_client_cannot_pick_its_address_with_a_forged_header(ops, settings):
    settings.TRUSTED_PROXIES = 1
    for n in range(5):
        # It writes a new address each time; the proxy appends the real one.
        login(_via_proxy(f"10.9.9.{n}, 203.0.113.9"), "wrong")
    assert login(_via_proxy("10.9.9.99, 203.0.113.9"), "right").status_code == 429


def test_with_no_trusted_proxy_the_header_is_ignored(ops, settings):
    settings.TRUSTED_PROXIES = 0
    for n in range(5):
        login(Client(REMOTE_ADDR="203.0.113.9", HTTP_X_FORWARDED_FOR=f"10.9.9.{n}"), "wrong")
    assert (
        login(Client(REMOTE_ADDR="203.0.113.9", HTTP_X_FORWARDED_FOR="10.1.1.1"), "right").status_code == 429
    )
