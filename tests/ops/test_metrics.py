from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from queue_app import enqueue
from queue_app.conf import settings as queue_settings
from queue_app.core import transitions
from queue_app.models import (
    JOB_STATUSES,
    Event,
    EventType,
    Job,
    MetricsCheckpoint,
    State,
    Worker,
    WorkerState,
)
from queue_app.ops import metrics
from tests.factories import DeadLetterFactory, EventFactory, JobFactory, WorkerFactory

pytestmark = pytest.mark.django_db

FAMILIES = [
    "jobqueue_jobs",
    "jobqueue_jobs_by_status",
    "jobqueue_late_jobs",
    "jobqueue_jobs_by_kind",
    "jobqueue_jobs_by_queue",
    "jobqueue_events",
    "jobqueue_oldest_pending_seconds",
    "jobqueue_oldest_ready_seconds",
    "jobqueue_held_jobs",
    "jobqueue_job_duration_seconds",
    "jobqueue_job_wait_seconds",
    "jobqueue_workers",
    "jobqueue_dead_letters",
    "jobqueue_job_crashes",
    "jobqueue_poison_jobs",
    "jobqueue_db_reconnects",
]


def scrape(client=None, **headers):
    if client is not None:
        response = client.get("/metrics", headers=headers)
        assert response.status_code == 200, response.content
        text = response.content.decode()
    else:
        text = metrics.render().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families, family, sample_name=None, **labels):
    for s in families[family].samples:
        if (sample_name is None or s.name == sample_name) and all(
            s.labels.get(k) == v for k, v in labels.items()
        ):
            return s.value
    raise AssertionError(f"no sample {family} {labels}")


def test_an_empty_queue_exports_every_family_with_explicit_zeros(client):
    fams = scrape(client)
    assert list(fams) == FAMILIES
    for state in State.values:
        assert value(fams, "jobqueue_jobs", state=state) == 0
        assert value(fams, "jobqueue_jobs_by_queue", queue="default", state=state) == 0
        assert value(fams, "jobqueue_jobs_by_kind", kind="echo", state=state) == 0
    for type_ in EventType.values:
        assert value(fams, "jobqueue_events", "jobqueue_events_total", type=type_) == 0
    for state in ("running", "stopping", "stopped", "lost"):
        assert value(fams, "jobqueue_workers", state=state) == 0
    for status in JOB_STATUSES:
        assert value(fams, "jobqueue_jobs_by_status", status=status) == 0
    assert value(fams, "jobqueue_late_jobs") == 0
    assert value(fams, "jobqueue_oldest_pending_seconds") == 0
    assert value(fams, "jobqueue_dead_letters") == 0
    assert value(fams, "jobqueue_db_reconnects", "jobqueue_db_reconnects_total") == 0
    assert (
        value(fams, "jobqueue_job_duration_seconds", "jobqueue_job_duration_seconds_count", kind="echo") == 0
    )


def test_job_gauges_count_by_state_kind_and_queue():
    JobFactory.create_batch(3, kind="echo")
    JobFactory(kind="add", queue_name="mail", leased=True)
    DeadLetterFactory(job__kind="boom")
    fams = scrape()
    assert value(fams, "jobqueue_jobs", state="pending") == 3
    assert value(fams, "jobqueue_jobs", state="leased") == 1
    assert value(fams, "jobqueue_jobs", state="dead_letter") == 1
    assert value(fams, "jobqueue_jobs_by_kind", kind="echo", state="pending") == 3
    assert value(fams, "jobqueue_jobs_by_kind", kind="add", state="leased") == 1
    assert value(fams, "jobqueue_jobs_by_queue", queue="mail", state="leased") == 1
    assert value(fams, "jobqueue_jobs_by_queue", queue="mail", state="completed") == 0
    assert value(fams, "jobqueue_dead_letters") == 1


