"""The dashboard's job page for a job in a workflow: its group, what it waits for, and
the operator's run-now and cancel for a waiting job."""

import pytest
from django.urls import reverse

from queue_app import Workflow, enqueue, group
from queue_app.models import Job, State
from queue_app.ops import workflows
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


def test_a_members_page_links_its_workflow_page_which_shows_the_groups_progress(operator):
    g = group([{"kind": "echo"}, {"kind": "echo"}], callback={"kind": "echo"}, name="nightly")
    assert url("workflow", g.job_ids[0]) in operator.get(url("job", g.job_ids[0])).content.decode()
    run_one()
    page = operator.get(url("workflow", g.job_ids[0])).content.decode()
    assert f"Group {g.id} (nightly)" in page and "1 of 2 ended: 1 completed" in page
    assert all(url("job", i) in page for i in g.job_ids)


def test_the_workflow_page_draws_a_diamond_with_each_job_coloured_by_state_and_linked(operator):
    wf = Workflow()
    wf.add("a", {"kind": "echo"})
    wf.add("b", {"kind": "echo"}, after=["a"])
    wf.add("c", {"kind": "echo"}, after=["a"])
    wf.add("d", {"kind": "echo"}, after=["b", "c"])
    jobs = wf.enqueue()
    run_one()
    page = operator.get(url("workflow", jobs["d"].id)).content.decode()
    assert "<svg" in page and page.count("<line ") == 4
    assert f'data-job="{jobs["a"].id}" data-state="completed"' in page
    assert f'data-job="{jobs["b"].id}" data-state="pending"' in page
    assert f'data-job="{jobs["d"].id}" data-state="waiting"' in page
    # a, then b and c, then d: one column per depth.
    graph = workflows.graph(jobs["d"].id)
    xs = {n["id"]: n["x"] for n in graph["nodes"]}
    assert xs[jobs["a"].id] < xs[jobs["b"].id] == xs[jobs["c"].id] < xs[jobs["d"].id]


def test_the_workflow_page_of_an_unknown_job_is_404(operator):
    assert operator.get(url("workflow", 424242)).status_code == 404


def test_the_admin_lists_groups_read_only_with_their_progress(admin_client):
    g = group([{"kind": "echo"}, {"kind": "echo"}], name="nightly")
    run_one()
    page = admin_client.get(reverse("admin:queue_app_jobgroup_changelist")).content.decode()
    assert "nightly" in page and "1 of 2 (1 completed, 0 dead, 0 cancelled)" in page
    assert admin_client.get(reverse("admin:queue_app_jobgroup_add")).status_code == 403
    assert admin_client.get(reverse("admin:queue_app_jobgroup_change", args=[g.id])).status_code == 200
