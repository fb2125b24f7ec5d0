"""Every surface reads the same status for the same job and the same worker: Job.status
and the querysets, the dashboard, the admin, the JSON API, the CLI, /health and
/metrics. One job in each status (and a late one, and a retry whose backoff has passed,
which is ready), one live and one lost worker, read through each of them."""

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from queue_app.models import (
    JOB_STATUSES,
    PENDING_STATUSES,
    STATUSES,
    Job,
    Pause,
    PauseScope,
    State,
    Worker,
    WorkerState,
    derive_status,
)
from queue_app.web import auth as api_auth
from tests.factories import JobFactory, make_staff

pytestmark = pytest.mark.django_db

STAFF_PERMS = [
    "queue_app.view_job",
    "queue_app.view_event",
    "queue_app.view_deadletter",
    "queue_app.view_worker",
]


@pytest.fixture
def world():
    """One job per status and two workers; returns (jobs by name, expected status, late ids)."""
    now = timezone.now()
    lease = 30  # LEASE_SECONDS, pinned by conftest
    Pause.objects.create(scope=PauseScope.QUEUE, name="held")
    Pause.objects.create(scope=PauseScope.KIND, name="frozen")
    jobs = {
        "ready": JobFactory(run_at=now - timedelta(seconds=5)),
        # Failed once, backoff over: claimable, so ready (not retrying) everywhere.
        "ready_after_retry": JobFactory(attempts=1, run_at=now - timedelta(seconds=5)),
        "late": JobFactory(run_at=now - timedelta(hours=1)),
        "scheduled": JobFactory(scheduled=True),
        "retrying": JobFactory(attempts=1, scheduled=True),
        # Due for an hour, but held by a pause: paused, and never late.
        "paused_queue": JobFactory(queue_name="held", run_at=now - timedelta(hours=1)),
        "paused_kind": JobFactory(kind="frozen", run_at=now - timedelta(hours=1)),
        "leased": JobFactory(leased=True),
    }
    expected = {
        "ready": "ready",
        "ready_after_retry": "ready",
        "late": "ready",
        "scheduled": "scheduled",
        "retrying": "retrying",
        "paused_queue": "paused",
        "paused_kind": "paused",
        "leased": "leased",
    }
    Worker.objects.create(name="live", host="h", pid=1, last_heartbeat=now)
    # Silent for a little more than a lease: the window where surfaces used to disagree.
    Worker.objects.create(name="lost", host="h", pid=2, last_heartbeat=now - timedelta(seconds=lease + 10))
    Worker.objects.create(name="gone", host="h", pid=3, state=WorkerState.STOPPED)
    by_id = {job.id: expected[name] for name, job in jobs.items()}
    return jobs, by_id, {jobs["late"].id}


WORKERS = {"live": "running", "lost": "lost", "gone": "stopped"}


def ids_with(by_id, status, late):
    """The ids a filter on ``status`` must return."""
    if status == "late":
        return set(late)
    if status == State.PENDING:
        return {i for i, s in by_id.items() if s in PENDING_STATUSES}
    return {i for i, s in by_id.items() if s == status}


@pytest.fixture
def staff(client):
    client.force_login(make_staff("staff", *STAFF_PERMS))
    return client


# --- the models: the one definition -------------------------------------------------------


def test_job_status_and_the_querysets_read_each_job_the_same(world):
    _, by_id, late = world
    for job in Job.objects.all():
        assert job.status == by_id[job.id], job
        assert job.is_late == (job.id in late), job
    for job in Job.objects.with_status():
        assert job.status == by_id[job.id], job
    for status in STATUSES:
        assert set(Job.objects.status(status).values_list("id", flat=True)) == ids_with(by_id, status, late)
    assert set(Job.objects.ready().values_list("id", flat=True)) == ids_with(by_id, "ready", late)
    assert set(Job.objects.late().values_list("id", flat=True)) == late
    assert set(Job.objects.retrying().values_list("id", flat=True)) == ids_with(by_id, "retrying", late)
    assert set(Job.objects.scheduled().values_list("id", flat=True)) == ids_with(by_id, "scheduled", late)
    assert set(Job.objects.paused().values_list("id", flat=True)) == ids_with(by_id, "paused", late)


