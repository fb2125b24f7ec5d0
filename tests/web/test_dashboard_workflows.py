"""The dashboard's job page for a job in a workflow: its group, what it waits for, and
the operator's run-now and cancel for a waiting job."""

import pytest
from django.urls import reverse

from queue_app import enqueue, group
from queue_app.models import Job, State
from queue_app.worker.execution import run_one
from tests.factories import make_staff

pytestmark = pytest.mark.django_db


def url(name, *args):
    return reverse(f"queue_app_dashboard:{name}", args=args)


@pytest.fixture
def operator(client):
    client.force_login(make_staff("op", "queue_app.view_job", "queue_app.change_job"))
    return client


def test_a_waiting_jobs_page_says_what_it_waits_for_and_offers_run_now_and_cancel(operator):
    a = enqueue("echo")
    b = enqueue("echo", depends_on=[a.id])
    page = operator.get(url("job", b.id)).content.decode()
    assert "Waiting for" in page and "1 job to end" in page
    assert url("job_action", b.id, "requeue") in page and url("job_action", b.id, "cancel") in page
    operator.post(url("job_action", b.id, "requeue"))
    assert Job.objects.get(id=b.id).state == State.PENDING


def test_a_held_job_says_so_and_cancel_drops_it(operator):
    a = enqueue("boom", max_attempts=1)
    b = enqueue("echo", depends_on=[a.id], on_dependency_failure="hold")
    run_one()
    assert "held: a job it depends on failed" in operator.get(url("job", b.id)).content.decode()
    operator.post(url("job_action", b.id, "cancel"))
    assert Job.objects.get(id=b.id).state == State.CANCELLED


def test_a_members_page_links_its_group(operator):
    g = group([{"kind": "echo"}])
    assert f'href="/api/groups/{g.id}"' in operator.get(url("job", g.job_ids[0])).content.decode()
