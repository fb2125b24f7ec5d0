"""The worker registry: runworker supervisors register, heartbeat and deregister here,
and `stopworkers` writes it from any host; what `workers` and the dashboard show of it
(a worker's status, lost included) is ``Worker.status`` and ``ops.reads``.

A stop request is a timestamp on the row, not a signal: it works across hosts, and a
worker sees it on its next heartbeat. A quiet request is another (stop leasing, keep
running what is in hand, stay up until stopped), seen at the same check.
"""

import socket

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from queue_app.core import transitions
from queue_app.models import LOST, Job, Worker, WorkerState


class NameInUse(Exception):
    pass


def register(name, *, pid, queues, kinds, concurrency, threads):
    """Record a starting worker and return its row.

    A name may be reused once its previous holder has stopped or been lost; a live
    worker's name is refused (NameInUse). A stopped run killed its children, so what its
    children still hold (left by a second signal, or given up on) is recovered here, in
    the same transaction, rather than left to lapse; a lost one's leases lapse as usual,
    since it may still be running.
    """
    if "/" in name:
        # "/" ends the name in lease owner ids (owner_prefix): "a/b" would pass for a run of "a".
        raise NameInUse(f"worker name {name!r} may not contain '/'")
    now = timezone.now()
    fields = {
        "host": socket.gethostname(),
        "pid": pid,
        "queues": list(queues or []),
        "kinds": list(kinds or []),
        "concurrency": concurrency,
        "threads": threads,
        "state": WorkerState.RUNNING,
        "started_at": now,
        "last_heartbeat": now,
        "stopped_at": None,
        "stop_requested_at": None,
        "quiet_requested_at": None,
        "jobs_in_hand": 0,
        "running_threads": {},
        "jobs_done": 0,
    }
    with transaction.atomic():
        old = Worker.objects.select_for_update().filter(name=name).first()
        if old is None:
            return Worker.objects.create(name=name, **fields)
        # The one lost rule (Worker.status): a name is free once its holder's leases lapsed.
        previous = old.status
        if previous not in (WorkerState.STOPPED, LOST):
            raise NameInUse(f"a worker named {name!r} is already running (pid {old.pid} on {old.host})")
        if previous == WorkerState.STOPPED:
            while transitions.recover(owned_by=f"{name}/", now=now):
                pass
        for key, value in fields.items():
            setattr(old, key, value)
        old.save()
        return old


def heartbeat(worker_id, *, jobs_in_hand=0, jobs_done=0, db_reconnects=0, running_threads=None):
    """Stamp the worker's heartbeat (and, given {job_id: thread}, what its threads run)."""
    Worker.objects.filter(id=worker_id).update(
        last_heartbeat=timezone.now(),
        jobs_in_hand=jobs_in_hand,
        jobs_done=jobs_done,
        db_reconnects=db_reconnects,
        running_threads={str(job_id): thread for job_id, thread in (running_threads or {}).items()},
    )


STOP, QUIET = "stop", "quiet"


def stop_requested(worker_id):
    return Worker.objects.filter(id=worker_id, stop_requested_at__isnull=False).exists()


def requested(worker_id):
    """What the worker has been asked to do: STOP, QUIET or None (stop wins over quiet)."""
    asked = Worker.objects.filter(id=worker_id).values_list("stop_requested_at", "quiet_requested_at").first()
    if asked is None:
        return None
    stop, quiet = asked
    return STOP if stop is not None else QUIET if quiet is not None else None


def mark_stopping(worker_id):
    Worker.objects.filter(id=worker_id).update(state=WorkerState.STOPPING, last_heartbeat=timezone.now())


def mark_quiet(worker_id):
    Worker.objects.filter(id=worker_id, state=WorkerState.RUNNING).update(
        state=WorkerState.QUIET, last_heartbeat=timezone.now()
    )


def deregister(worker_id, *, jobs_done=0, db_reconnects=0):
    now = timezone.now()
    Worker.objects.filter(id=worker_id).update(
        state=WorkerState.STOPPED,
        stopped_at=now,
        last_heartbeat=now,
        jobs_in_hand=0,
        running_threads={},
        jobs_done=jobs_done,
        db_reconnects=db_reconnects,
    )


def _named(alive, names):
    if names:
        found = set(alive.filter(name__in=names).values_list("name", flat=True))
        missing = [n for n in names if n not in found]
        if missing:
            raise LookupError(f"no running worker named {', '.join(missing)}")
        alive = alive.filter(name__in=names)
    return alive


def request_stop(names=None):
    """Ask running workers (all, or those named) to stop; return the names asked.

    Unknown names raise LookupError before anything is written.
    """
    alive = _named(Worker.objects.alive(), names)
    asked = sorted(alive.values_list("name", flat=True))
    alive.filter(stop_requested_at__isnull=True).update(stop_requested_at=timezone.now())
    return asked


def request_quiet(names=None):
    """Ask running workers (all, or those named) to go quiet; return the names asked.

    A worker already stopping is not asked (it leases no more anyway). Unknown names
    raise LookupError before anything is written.
    """
    alive = _named(Worker.objects.alive(), names).filter(stop_requested_at__isnull=True)
    asked = sorted(alive.values_list("name", flat=True))
    alive.filter(quiet_requested_at__isnull=True).update(quiet_requested_at=timezone.now())
    return asked


def owner_prefix(name, token):
    """The start of every lease owner id of one run of worker ``name``: a run's own
    ``token`` keeps a later run under the same name from taking its leases for its own."""
    return f"{name}/{token}/"


def owners_filter(prefix):
    """Match the lease_owner of every child process under ``prefix`` (owner_prefix(), or
    ``<name>/`` for every run of a name)."""
    return Q(lease_owner__startswith=prefix)


def leased_by(prefix):
    """Ids and attempts of the jobs leased under ``prefix`` (owners_filter()), by owner."""
    out = {}
    for job_id, owner, attempt in (
        Job.objects.leased().filter(owners_filter(prefix)).values_list("id", "lease_owner", "attempts")
    ):
        out.setdefault(owner, []).append((job_id, attempt))
    return out