def test_worker_status_and_the_querysets_read_each_worker_the_same(world):
    assert {w.name: w.status for w in Worker.objects.all()} == WORKERS
    assert set(Worker.objects.lost().values_list("name", flat=True)) == {"lost"}
    assert set(Worker.objects.live().values_list("name", flat=True)) == {"live"}
    for status in ("running", "stopping", "lost", "stopped"):
        names = set(Worker.objects.status(status).values_list("name", flat=True))
        assert names == {n for n, s in WORKERS.items() if s == status}


# --- the dashboard ----------------------------------------------------------------------


def test_the_dashboard_reads_the_same_statuses(world, staff):
    _, by_id, late = world
    jobs_url = reverse("queue_app_dashboard:jobs")
    page = staff.get(jobs_url).context["page"]
    assert {j.id: j.status for j in page.rows} == by_id
    for status in STATUSES:
        rows = staff.get(jobs_url, {"status": status}).context["page"].rows
        assert {j.id for j in rows} == ids_with(by_id, status, late), status
    html = staff.get(jobs_url).content.decode()
    for status in set(by_id.values()):
        assert html.count(f'data-status="{status}"') == list(by_id.values()).count(status)
    assert html.count("data-late") == len(late)
    for job_id, status in by_id.items():
        response = staff.get(reverse("queue_app_dashboard:job", args=[job_id]))
        assert response.context["status"] == status
    pending = staff.get(reverse("queue_app_dashboard:overview")).context["pending"]
    for status in (*PENDING_STATUSES, "late"):
        assert pending[status] == len(ids_with(by_id, status, late)), status
    rows = staff.get(reverse("queue_app_dashboard:workers")).context["workers"]
    assert {r["worker"].name: r["status"] for r in rows} == WORKERS
    workers = staff.get(reverse("queue_app_dashboard:overview")).context["workers"]
    assert (workers["alive"], workers["lost"]) == (1, 1)


# --- the admin ------------------------------------------------------------------------------


def test_the_admin_reads_the_same_statuses(world, staff):
    _, by_id, late = world
    url = reverse("admin:queue_app_job_changelist")
    for status in STATUSES:
        shown = staff.get(url, {"status": status}).context["cl"].result_list
        assert {j.id for j in shown} == ids_with(by_id, status, late), status
    model_admin = staff.get(url).context["cl"].model_admin
    shown = staff.get(url).context["cl"].result_list
    assert {j.id: model_admin.status_badge(j).removesuffix(" (late)") for j in shown} == by_id
    workers_url = reverse("admin:queue_app_worker_changelist")
    response = staff.get(workers_url)
    cl = response.context["cl"]
    assert {w.name: cl.model_admin.status(w) for w in cl.result_list} == WORKERS
    for status in ("running", "lost", "stopped"):
        names = {w.name for w in staff.get(workers_url, {"status": status}).context["cl"].result_list}
        assert names == {n for n, s in WORKERS.items() if s == status}


# --- the JSON API -----------------------------------------------------------------------------


def test_the_api_reads_the_same_statuses(world):
    _, by_id, late = world
    api = Client(headers={"X-API-Key": api_auth.create("agree")[1]})
    items = api.get("/api/jobs", {"limit": 100}).json()["items"]
    assert {j["id"]: j["status"] for j in items} == by_id
    for status in STATUSES:
        items = api.get("/api/jobs", {"status": status, "limit": 100}).json()["items"]
        assert {j["id"] for j in items} == ids_with(by_id, status, late), status
    for job_id, status in by_id.items():
        assert api.get(f"/api/jobs/{job_id}").json()["status"] == status
    assert {w["name"]: w["status"] for w in api.get("/api/workers").json()} == WORKERS


def test_the_api_refuses_a_state_and_a_status_together(world):
    api = Client(headers={"X-API-Key": api_auth.create("agree")[1]})
    r = api.get("/api/jobs", {"state": "pending", "status": "ready"})
    assert r.status_code == 400 and r.json()["field"] == "status"


