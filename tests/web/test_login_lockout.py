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