def test_db_reconnects_total_sums_the_outages_every_worker_waited_out_stopped_ones_too():
    WorkerFactory(db_reconnects=2)
    WorkerFactory(db_reconnects=3, state=WorkerState.STOPPED)
    assert value(scrape(), "jobqueue_db_reconnects", "jobqueue_db_reconnects_total") == 5


def test_oldest_pending_seconds_measures_the_oldest_ready_job():
    JobFactory(run_at=timezone.now() - timedelta(seconds=120))
    JobFactory(scheduled=True)
    assert 119 <= value(scrape(), "jobqueue_oldest_pending_seconds") < 180


def test_event_totals_follow_transitions_and_survive_prune():
    job = enqueue("echo", {"x": 1})
    enqueue("echo", {"x": 2})
    transitions.cancel(job.id)
    fams = scrape()
    assert value(fams, "jobqueue_events", "jobqueue_events_total", type="enqueued") == 2
    assert value(fams, "jobqueue_events", "jobqueue_events_total", type="cancelled") == 1
    Event.objects.all().delete()  # what prune does to old history
    fams = scrape()
    assert value(fams, "jobqueue_events", "jobqueue_events_total", type="enqueued") == 2


def test_folding_twice_never_counts_an_event_twice():
    EventFactory.create_batch(4, type="enqueued")
    assert metrics.fold_events() == 4
    assert metrics.fold_events() == 0
    assert value(scrape(), "jobqueue_events", "jobqueue_events_total", type="enqueued") == 4


def test_the_first_fold_takes_no_hole_below_its_first_event_for_a_gap():
    """Ids below the first event a first fold sees are history (earlier rollbacks, or
    prune), not transactions in flight, even when the event ids are past a fold batch
    (the old part is then counted in bulk): nothing waits to be counted for them."""
    first = EventFactory(type="enqueued")
    ahead = first.id + 3 * queue_settings.METRICS_FOLD_BATCH
    if connection.vendor == "postgresql":  # push the next ids past a whole fold batch
        with connection.cursor() as cursor:
            cursor.execute("SELECT setval(pg_get_serial_sequence('queue_app_event', 'id'), %s)", [ahead])
    else:  # MariaDB's AUTO_INCREMENT follows an explicit id (SQLite's rowid falls back)
        Event.objects.filter(id=EventFactory(id=ahead, job=first.job).id).delete()
    Event.objects.filter(id=first.id).delete()
    later = EventFactory.create_batch(2, type="enqueued")
    if connection.vendor != "sqlite":  # SQLite reuses max(rowid) + 1: no hole to skip
        assert later[0].id > first.id + 2 * queue_settings.METRICS_FOLD_BATCH
    assert metrics.fold_events() == 2
    assert MetricsCheckpoint.objects.get().gaps == {}


def test_an_event_committed_after_the_checkpoint_passed_its_id_is_still_counted():
    events = EventFactory.create_batch(3, type="enqueued")
    late = events[1]
    Event.objects.filter(id=late.id).delete()  # as if its transaction had not committed yet
    assert metrics.fold_events() == 2
    assert str(late.id) in MetricsCheckpoint.objects.get().gaps
    Event.objects.create(id=late.id, job=late.job, type="claimed")
    assert metrics.fold_events() == 1
    assert MetricsCheckpoint.objects.get().gaps == {}
    fams = scrape()
    assert value(fams, "jobqueue_events", "jobqueue_events_total", type="claimed") == 1


def test_a_gap_that_never_fills_expires():
    events = EventFactory.create_batch(3, type="enqueued")
    Event.objects.filter(id=events[1].id).delete()
    metrics.fold_events()
    metrics.fold_events(now=timezone.now() + timedelta(hours=1))
    assert MetricsCheckpoint.objects.get().gaps == {}


