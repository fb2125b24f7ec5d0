"""Housekeeping over many jobs: prune finished history. (Requeueing in bulk is an
operator action: ``actions.apply_many("requeue", ...)``.)

Prune walks the matching jobs by id in batches, one transaction per batch, so a million
rows neither hold long locks nor need to fit in memory; ``progress(n)`` is called after
each batch with the number just handled.
"""

from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from queue_app.conf import settings
from queue_app.core import validation
from queue_app.exceptions import InvalidJob
from queue_app.models import DeadLetter, Event, Job, JobGroup, State
from queue_app.ops import metrics

# States prune may delete; live jobs (pending, leased) are never pruned.
PRUNABLE = (State.COMPLETED, State.CANCELLED, State.DEAD_LETTER)
PRUNE_DEFAULT = (State.COMPLETED, State.CANCELLED)


def _noop(n):
    pass


def prunable(older_than, states=PRUNE_DEFAULT, now=None):
    """Jobs in ``states`` that finished more than ``older_than`` seconds ago."""
    states = tuple(states or PRUNE_DEFAULT)
    bad = [s for s in states if s not in PRUNABLE]
    if bad:
        raise InvalidJob(f"cannot prune {', '.join(bad)} jobs; choose from {', '.join(PRUNABLE)}", "state")
    older_than = validation.seconds(older_than, "older_than", maximum=3650 * 86400, allow_zero=True)
    cutoff = (now or timezone.now()) - timedelta(seconds=older_than)
    # A workflow stays whole: no member of a group still open (a requeued member re-opens it).
    # (A subquery, not a join: prune locks the rows it reads, and PostgreSQL cannot lock
    # the nullable side of an outer join.)
    whole = Q(group_id__isnull=True) | Q(
        group_id__in=JobGroup.objects.filter(closed_at__isnull=False).values("id")
    )
    return Job.objects.filter(whole, state__in=states, finished_at__lt=cutoff)


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
            # Groups go with their last member.
            JobGroup.objects.filter(closed_at__isnull=False, members__isnull=True).delete()
            return out
        last = candidates[-1]
        with transaction.atomic():
            # Re-checked under lock: a job requeued meanwhile is no longer prunable.
            ids = list(qs.filter(id__in=candidates).select_for_update().values_list("id", flat=True))
            metrics.forget_jobs(ids)
            out.events += Event.objects.filter(job_id__in=ids).delete()[0]
            out.dead_letters += DeadLetter.objects.filter(job_id__in=ids).delete()[0]
            out.jobs += Job.objects.filter(id__in=ids).delete()[1].get(Job._meta.label, 0)
        progress(len(ids))
