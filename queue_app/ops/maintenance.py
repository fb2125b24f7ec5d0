"""Housekeeping over many jobs: prune finished history. (Requeueing in bulk is an
operator action: ``actions.apply_many("requeue", ...)``.)

Prune walks the matching jobs by id in batches, one transaction per batch, so a million
rows neither hold long locks nor need to fit in memory; ``progress(n)`` is called after
each batch with the number just handled.
"""

from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from queue_app.conf import settings
from queue_app.core import validation
from queue_app.exceptions import InvalidJob
from queue_app.models import DeadLetter, Dependency, Event, Job, JobGroup, State
from queue_app.ops import metrics

# States prune may delete; live jobs (pending, leased) are never pruned.
PRUNABLE = (State.COMPLETED, State.CANCELLED, State.DEAD_LETTER)
PRUNE_DEFAULT = (State.COMPLETED, State.CANCELLED)


def _noop(n):
    pass


def prunable(older_than, states=PRUNE_DEFAULT, now=None):
    """Jobs in ``states`` that finished more than ``older_than`` seconds ago, less what
    would break a workflow: a job a waiting job still depends on, and a group member
    unless its group is closed and every member is prunable too (the group goes whole)."""
    states = tuple(states or PRUNE_DEFAULT)
    bad = [s for s in states if s not in PRUNABLE]
    if bad:
        raise InvalidJob(f"cannot prune {', '.join(bad)} jobs; choose from {', '.join(PRUNABLE)}", "state")
    older_than = validation.seconds(older_than, "older_than", maximum=3650 * 86400, allow_zero=True)
    cutoff = (now or timezone.now()) - timedelta(seconds=older_than)
    # Its waiting dependents (held ones too) would lose the dependency, and with it the
    # result they are to be passed.
    waited_on = Dependency.objects.filter(job__state=State.WAITING).values("upstream_id")
    old = Q(state__in=states, finished_at__lt=cutoff) & ~Q(id__in=waited_on)
    # A group whose members are not all old enough keeps them all, so a group is never
    # seen half pruned; an open one (a requeued member re-opens it) keeps them as well.
    # (Subqueries, not joins: prune locks the rows it reads, and PostgreSQL cannot lock
    # the nullable side of an outer join.)
    kept = Job.objects.filter(group_id__isnull=False).exclude(old).values("group_id")
    whole = Q(group_id__isnull=True) | Q(
        group_id__in=JobGroup.objects.filter(closed_at__isnull=False).exclude(id__in=kept).values("id")
    )
    return Job.objects.filter(whole, old)


def _whole_batch(qs, candidates):
    """Lock and return (job ids, group ids) to delete in one batch: the candidates still
    prunable, and with a group member its whole group (members a later batch would have
    reached), a group only if every member is still prunable under the lock."""
    groups = set(
        Job.objects.filter(id__in=candidates, group_id__isnull=False).values_list("group_id", flat=True)
    )
    members = list(Job.objects.filter(group_id__in=groups).values_list("id", flat=True)) if groups else []
    # Re-checked under lock: a job requeued (or depended on) meanwhile is no longer
    # prunable, and a group with one such member is kept whole.
    locked = list(
        qs.filter(id__in=[*candidates, *members])
        .select_for_update()
        .order_by("id")
        .values_list("id", "group_id")
    )
    if groups:
        sizes = dict(
            Job.objects.filter(group_id__in=groups).order_by().values_list("group_id").annotate(n=Count("id"))
        )
        prunable_members = Counter(group_id for _, group_id in locked if group_id is not None)
        groups = {g for g in groups if prunable_members[g] == sizes.get(g)}
    return [job_id for job_id, group_id in locked if group_id is None or group_id in groups], groups


@dataclass
class Pruned:
    jobs: int = 0
    events: int = 0
    dead_letters: int = 0


def prune(older_than, states=PRUNE_DEFAULT, *, batch_size=None, dry_run=False, progress=_noop, now=None):
    """Delete old finished jobs with their events and dead letters; return the counts.

    Dead-lettered jobs are kept unless ``states`` names dead_letter. With ``dry_run``
    nothing is deleted and the counts say what would be.
    """
    qs = prunable(older_than, states, now)
    batch_size = batch_size or settings.PRUNE_BATCH_SIZE
    ids_qs = qs.order_by("id").values_list("id", flat=True)
    out = Pruned()
    if dry_run:
        out.jobs = qs.count()
        out.events = Event.objects.filter(job__in=qs).count()
        out.dead_letters = DeadLetter.objects.filter(job__in=qs).count()
        return out
    # The metrics' event counters must see every event before it is deleted.
    while metrics.fold_events() >= settings.METRICS_FOLD_BATCH:
        pass
    last = 0
    while True:
        candidates = list(ids_qs.filter(id__gt=last)[:batch_size])
        if not candidates:
            # Groups whose members went another way (an operator deleted them).
            JobGroup.objects.filter(closed_at__isnull=False, members__isnull=True).delete()
            return out
        last = candidates[-1]
        with transaction.atomic():
            ids, groups = _whole_batch(qs, candidates)
            metrics.forget_jobs(ids)
            out.events += Event.objects.filter(job_id__in=ids).delete()[0]
            out.dead_letters += DeadLetter.objects.filter(job_id__in=ids).delete()[0]
            out.jobs += Job.objects.filter(id__in=ids).delete()[1].get(Job._meta.label, 0)
            JobGroup.objects.filter(id__in=groups).delete()
        progress(len(ids))