def test_completed_attempts_fill_the_duration_histogram():
    job = enqueue("echo", {})
    [claimed] = transitions.claim("w1")
    transitions.complete(claimed.id, worker_id="w1", attempt=claimed.attempts)
    fams = scrape()
    name = "jobqueue_job_duration_seconds"
    assert value(fams, name, f"{name}_count", kind="echo") == 1
    assert value(fams, name, f"{name}_bucket", kind="echo", le="+Inf") == 1
    assert value(fams, name, f"{name}_bucket", kind="echo", le="1800.0") == 1
    assert job.id == claimed.id


def test_kinds_past_the_cap_are_reported_as_other(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "METRICS_MAX_KINDS": 1}
    for kind in ("zeta.a", "zeta.b", "zeta.c"):
        JobFactory(kind=kind)
    fams = scrape()
    kinds = {s.labels["kind"] for s in fams["jobqueue_jobs_by_kind"].samples}
    assert "_other" in kinds
    assert kinds.isdisjoint({"zeta.a", "zeta.b", "zeta.c"})
    assert len(kinds) == 2  # one registered kind, kept first, and _other
    assert sum(s.value for s in fams["jobqueue_jobs_by_kind"].samples) == 3


def test_workers_with_a_stale_heartbeat_are_lost():
    now = timezone.now()
    Worker.objects.create(name="a", host="h", pid=1, last_heartbeat=now)
    Worker.objects.create(name="b", host="h", pid=2, last_heartbeat=now - timedelta(hours=1))
    Worker.objects.create(name="c", host="h", pid=3, state=WorkerState.STOPPED)
    fams = scrape()
    assert value(fams, "jobqueue_workers", state="running") == 1
    assert value(fams, "jobqueue_workers", state="lost") == 1
    assert value(fams, "jobqueue_workers", state="stopped") == 1


def test_metrics_view_refuses_other_hosts_without_a_token(client):
    assert client.get("/metrics", REMOTE_ADDR="203.0.113.5").status_code == 401
    assert client.get("/metrics").status_code == 200  # the test client is 127.0.0.1


def test_metrics_view_with_a_token_needs_it_even_on_loopback(client, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "METRICS_TOKEN": "s3cret"}
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer nope"}).status_code == 401
    fams = scrape(client, Authorization="Bearer s3cret")
    assert "jobqueue_jobs" in fams
    assert client.get("/metrics", headers={"Authorization": "Basic cHJvbTpzM2NyZXQ="}).status_code == 200


def test_metrics_command_once_prints_a_parseable_scrape(capsys):
    JobFactory()
    call_command("metrics", "--once")
    fams = {f.name: f for f in text_string_to_metric_families(capsys.readouterr().out)}
    assert list(fams) == FAMILIES
    assert value(fams, "jobqueue_jobs", state="pending") == 1


def test_metrics_command_refuses_a_bad_address():
    from django.core.management import CommandError

    with pytest.raises(CommandError, match="is not HOST:PORT"):
        call_command("metrics", "--addr", "nonsense")


def test_the_standalone_server_serves_the_same_exposition():
    from wsgiref.util import setup_testing_defaults

    from queue_app.web import metrics_http

    environ = {"REMOTE_ADDR": "127.0.0.1"}
    setup_testing_defaults(environ)
    out = {}
    body = b"".join(metrics_http.wsgi_app(environ, lambda status, headers: out.update(status=status)))
    assert out["status"] == "200 OK"
    assert "jobqueue_dead_letters" in {f.name for f in text_string_to_metric_families(body.decode())}


