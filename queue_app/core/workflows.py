"""Workflows' bookkeeping: groups with a callback (fan-out / fan-in) and dependencies
between jobs. canvas.py is how callers build them; this module is what the terminal
transitions call, inside their own transaction, when a job that is part of one ends.

Groups. A JobGroup counts its members' ends (completed, dead, cancelled). Each member's
terminal transition (complete, complete_many, fail to dead_letter, recover, cancel,
abort) calls ``member_ended`` in its transaction: an UPDATE adds one to the counter,
which takes the group row's lock, and the row is then read again under that lock, so
members ending at the same instant on two hosts are counted one after the other and
exactly one of them sees the count that decides the callback. That one also sets
``fired_at`` (a conditional UPDATE: only while empty): any later decision, on any host
or from a member cancelled by this very decision, finds it set and enqueues nothing.
A requeued member (dead letter or cancel) re-opens the group (``member_reopened``); the
callback still runs at most once.

Dependencies. A job enqueued with ``depends_on`` is ``waiting`` with ``waiting_for`` =
its dependencies that have not ended. Each dependency has ``in_workflow`` set (its end
goes the long way) and a Dependency row. When it ends, ``job_ended`` takes one off each
waiting dependent's count (the same UPDATE-then-locked-read), and says which dependents
go to pending (the last dependency ended), which are cancelled or held (a dependency
failed, by the dependent's policy); the transition carries that out.

Failed means dead-lettered or cancelled; a job that will still be retried has not ended.
"""

import dataclasses
import logging

from django.db import connections
from django.db.models import F

from queue_app.core import validation
from queue_app.exceptions import InvalidJob
from queue_app.models import Dependency, GroupPolicy, Job, JobGroup, State

log = logging.getLogger("queue_app")

ENDED = (State.COMPLETED, State.DEAD_LETTER, State.CANCELLED)
# The counter of each end (JobGroup fields).
_COUNTER = {State.COMPLETED: "completed", State.DEAD_LETTER: "dead", State.CANCELLED: "cancelled"}

CANCEL, RUN, HOLD = validation.DEPENDENCY_POLICIES


@dataclasses.dataclass
class Plan:
    """What a job's end asks the transition to do, in its transaction."""

    # Jobs to cancel: pending members after a first failure, dependents by their policy.
    cancel: list = dataclasses.field(default_factory=list)
    # Waiting jobs whose last dependency ended: to pending.
    wake: list = dataclasses.field(default_factory=list)
    # Waiting jobs a failed dependency holds for an operator.
    hold: list = dataclasses.field(default_factory=list)
    # The group whose callback this end decided to run.
    fire: JobGroup | None = None
    # For the job's terminal event.
    meta: dict = dataclasses.field(default_factory=dict)


def _failed(state):
    return state in (State.DEAD_LETTER, State.CANCELLED)


def job_ended(db, job, state, now):
    """Count ``job``'s end (``state``) in its group and its dependents; return a Plan."""
    plan = Plan()
    if job.group_id is not None:
        _count_member(db, job, state, now, plan)
    _count_dependents(db, job, state, plan)
    return plan


def _count_member(db, job, state, now, plan):
    counter = _COUNTER[str(state)]
    groups = JobGroup.objects.using(db)
    # The UPDATE first: it takes the row's lock (on SQLite, the database's write lock),
    # so the read below sees every other member's end that committed before ours.
    groups.filter(id=job.group_id).update(**{counter: F(counter) + 1})
    group = groups.select_for_update().get(id=job.group_id)
    plan.meta["group"] = group.id
    done = group.ended >= group.total
    if done and group.closed_at is None:
        groups.filter(id=group.id).update(closed_at=now)
        group.closed_at = now
    if group.fired_at is not None:
        return
    success = group.completed == group.total
    if group.policy == GroupPolicy.SUCCESS:
        fire = success
    elif group.policy == GroupPolicy.ALWAYS:
        fire = done
    else:
        fire = success or _failed(state)
    if not fire:
        return
    if group.callback is None or not groups.filter(id=group.id, fired_at__isnull=True).update(fired_at=now):
        return
    group.fired_at = now
    plan.fire = group
    if group.policy == GroupPolicy.FIRST_FAILURE and not done:
        pending = (
            Job.objects.using(db)
            .filter(group_id=group.id, state__in=(State.PENDING, State.WAITING))
            .exclude(id=job.id)
            .order_by("id")
        )
        if connections[db].features.has_select_for_update_skip_locked:
            # Locked now, so no claim can lease them before their cancel; one a claim
            # holds is skipped (it runs and settles on its own). Waiting here instead could
            # deadlock with that member's own end, which waits for this group's row.
            pending = pending.select_for_update(skip_locked=True)
        plan.cancel += list(pending.values_list("id", flat=True))


def reopened(db, job, from_state):
    """``job`` leaves the end ``from_state`` (requeue): its group is open again, and its
    dependents still waiting wait for it again. Return what its event records."""
    if str(from_state) not in _COUNTER:
        return {}
    meta = {}
    if job.group_id is not None:
        counter = _COUNTER[str(from_state)]
        groups = JobGroup.objects.using(db)
        groups.filter(id=job.group_id).update(**{counter: F(counter) - 1, "closed_at": None})
        meta.update(group=job.group_id, group_reopened=True)
    if job.in_workflow:
        Job.objects.using(db).filter(
            id__in=Dependency.objects.using(db).filter(upstream_id=job.id).values("job_id"),
            state=State.WAITING,
        ).update(waiting_for=F("waiting_for") + 1)
    return meta