# --- the CLI --------------------------------------------------------------------------------------


def run(*args):
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_the_cli_reads_the_same_statuses(world):
    _, by_id, late = world
    data = json.loads(run("inspect", "--json", "--limit", "100"))
    assert {j["id"]: j["status"] for j in data["jobs"]} == by_id
    for status in (*PENDING_STATUSES, "late"):
        assert data["pending"][status] == len(ids_with(by_id, status, late)), status
    for status in STATUSES:
        jobs = json.loads(run("inspect", "--json", "--limit", "100", "--state", status))["jobs"]
        assert {j["id"] for j in jobs} == ids_with(by_id, status, late), status
    for job_id, status in by_id.items():
        assert json.loads(run("history", str(job_id), "--json"))["job"]["status"] == status
    rows = json.loads(run("workers", "--all", "--json"))
    assert {r["name"]: r["status"] for r in rows} == WORKERS
    workers = json.loads(run("status", "--json"))["workers"]
    assert (workers["running"], workers["lost"], workers["stopped"]) == (1, 1, 1)
    assert "1 lost" in run("status") and "2 paused" in run("status")


# --- /health and /metrics ----------------------------------------------------------------------


def test_health_and_metrics_read_the_same_statuses(world, client):
    _, by_id, late = world
    assert client.get("/health").json()["checks"]["workers"]["alive"] == 1
    text = client.get("/metrics").content.decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    by_status = {s.labels["status"]: s.value for s in fams["jobqueue_jobs_by_status"].samples}
    assert by_status == {status: len(ids_with(by_id, status, late)) for status in JOB_STATUSES}
    assert fams["jobqueue_late_jobs"].samples[0].value == len(late)
    workers = {s.labels["state"]: s.value for s in fams["jobqueue_workers"].samples}
    assert workers == {"running": 1, "quiet": 0, "stopping": 0, "lost": 1, "stopped": 1}
    # The oldest ready job is the late one, an hour old; the paused ones, older, are held.
    oldest = fams["jobqueue_oldest_pending_seconds"].samples[0].value
    assert 3599 <= oldest < 3700


def test_health_counts_a_worker_silent_past_a_lease_as_lost(client):
    now = timezone.now()
    Worker.objects.create(name="quiet", host="h", pid=1, last_heartbeat=now - timedelta(seconds=45))
    assert client.get("/health").status_code == 503
    assert json.loads(run("workers", "--json"))[0]["status"] == "lost"


# --- the rule in SQL and the rule in Python agree ------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(State.values),
            st.integers(min_value=-4000, max_value=4000),  # run_at, seconds from now
            st.integers(min_value=0, max_value=3),  # attempts
            st.sampled_from(["default", "held"]),  # queue
            st.sampled_from(["echo", "frozen"]),  # kind
        ),
        min_size=1,
        max_size=12,
    ),
    pauses=st.sets(st.sampled_from([(PauseScope.QUEUE, "held"), (PauseScope.KIND, "frozen")])),
)
def test_the_queryset_rule_and_the_instance_rule_agree(rows, pauses):
    Job.objects.all().delete()
    Pause.objects.all().delete()
    for scope, name in pauses:
        Pause.objects.create(scope=scope, name=name)
    now = timezone.now()
    made = {}
    for state, offset, attempts, queue, kind in rows:
        leased = state == State.LEASED
        job = JobFactory(
            state=state,
            run_at=now + timedelta(seconds=offset),
            attempts=attempts,
            queue_name=queue,
            kind=kind,
            lease_owner="w" if leased else None,
            lease_expires_at=now + timedelta(seconds=30) if leased else None,
        )
        paused = (PauseScope.QUEUE, queue) in pauses or (PauseScope.KIND, kind) in pauses
        made[job.id] = derive_status(state, job.run_at, attempts, paused, now)
    assert {j.id: j.status for j in Job.objects.with_status(now)} == made
    for status in JOB_STATUSES:
        got = set(Job.objects.status(status, now).values_list("id", flat=True))
        assert got == {i for i, s in made.items() if s == status}, status