def test_a_loopback_request_a_proxy_forwarded_is_not_treated_as_local(client):
    # A reverse proxy on this host connects from 127.0.0.1 for whoever called it.
    assert client.get("/metrics", headers={"X-Forwarded-For": "203.0.113.5"}).status_code == 401
    assert client.get("/metrics", headers={"Forwarded": "for=203.0.113.5"}).status_code == 401
    assert client.get("/metrics").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_the_standalone_server_still_answers_while_a_client_holds_a_connection_idle():
    import socket
    import urllib.request

    from tests.worker_support import manage, wait_for

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = manage("metrics", "--addr", f"127.0.0.1:{port}")
    url = f"http://127.0.0.1:{port}/metrics"

    def answers():
        try:
            return urllib.request.urlopen(url, timeout=1).status == 200
        except OSError:
            return False

    try:
        wait_for(answers, timeout=30, what="manage.py metrics to serve")
        # One client connects and sends nothing; another scrapes.
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5),
            urllib.request.urlopen(url, timeout=5) as r,
        ):
            assert r.status == 200
            assert b"jobqueue_jobs" in r.read()
    finally:
        proc.terminate()
        proc.wait(10)


def test_run_and_wait_histograms_are_per_kind_and_queue_with_bounds_from_settings(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "METRICS_WAIT_BUCKETS": (1.0, 100.0)}
    enqueue("echo", {}, queue_name="mail")
    Job.objects.update(run_at=timezone.now() - timedelta(seconds=30))  # ready for 30 s
    [job] = transitions.claim("w1")
    transitions.complete(job.id, worker_id="w1", attempt=job.attempts)
    fams = scrape()
    wait = "jobqueue_job_wait_seconds"
    assert value(fams, wait, f"{wait}_count", kind="echo", queue="mail") == 1
    assert value(fams, wait, f"{wait}_bucket", kind="echo", queue="mail", le="1.0") == 0
    assert value(fams, wait, f"{wait}_bucket", kind="echo", queue="mail", le="100.0") == 1
    assert 30 <= value(fams, wait, f"{wait}_sum", kind="echo", queue="mail") < 90
    assert {s.labels["le"] for s in fams[wait].samples if s.name.endswith("_bucket")} == {
        "1.0",
        "100.0",
        "+Inf",
    }
    run = "jobqueue_job_duration_seconds"
    assert value(fams, run, f"{run}_count", kind="echo", queue="mail") == 1
    assert value(fams, run, f"{run}_count", kind="echo", queue="default") == 0


def test_oldest_ready_job_per_queue_leaves_paused_queues_out():
    from queue_app.core import flow

    JobFactory(queue_name="mail", run_at=timezone.now() - timedelta(seconds=300))
    JobFactory(queue_name="reports", run_at=timezone.now() - timedelta(seconds=60))
    JobFactory(queue_name="reports", scheduled=True)
    JobFactory(queue_name="held", run_at=timezone.now() - timedelta(seconds=900))
    flow.pause(queue="held")
    JobFactory(queue_name="mail", kind="add", run_at=timezone.now() - timedelta(seconds=2000))
    flow.pause(kind="add")  # held, not waiting: not mail's oldest
    fams = scrape()
    assert 300 <= value(fams, "jobqueue_oldest_ready_seconds", queue="mail") < 360
    assert 60 <= value(fams, "jobqueue_oldest_ready_seconds", queue="reports") < 120
    assert value(fams, "jobqueue_oldest_ready_seconds", queue="default") == 0
    assert "held" not in {s.labels["queue"] for s in fams["jobqueue_oldest_ready_seconds"].samples}


def test_jobs_held_by_pauses_limits_and_dependencies_are_their_own_series():
    from queue_app.core import flow

    JobFactory.create_batch(2, queue_name="held")
    flow.pause(queue="held")
    JobFactory(kind="add", leased=True)
    JobFactory.create_batch(3, kind="add")
    flow.set_limit("add", concurrency=1)
    upstream = enqueue("echo", {})
    enqueue("echo", {}, depends_on=[upstream.id])
    fams = scrape()
    assert value(fams, "jobqueue_held_jobs", reason="pause") == 2
    assert value(fams, "jobqueue_held_jobs", reason="limit") == 3
    assert value(fams, "jobqueue_held_jobs", reason="dependencies") == 1
    flow.set_limit("add", concurrency=2)
    assert value(scrape(), "jobqueue_held_jobs", reason="limit") == 0