def outcomes(db, group, current=None):
    """The members' outcomes in member order: [{id, state, result | error}].
    ``current`` (job_id, state, result, error): the member ending now, whose row may not
    say so yet."""
    out = []
    members = (
        Job.objects.using(db)
        .filter(group_id=group.id)
        .order_by("id")
        .values_list("id", "kind", "state", "result", "last_error")
    )
    for job_id, kind, state, result, error in members:
        if current is not None and job_id == current[0]:
            state, result, error = str(current[1]), current[2], current[3]
        entry = {"id": job_id, "kind": kind, "state": state}
        if state == State.COMPLETED:
            entry["result"] = result
        elif state == State.DEAD_LETTER:
            entry["error"] = error
        out.append(entry)
    return out


def summary(group, members):
    counts = {"total": group.total, "completed": 0, "dead_letter": 0, "cancelled": 0}
    for m in members:
        if m["state"] in counts:
            counts[m["state"]] += 1
    return {"id": group.id, "name": group.name, "policy": group.policy, "counts": counts, "members": members}


def callback_request(db, group, now, current):
    """The callback's EnqueueRequest, or (None, error text) when it no longer validates."""
    info = summary(group, outcomes(db, group, current))
    spec = dict(group.callback)
    kind = spec.pop("kind")
    body = dict(spec.pop("payload", None) or {})
    if group.callback_task:
        body = {"args": list(body.get("args", [])), "kwargs": {**body.get("kwargs", {}), "group": info}}
    else:
        body["group"] = info
    try:
        return validation.enqueue_request(kind, body, now=now, **spec), ""
    except InvalidJob as exc:
        log.error("group callback refused group=%s kind=%s: %s", group.id, kind, exc)
        return None, str(exc)


def callback_enqueued(db, group, job_id, error=""):
    JobGroup.objects.using(db).filter(id=group.id).update(callback_job_id=job_id, callback_error=error)
    return {"group_callback": job_id} if job_id is not None else {"group_callback_error": error}


# --- dependencies ----------------------------------------------------------------------------


def upstreams(db, ids):
    """Lock the jobs ``ids`` a new job depends on and mark them in_workflow; return
    {id: state}. Unknown ids are refused (InvalidJob), before anything is written."""
    jobs = Job.objects.using(db)
    # The UPDATE first: it waits for a dependency's end in progress, and from here on
    # that job's end goes the long way and sees the Dependency rows of this transaction.
    jobs.filter(id__in=ids).update(in_workflow=True)
    states = dict(jobs.filter(id__in=ids).select_for_update().values_list("id", "state"))
    missing = [i for i in ids if i not in states]
    if missing:
        raise InvalidJob(f"depends_on: no job with id {', '.join(map(str, missing))}", "depends_on")
    return states


def link(db, job, ids):
    Dependency.objects.using(db).bulk_create([Dependency(job_id=job.id, upstream_id=i) for i in ids])


def at_enqueue(depends, states):
    """What a new dependent does at once: 'cancel', 'hold', 'wake' or None (waits)."""
    if any(_failed(s) for s in states.values()):
        if depends["policy"] == CANCEL:
            return "cancel"
        if depends["policy"] == HOLD:
            return "hold"
    if all(s in ENDED for s in states.values()):
        return "wake"
    return None


def _count_dependents(db, job, state, plan):
    if not job.in_workflow:
        return
    waiting = Job.objects.using(db).filter(
        id__in=Dependency.objects.using(db).filter(upstream_id=job.id).values("job_id"), state=State.WAITING
    )
    # As for groups: the UPDATE locks each dependent, then the read sees every other
    # dependency's end that committed first: exactly one end sees its count reach 0.
    if not waiting.update(waiting_for=F("waiting_for") - 1):
        return
    failed = _failed(state)
    for dep_id, left, depends in (
        waiting.select_for_update().order_by("id").values_list("id", "waiting_for", "depends")
    ):
        depends = depends or {}
        if failed and depends.get("policy", CANCEL) == CANCEL:
            plan.cancel.append(dep_id)
        elif failed and depends.get("policy") == HOLD:
            if not depends.get("held"):
                plan.hold.append(dep_id)
        elif left == 0 and not depends.get("held"):
            plan.wake.append(dep_id)


def passed_payload(db, job, current=None):
    """The payload a waking job runs with: its own, plus its dependencies' results as
    its ``pass`` option says (None: unchanged)."""
    how = (job.depends or {}).get("pass")
    if not how:
        return None
    ups = (
        Job.objects.using(db)
        .filter(id__in=Dependency.objects.using(db).filter(job_id=job.id).values("upstream_id"))
        .order_by("id")
        .values_list("id", "kind", "state", "result")
    )
    outs = []
    for up_id, kind, state, result in ups:
        if current is not None and up_id == current[0]:
            state, result = str(current[1]), current[2]
        outs.append({"id": up_id, "kind": kind, "state": state, "result": result})
    payload = dict(job.payload or {})
    if how == "arg":
        result = outs[-1]["result"] if len(outs) == 1 else [o["result"] for o in outs]
        payload["args"] = [result, *payload.get("args", [])]
    else:
        payload["dependencies"] = outs
    return payload
