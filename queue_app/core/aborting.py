"""Stopping a job: a pending one is cancelled at once, a running one is asked to stop.

How an abort travels (every step survives any process dying):

1. ``transitions.request_abort`` sets ``cancel_requested_at`` on the leased job and
   appends an ``abort_requested`` event. The job stays leased: it is still running.
2. The supervisor whose child runs it looks for abort requests on its children's
   running jobs every ABORT_CHECK_INTERVAL (``requested()``: a primary-key read, only
   while something runs) and flags that thread's cell in shared memory (slots.py).
3. The handler's ``current_job().cancelled()`` turns true (running.py). When the
   handler returns or raises, whatever it was doing, the worker settles the job
   through the ``abort`` edge: cancelled, fenced by lease owner and attempt like
   ``complete``.
4. A handler that never looks (a busy loop, a C call) is still running
   ABORT_GRACE_SECONDS after step 2: the supervisor SIGKILLs its child, cancels the
   job and forks a replacement, as it does for a timeout. Other jobs that child was
   running fail as in a crash and retry.

A job whose worker dies before step 3 or 4 is cancelled by lease recovery, and one
given back unstarted (shutdown) is cancelled by ``release``: neither runs again.
A handler that returns before its flag is set completes normally: the work is done.
"""

from django.db import router, transaction

from queue_app.core import transitions
from queue_app.models import Job, State


def cancel(job_id, *, actor="", reason="", using=None):
    """Cancel a pending job, or ask the worker running a leased one to abort it; return
    the job. Raise JobNotFound, or InvalidTransition when it has already finished."""
    db = using or router.db_for_write(Job)
    with transaction.atomic(using=db):
        # Locked so that a claim cannot slip between reading the state and the edge.
        locked = Job.objects.using(db).select_for_update().filter(id=job_id)
        state = locked.values_list("state", flat=True).first()
        if state == State.LEASED:
            return transitions.request_abort(job_id, actor=actor, reason=reason, using=db)
        return transitions.cancel(job_id, actor=actor, reason=reason, using=db)


def requested(job_ids, *, using=None):
    """Of ``job_ids``, those still leased whose abort was requested."""
    if not job_ids:
        return []
    return list(
        Job.objects.using(using or router.db_for_read(Job))
        .filter(id__in=list(job_ids), state=State.LEASED, cancel_requested_at__isnull=False)
        .values_list("id", flat=True)
    )


def describe(job):
    """One line for an operator: what cancelling ``job`` did."""
    if job.state == State.LEASED:
        return f"abort requested for job {job.id} ({job.kind}); its worker stops it and it ends cancelled"
    return f"cancelled job {job.id} ({job.kind})"
