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
A requeued member (dead letter or cancel) re-opens the group (``reopened``) and re-arms
its callback: ``fired_at`` is cleared, so the policy decides once more over the members'
new ends (success and always: when the group closes again; first_failure: at its next
failure, or when all have completed), and each decision still enqueues at most one
callback. A group closed k times after k - 1 requeues has run its callback at most k
times, once per decision; members the first failure cancelled stay cancelled (requeue
each to run it).

Dependencies. A job enqueued with ``depends_on`` is ``waiting`` with ``waiting_for`` =
its dependencies that have not ended. Each dependency has ``in_workflow`` set (its end
goes the long way) and a Dependency row. When it ends, ``job_ended`` takes one off each
waiting dependent's count (the same UPDATE-then-locked-read), and says which dependents
go to pending (the last dependency ended), which are cancelled or held (a dependency
failed, by the dependent's policy); the transition carries that out.

Revival. Requeueing a failed job undoes what its failure did to its dependents: each
one cancelled because of it (``depends["cancelled_by"]``, set by the workflow's own
cancel, never an operator's) or held because of it goes back to waiting for it, unless
another of its dependencies is still failed (that one's requeue revives it). A revived
job's own dependents cancelled or held because of it are revived in turn, down the line,
and a revived group member re-opens its group as a requeued one does (``revivable``).

Ordered keys. A job with an ordering_key depends on the key's newest job (policy run),
so the key's jobs run one at a time in enqueue order on every worker and host: each
becomes pending in the transaction of the previous one's end. A job that will be retried
keeps its place (its successors wait out its backoff). With ordering_blocks the policy is
hold and only a completion passes the key on: a dead-lettered job holds the job after it
("blocked by job N") until it is requeued and completes (the requeue revives the held
one), or an operator skips it (requeue the held job: it runs; cancel it: the next one
waits for what it waited for). For an ordered dependency a cancel is not a failure: a
cancelled job hands its place on, and one cancelled while still waiting hands on what it
waited for, so no job overtakes one still ahead. A job requeued after its end runs when
requeued, outside the line.

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

    # Pending members to cancel after a first failure.
    cancel: list = dataclasses.field(default_factory=list)
    # Waiting dependents to cancel because of this failed job's end (policy cancel).
    drop: list = dataclasses.field(default_factory=list)
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


def _failed_for(depends, state):
    """Whether a dependency's end ``state`` is a failure for a dependent with ``depends``."""
    if depends.get("ordering") is not None:
        return state == State.DEAD_LETTER
    return _failed(state)


def keeps_key(state, blocks):
    """Whether an ordered key's newest job, in ``state``, makes the next one wait."""
    return state not in ENDED or (blocks and state == State.DEAD_LETTER)


def ordering_depends(req, ahead_id):
    """The depends options of an ordered key's job behind ``ahead_id``."""
    return {
        "policy": HOLD if req.ordering_blocks else RUN,
        "pass": None,
        "held": False,
        "ordering": req.ordering_key,
        "after": ahead_id,
    }


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
    """``job`` leaves the end ``from_state`` (requeue, revival): its group is open again
    with its callback re-armed, and its dependents still waiting wait for it again.
    Return what its event records."""
    if str(from_state) not in _COUNTER:
        return {}
    meta = {}
    if job.group_id is not None:
        counter = _COUNTER[str(from_state)]
        groups = JobGroup.objects.using(db)
        fired = groups.select_for_update().filter(id=job.group_id).values_list("fired_at", flat=True).first()
        groups.filter(id=job.group_id).update(
            **{counter: F(counter) - 1, "closed_at": None, "fired_at": None}
        )
        meta.update(group=job.group_id, group_reopened=True)
        if fired is not None:
            meta["group_callback_rearmed"] = True
    if job.in_workflow:
        Job.objects.using(db).filter(
            id__in=Dependency.objects.using(db).filter(upstream_id=job.id).values("job_id"),
            state=State.WAITING,
        ).update(waiting_for=F("waiting_for") + 1)
    return meta


def _upstreams_of(db, job_id):
    return Job.objects.using(db).filter(
        id__in=Dependency.objects.using(db).filter(job_id=job_id).values("upstream_id")
    )


def revivable(db, job_id):
    """The dependents of ``job_id`` (no longer failed: requeued or revived) that its
    failure cancelled or held and that no other failed dependency keeps, locked:
    [(id, state, depends, how many of its dependencies have not ended)] in id order."""
    dependents = (
        Job.objects.using(db)
        .filter(
            id__in=Dependency.objects.using(db).filter(upstream_id=job_id).values("job_id"),
            state__in=(State.CANCELLED, State.WAITING),
        )
        .select_for_update()
        .order_by("id")
        .values_list("id", "state", "depends")
    )
    out = []
    for dep_id, state, depends in dependents:
        depends = depends or {}
        if state == State.CANCELLED and depends.get("cancelled_by") is None:
            continue  # cancelled by an operator, or by its group: not this failure's doing
        if state == State.WAITING and not depends.get("held"):
            continue
        # Locked (lock_for_revival took them first): one ending now has committed before
        # it is counted here, or its end sees this job waiting again and counts it down.
        states = list(
            _upstreams_of(db, dep_id).select_for_update().order_by("id").values_list("state", flat=True)
        )
        if any(_failed_for(depends, s) for s in states):
            continue
        out.append((dep_id, state, depends, sum(s not in ENDED for s in states)))
    return out


def lock_for_revival(db, job):
    """Before a requeue of ``job`` re-opens its group, lock the other dependencies of the
    dependents it may revive: their ends lock themselves, then their group's row, and the
    requeue takes them in that order too."""
    if not job.in_workflow:
        return
    dependents = Dependency.objects.using(db).filter(upstream_id=job.id).values("job_id")
    others = (
        Job.objects.using(db)
        .filter(id__in=Dependency.objects.using(db).filter(job_id__in=dependents).values("upstream_id"))
        .exclude(id=job.id)
        .exclude(state__in=ENDED)
    )
    list(others.select_for_update().order_by("id").values_list("id", flat=True))


def cleared(depends):
    """``depends`` without the marks a failure left (held, cancelled_by)."""
    return {**{k: v for k, v in (depends or {}).items() if k != "cancelled_by"}, "held": False}


def dropped(db, job_id, upstream_id):
    """Mark ``job_id``, just cancelled because ``upstream_id`` failed, as revivable by
    that job's requeue."""
    job = Job.objects.using(db).filter(id=job_id, state=State.CANCELLED).values_list("depends", flat=True)
    for depends in job:
        Job.objects.using(db).filter(id=job_id).update(
            depends={**(depends or {}), "cancelled_by": upstream_id}
        )


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
    """What a new dependent does at once: ('cancel' | 'hold' | 'wake' | None (it waits),
    the failed dependency that decided it or None)."""
    failed = sorted(i for i, s in states.items() if _failed_for(depends, s))
    if failed:
        if depends["policy"] == CANCEL:
            return "cancel", failed[0]
        if depends["policy"] == HOLD:
            return "hold", failed[0]
    if all(s in ENDED for s in states.values()):
        return "wake", None
    return None, None


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
    ahead = None
    for dep_id, left, depends in (
        waiting.select_for_update().order_by("id").values_list("id", "waiting_for", "depends")
    ):
        depends = depends or {}
        failed = _failed_for(depends, state)
        if depends.get("ordering") is not None and state == State.CANCELLED:
            if ahead is None:
                ahead = list(_upstreams_of(db, job.id).exclude(state__in=ENDED).values_list("id", flat=True))
            if ahead:
                left = _hand_on(db, dep_id, depends, ahead, left)
        if failed and depends.get("policy", CANCEL) == CANCEL:
            plan.drop.append(dep_id)
        elif failed and depends.get("policy") == HOLD:
            if not depends.get("held"):
                plan.hold.append(dep_id)
        elif left == 0 and not depends.get("held"):
            plan.wake.append(dep_id)


def lock_ahead(db, job_id):
    """Before cancelling a waiting ordered job, lock the jobs it waits for: their ends
    lock them, then it (as a dependent), so the cancel takes the same order; and one
    ending now has committed before the cancel reads whether it ended (_hand_on)."""
    jobs = Job.objects.using(db)
    if jobs.filter(id=job_id, state=State.WAITING, ordering_key__isnull=False).exists():
        list(
            _upstreams_of(db, job_id)
            .exclude(state__in=ENDED)
            .select_for_update()
            .values_list("id", flat=True)
        )


def _hand_on(db, dep_id, depends, ahead, left):
    """An ordered key's job whose predecessor was cancelled while still waiting waits for
    what that one waited for instead; return its new count."""
    link(db, Job(id=dep_id), ahead)
    Job.objects.using(db).filter(id=dep_id).update(
        waiting_for=F("waiting_for") + len(ahead), depends={**depends, "after": ahead[-1]}
    )
    return left + len(ahead)


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
