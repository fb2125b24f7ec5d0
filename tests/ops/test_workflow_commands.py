"""manage.py group / workflow, and prune keeping open groups whole."""

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from queue_app import enqueue, group
from queue_app.models import Job, JobGroup
from queue_app.ops import maintenance, metrics
from queue_app.worker.execution import run_one

pytestmark = pytest.mark.django_db


def run(*args):
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_group_shows_progress_and_members_and_json():
    g = group(
        [{"kind": "echo"}, {"kind": "boom", "max_attempts": 1}], callback={"kind": "echo"}, name="nightly"
    )
    run_one()
    out = run("group", str(g.id))
    assert f"group {g.id} (nightly): open, 1 of 2 ended (1 completed, 0 dead_letter, 0 cancelled)" in out
    assert "callback: echo, not enqueued yet" in out
    run_one()
    data = json.loads(run("group", str(g.id), "--json"))
    assert data["status"] == "failed" and data["dead_letter"] == 1
    assert [m["id"] for m in data["members"]] == g.job_ids


def test_group_and_workflow_refuse_unknown_ids_with_exit_status_2():
    for command in ("group", "workflow"):
        with pytest.raises(CommandError, match="does not exist") as info:
            run(command, "424242")
        assert info.value.returncode == 2


def test_workflow_shows_what_a_job_waits_for_and_what_waits_for_it():
    a = enqueue("echo")
    b = enqueue("echo", depends_on=[a.id])
    out = run("workflow", str(b.id))
    assert f"job {b.id}: echo, waiting, waiting for 1" in out and f"{a.id}" in out
    assert str(b.id) in run("workflow", str(a.id))


def test_prune_keeps_every_member_of_an_open_group_and_drops_a_closed_group_with_its_members():
    g = group([{"kind": "echo"}, {"kind": "echo"}])
    run_one()
    old = timezone.now() - timedelta(days=30)
    Job.objects.filter(group_id=g.id, state="completed").update(finished_at=old)
    assert maintenance.prune(7 * 86400).jobs == 0
    run_one()
    Job.objects.filter(group_id=g.id).update(finished_at=old)
    assert maintenance.prune(7 * 86400).jobs == 2
    assert not JobGroup.objects.filter(id=g.id).exists()


def test_enqueue_takes_depends_on_and_refuses_unknown_ids_with_exit_status_2():
    a = enqueue("echo")
    out = run(
        "enqueue", "--kind", "echo", "--depends-on", f"{a.id}", "--on-dependency-failure", "hold", "--json"
    )
    job = json.loads(out)["job"]
    assert job["state"] == "waiting"
    assert Job.objects.get(id=job["id"]).depends["policy"] == "hold"
    with pytest.raises(CommandError, match="no job with id 777777") as info:
        run("enqueue", "--kind", "echo", "--depends-on", f"{a.id},777777")
    assert info.value.returncode == 2
    with pytest.raises(CommandError, match="invalid job id"):
        run("enqueue", "--kind", "echo", "--depends-on", "x")
    doc = json.dumps({"kind": "echo", "depends_on": [a.id]})
    assert "enqueued job" in run("enqueue", doc)
    assert Job.objects.filter(state="waiting").count() == 2


def test_waiting_jobs_are_a_metrics_state_and_never_the_oldest_ready_job():
    a = enqueue("echo")
    Job.objects.filter(id=a.id).update(run_at=timezone.now() - timedelta(seconds=5))
    old = timezone.now() - timedelta(hours=2)
    b = enqueue("echo", depends_on=[a.id], run_at=old + timedelta(seconds=1))
    Job.objects.filter(id=b.id).update(run_at=old)
    text = metrics.render().decode()
    assert 'jobqueue_jobs{state="waiting"} 1.0' in text
    assert 'jobqueue_jobs_by_kind{kind="echo",state="waiting"} 1.0' in text
    assert "jobqueue_late_jobs 0.0" in text
    oldest = next(line for line in text.splitlines() if line.startswith("jobqueue_oldest_pending_seconds "))
    assert float(oldest.split()[1]) < 60


def test_enqueue_takes_an_ordering_key_and_history_says_what_the_job_waits_for():
    first = json.loads(run("enqueue", "--kind", "echo", "--ordering-key", "acct:1", "--json"))["job"]
    out = run("enqueue", "--kind", "echo", "--ordering-key", "acct:1", "--ordering-blocks", "--json")
    job = json.loads(out)["job"]
    assert (first["state"], job["state"], job["ordering_key"]) == ("pending", "waiting", "acct:1")
    assert Job.objects.get(id=job["id"]).depends["policy"] == "hold"
    assert f"it waits for job {first['id']}, ahead of it on ordering key 'acct:1'" in run(
        "history", str(job["id"])
    )
    with pytest.raises(CommandError, match="ordering_blocks needs an ordering_key"):
        run("enqueue", "--kind", "echo", "--ordering-blocks")
