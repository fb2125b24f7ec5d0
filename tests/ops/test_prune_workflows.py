"""prune keeps a workflow whole: a group goes with all its members in one transaction or
not at all, never while open, and no job a waiting job depends on goes (maintenance.py)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from queue_app import enqueue, group
from queue_app.core import transitions
from queue_app.models import Event, Job, JobGroup, State
from queue_app.ops import maintenance
from queue_app.worker.execution import run_one

pytestmark = pytest.mark.django_db

WEEK = 7 * 86400


def drain():
    while run_one() is not None:
        pass


def age(*jobs, days=30):
    Job.objects.filter(id__in=[getattr(j, "id", j) for j in jobs]).update(
        finished_at=timezone.now() - timedelta(days=days)
    )


def exists(*jobs):
    return [Job.objects.filter(id=getattr(j, "id", j)).exists() for j in jobs]


def test_a_closed_group_is_kept_until_every_member_is_old_then_goes_whole_in_one_batch():
    g = group([{"kind": "echo"} for _ in range(3)])
    drain()
    age(*g.job_ids[:2])
    age(g.job_ids[2], days=1)
    assert maintenance.prunable(WEEK).count() == 0
    assert maintenance.prune(WEEK).jobs == 0
    assert exists(*g.job_ids) == [True] * 3 and JobGroup.objects.filter(id=g.id).exists()
    age(g.job_ids[2])
    batches = []
    # Batches of one job: the first member brings its whole group into its transaction.
    out = maintenance.prune(WEEK, batch_size=1, progress=batches.append)
    assert out.jobs == 3 and batches == [3]
    assert not JobGroup.objects.filter(id=g.id).exists()
    assert not Event.objects.filter(job_id__in=g.job_ids).exists()


def test_a_group_with_a_member_in_a_state_not_pruned_is_kept_whole():
    g = group([{"kind": "echo"}, {"kind": "boom", "max_attempts": 1}], policy="always")
    drain()
    age(*g.job_ids)
    assert maintenance.prune(WEEK, dry_run=True).jobs == 0
    assert maintenance.prune(WEEK).jobs == 0
    assert exists(*g.job_ids) == [True, True]
    assert maintenance.prune(WEEK, [State.COMPLETED, State.DEAD_LETTER]).jobs == 2
    assert not JobGroup.objects.filter(id=g.id).exists()


def test_an_open_group_keeps_its_old_members_and_a_requeue_reopens_a_closed_one():
    g = group([{"kind": "echo"}, {"kind": "echo"}], policy="always")
    run_one()
    age(g.job_ids[0])
    assert maintenance.prune(WEEK).jobs == 0
    transitions.cancel(g.job_ids[1])
    age(*g.job_ids)
    transitions.requeue(g.job_ids[1])  # open again, its member pending
    assert maintenance.prune(WEEK).jobs == 0
    assert exists(*g.job_ids) == [True, True]


def test_a_job_a_waiting_job_depends_on_is_kept_until_nothing_waits_on_it():
    a = enqueue("echo")
    c = enqueue("echo", run_after=3600)
    b = enqueue("echo", depends_on=[a.id, c.id])
    run_one()  # a completes; b still waits for c
    age(a)
    assert maintenance.prune(WEEK).jobs == 0 and exists(a) == [True]
    transitions.retry_now(c.id)
    drain()
    age(a, b, c)
    assert maintenance.prune(WEEK).jobs == 3


def test_a_dead_job_a_held_dependent_waits_on_is_kept_so_its_requeue_can_revive_it():
    a = enqueue("boom", max_attempts=1)
    b = enqueue("echo", depends_on=[a.id], on_dependency_failure="hold")
    drain()
    age(a)
    assert maintenance.prune(WEEK, [State.DEAD_LETTER]).jobs == 0 and exists(a) == [True]
    transitions.cancel(b.id)
    age(a, b)
    assert maintenance.prune(WEEK, [State.DEAD_LETTER, State.CANCELLED]).jobs == 2


def test_a_member_requeued_after_its_batch_was_chosen_keeps_its_group_whole():
    g = group([{"kind": "echo"}, {"kind": "echo"}], policy="always")
    run_one()
    transitions.cancel(g.job_ids[1])
    age(*g.job_ids)
    qs = maintenance.prunable(WEEK)
    candidates = list(qs.values_list("id", flat=True))
    assert sorted(candidates) == sorted(g.job_ids)
    transitions.requeue(g.job_ids[1])  # between choosing the batch and locking it
    assert maintenance._whole_batch(qs, candidates) == ([], set())
