"""seed: three idempotent jobs per sample workload; twice adds nothing; they run."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from queue_app.models import Job, State
from queue_app.ops import fixtures, samples
from queue_app.worker.execution import run_one

pytestmark = pytest.mark.django_db


def seed(*args):
    out = StringIO()
    call_command("seed", *args, stdout=out)
    return out.getvalue()


def test_seed_loads_three_jobs_per_workload_and_twice_adds_nothing():
    assert "seeded 15 new jobs; 0 were already there" in seed()
    assert "seeded 0 new jobs; 15 were already there" in seed()
    counts = {k: Job.objects.filter(kind=k).count() for k in fixtures.PAYLOADS}
    assert counts == {"email": 3, "report": 3, "webhook": 3, "flaky": 3, "slow": 3}


def test_seed_with_kind_and_count():
    seed("--kind", "webhook", "--count", "5")
    assert Job.objects.filter(kind="webhook").count() == 5 and Job.objects.count() == 5


def test_seed_refuses_an_unknown_workload_and_writes_nothing():
    with pytest.raises(CommandError, match="no sample workload nope") as err:
        seed("--kind", "email", "--kind", "nope")
    assert err.value.returncode == 2
    assert not Job.objects.exists()


def test_seeded_jobs_run_with_the_sample_handlers():
    samples.register()
    seed("--kind", "email", "--kind", "webhook", "--kind", "report", "--count", "1")
    ran = []
    while (job := run_one(worker_id="w")) is not None:
        assert job.state == State.COMPLETED, job.last_error
        ran.append(job.kind)
    assert sorted(ran) == ["email", "report", "webhook"]
    assert Job.objects.get(kind="webhook").result["delivered"] is False


def test_shell_sample_refuses_to_run_unless_enabled(settings):
    with pytest.raises(PermissionError):
        samples.shell({"command": "echo hi"})
    settings.JOBQUEUE = {**settings.JOBQUEUE, "SHELL_JOBS": True}
    assert samples.shell({"command": "echo hi"})["stdout"] == "hi\n"
