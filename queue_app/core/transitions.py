"""The state machine: one function per edge, each one transaction that changes the
job and appends exactly one Event row. Nothing else writes Job.state, Event or DeadLetter.

    edge              from                 to                      event
    enqueue           (new)                pending                 enqueued
                      pending (debounce)   pending (run_at later)  debounced  (never leased)
    claim             pending (ready)      leased                  claimed
    complete          leased*              completed               completed
    complete_many     leased*              completed               completed  (one per job; batched acks)
    fail              leased*              pending (retry)         failed
                      leased*              dead_letter             dead_lettered
    release           leased*              pending                 released   (not started; attempt given back)
                      (abort requested: as abort, to cancelled)
    recover           leased, expired      pending | dead_letter   recovered
                                           cancelled (abort requested)
    requeue           dead_letter|cancelled pending                requeued
                      waiting (held)
    revive            cancelled (by a      waiting                 revived    (the job it failed for
                      dependency), waiting (held)                             was requeued; down the line)
    cancel            pending|waiting      cancelled               cancelled  (leased: request_abort)
    (enqueue)         (new, depends_on)    waiting                 enqueued
    unblock           waiting              pending                 unblocked  (its last dependency ended)
    hold              waiting              waiting                 held       (a dependency failed)
    request_abort     leased               leased (cancel_requested_at set)  abort_requested
    abort             leased* (requested)  cancelled              cancelled  (handler stopped or was killed)
    retry_now         pending              pending (run_at=now)    rescheduled
    change_priority   pending|dead_letter  (same)                  priority_changed
    change_payload    pending|dead_letter  (same)                  payload_changed

    * worker-owned: the write also matches lease_owner and the attempt number, a
      fencing token (engines.base.Fence, its one definition). A worker whose lease lapsed and was recovered (or re-claimed, even
      by itself) matches nothing, changes nothing, and is told so by the return value.
"""

import dataclasses
import json
import logging
from contextlib import suppress
from datetime import timedelta
from functools import partial

from django.db import IntegrityError, OperationalError, connections, router, transaction
from django.db.models import BooleanField, ExpressionWrapper, F, Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from queue_app import engines
from queue_app.conf import settings
from queue_app.core import backoff, encryption, flow, ordering, telemetry, validation, webhooks, workflows
from queue_app.core import events as events_
from queue_app.core import follow_ups as chaining
from queue_app.engines import rows
from queue_app.engines.base import Fence
from queue_app.exceptions import ClaimNotRead, InvalidJob, InvalidTransition, JobNotFound
from queue_app.models import AdmissionKey, DeadLetter, Event, EventType, Job, KindCrashes, State

log = logging.getLogger("queue_app")

_UNSET = object()


def _db(using=None):
    return using or router.db_for_write(Job)


def _event(
    job_id, type_, now, *, from_state="", to_state="", attempt=0, worker="", message="", metadata=None
):
    return Event(
        job_id=job_id,
        type=type_,
        at=now,
        from_state=from_state,
        to_state=to_state,
        attempt=attempt,
        worker=worker or "",
        message=message,
        metadata=metadata or {},
    )


# --- enqueue -------------------------------------------------------------------------


def _new_job(req, now):
    return Job(
        kind=req.kind,
        payload=req.payload,
        queue_name=req.queue_name,
        priority=req.priority,
        run_at=req.run_at or now,
        run_after=req.run_after,
        max_attempts=req.max_attempts,
        idempotency_key=req.idempotency_key,
        concurrency_key=req.concurrency_key,
        timeout=req.timeout,
        created_at=now,
        on_success=req.on_success,
        on_failure=req.on_failure,
        webhook_url=req.webhook_url,
        parent_id=req.parent_id,
        backoff_base=req.backoff_base,
        backoff_max=req.backoff_max,
        backoff_jitter=req.backoff_jitter,
        group_id=req.group_id,
        in_workflow=True if req.group_id is not None else None,
        ordering_key=req.ordering_key,
        trace_context=telemetry.carrier(),
    )


def _enqueued_event(job, now, **extra):
    meta = {"queue": job.queue_name, "priority": job.priority, "run_at": job.run_at.isoformat()}
    if job.parent_id is not None:
        meta["parent"] = job.parent_id
    if job.concurrency_key is not None:
        meta["concurrency_key"] = job.concurrency_key
    return _event(job.id, EventType.ENQUEUED, now, to_state=State.PENDING, metadata={**meta, **extra})


def _window_passed(existing, req, now):
    """With unique_for, a key dedupes only within that many seconds of the job holding it."""
    return req.unique_for is not None and existing.created_at + timedelta(seconds=req.unique_for) <= now


def _ready_queues(jobs, now):
    """The queues of ``jobs`` that have a job ready now: what idle workers are woken for."""
    return sorted({job.queue_name for job in jobs if job.run_at <= now})


_PENDING = State.PENDING.value  # an enum member's .value is a property call


def _given(req, now):
    """What a new job's row sets (rows.JobWriter fills the other columns' defaults)."""
    return {
        "kind": req.kind,
        "payload": req.payload,
        "queue_name": req.queue_name,
        "priority": req.priority,
        "run_at": req.run_at or now,
        "run_after": req.run_after,
        "state": _PENDING,
        "attempts": 0,
        "max_attempts": req.max_attempts,
        "idempotency_key": req.idempotency_key,
        "timeout": req.timeout,
        "created_at": now,
        "on_success": req.on_success,
        "on_failure": req.on_failure,
        "webhook_url": req.webhook_url,
        "parent_id": req.parent_id,
        "backoff_base": req.backoff_base,
        "backoff_max": req.backoff_max,
        "backoff_jitter": req.backoff_jitter,
        "concurrency_key": req.concurrency_key,
        "group_id": req.group_id,
        "in_workflow": True if req.group_id is not None else None,
    }


def _enqueued_meta(given):
    meta = {
        "queue": given["queue_name"],
        "priority": given["priority"],
        "run_at": given["run_at"].isoformat(),
    }
    if given["parent_id"] is not None:
        meta["parent"] = given["parent_id"]
    if given["concurrency_key"] is not None:
        meta["concurrency_key"] = given["concurrency_key"]
    return meta


def _enqueued_events(connection, givens, at_db):
    """Each new job's enqueued event row but its job_id (rows.event_params order)."""
    # A batch's jobs mostly share queue, priority and run_at: jobs that share them share
    # one row, so its metadata is adapted once.
    out, shared = [], {}
    for given in givens:
        key = (
            given["queue_name"],
            given["priority"],
            given["run_at"],
            given["parent_id"],
            given["concurrency_key"],
        )
        tail = shared.get(key)
        if tail is None:
            event = rows.event_params(
                connection, None, EventType.ENQUEUED, at_db, 0, "", "", State.PENDING, "", None
            )
            event[8] = rows.json_once(connection, _enqueued_meta(given))  # metadata
            tail = shared[key] = event[1:]  # all but job_id
        out.append(tail)
    return out


def _insert_plain(db, reqs, now, *, savepoint=True):
    """Insert requests without an idempotency key (nothing to look up first), each with
    its enqueued event, atomic together (in the caller's transaction if there is one).
    Return the Job instances, in order."""
    connection = connections[db]
    givens = [_given(req, now) for req in reqs]
    trace = telemetry.carrier()
    if trace is not None:
        for given in givens:
            given["trace_context"] = trace
    texts = [req.payload_json for req in reqs]
    if None in texts:  # a request built without validation.payload_json
        texts = [t if t is not None else json.dumps(r.payload) for t, r in zip(texts, reqs)]
    events = _enqueued_events(connection, givens, connection.ops.adapt_datetimefield_value(now))
    engine = engines.of(connection)
    jobs = engine.insert_jobs(givens, texts, events, now, savepoint=savepoint)
    if len(reqs) > 1:
        # A lone job's NOTIFY went with its insert; a batch NOTIFYs once per queue.
        engine.notify(_ready_queues(jobs, now))
    return jobs


def enqueue(req, *, using=None):
    """Insert a validated EnqueueRequest; return (job, created).

    With OpenTelemetry, in a span of the caller's trace that the job's attempts continue.

    With an idempotency key the database's unique index decides: of concurrent
    enqueues with one key exactly one inserts, the others get that job back. With
    ``unique_for`` a job older than the window gives its key up (as cancel does; the
    new job's enqueued event records it) in the same savepoint as the insert, so of
    concurrent enqueues after the window still exactly one inserts. A debounce_key or
    unique_key goes through its AdmissionKey row instead (_debounce, _unique).
    """
    if not telemetry.tracing():  # no span to open: skip the context manager's cost
        return _enqueue(req, using)
    with telemetry.enqueuing(req.kind, req.queue_name) as traced:
        job, created = _enqueue(req, using)
        traced(job, created)
    return job, created


def _enqueue(req, using):
    db = _db(using)
    now = timezone.now()
    if req.debounce_key is not None:
        return _debounce(req, db, now)
    if req.unique_key is not None:
        return _unique(req, db, now)
    if req.depends_on:
        return _enqueue_waiting(db, req, now)
    if req.ordering_key is not None:
        return _enqueue_ordered(db, req, now)
    if req.idempotency_key is None:
        # Nothing to look up and no race to lose: no savepoint, the fewest statements.
        (job,) = _insert_plain(db, [req], now)
        log.debug(
            "enqueued id=%s kind=%s queue=%s",
            job.id,
            job.kind,
            job.queue_name,
            extra=telemetry.job_fields(job),
        )
        return job, True
    for attempt in range(3):
        try:
            return _enqueue_keyed(req, db, now)
        except OperationalError as exc:
            # Concurrent enqueues of one key can deadlock on MariaDB's unique index; the
            # database rolled this one back whole, so outside a caller's transaction it
            # simply goes again (inside one, the caller's transaction is gone: raise).
            connection = connections[db]
            if attempt == 2 or connection.in_atomic_block or not engines.of(connection).deadlocked(exc):
                raise


def _enqueue_keyed(req, db, now):
    """enqueue() of a job with an idempotency key (and no debounce, unique or ordering key)."""
    with transaction.atomic(using=db):
        stale = None
        if req.idempotency_key is not None:
            existing = Job.objects.using(db).filter(idempotency_key=req.idempotency_key).first()
            if existing is not None:
                if not _window_passed(existing, req, now):
                    return existing, False
                stale = existing
        job = _new_job(req, now)
        extra = {}
        try:
            # A savepoint so that losing the race leaves the caller's transaction usable.
            with transaction.atomic(using=db):
                if stale is not None:
                    # Matches nothing if a concurrent enqueue released it first; then our
                    # insert loses on the unique index and returns that one's job.
                    Job.objects.using(db).filter(id=stale.id, idempotency_key=req.idempotency_key).update(
                        idempotency_key=None
                    )
                    extra["dedupe_released"] = {"job": stale.id, "key": req.idempotency_key}
                job.save(using=db, force_insert=True)
                _enqueued_event(job, now, **extra).save(using=db, force_insert=True)
                engines.of(connections[db]).notify(_ready_queues([job], now))
        except IntegrityError:
            if req.idempotency_key is None:
                raise
            existing = Job.objects.using(db).filter(idempotency_key=req.idempotency_key).first()
            if existing is None:
                raise
            return existing, False
    log.debug(
        "enqueued id=%s kind=%s queue=%s", job.id, job.kind, job.queue_name, extra=telemetry.job_fields(job)
    )
    return job, True


def _lock_key(db, key, now):
    """Insert ``key``'s AdmissionKey row or, if it exists, lock it; return it.

    An upsert, not a read then an insert: of concurrent enqueues with one key the first
    inserts and the others wait on its row until it commits, then lock it in turn
    (PostgreSQL's and SQLite's ON CONFLICT DO UPDATE, MariaDB's ON DUPLICATE KEY UPDATE;
    SQLite's IMMEDIATE transactions take turns anyway). Nobody loses a unique-index race,
    so no savepoint and no retry."""
    # MariaDB's upsert names no conflict target (any unique key is one).
    target = ["id"] if connections[db].features.supports_update_conflicts_with_target else None
    AdmissionKey.objects.using(db).bulk_create(
        [AdmissionKey(id=key, updated_at=now)],
        update_conflicts=True,
        unique_fields=target,
        update_fields=["updated_at"],
    )
    return AdmissionKey.objects.using(db).select_for_update().get(id=key)


def _insert_keyed(db, row, req, now, run_at=None, **extra):
    """Insert ``req``'s job (its run_at ``run_at`` if given) as the job ``row``'s key stands for."""
    job = _new_job(req, now)
    if run_at is not None:
        job.run_at = run_at
    job.save(using=db, force_insert=True)
    _enqueued_event(job, now, **extra).save(using=db, force_insert=True)
    AdmissionKey.objects.using(db).filter(id=row.id).update(job_id=job.id)
    engines.of(connections[db]).notify(_ready_queues([job], now))
    log.debug("enqueued id=%s kind=%s queue=%s key=%s", job.id, job.kind, job.queue_name, row.id)
    return job


def _debounced_run_at(first_enqueued, req, now):
    """now + debounce_for, but no later than debounce_max_wait after the first enqueue."""
    run_at = now + timedelta(seconds=req.debounce_for)
    if req.debounce_max_wait is not None:
        run_at = max(now, min(run_at, first_enqueued + timedelta(seconds=req.debounce_max_wait)))
    return run_at


def _debounce(req, db, now):
    """enqueue() with a debounce_key: update the key's job while it is pending and never
    leased (a ``debounced`` event), else insert a new job; return (job, created)."""
    with transaction.atomic(using=db):
        row = _lock_key(db, f"debounce:{req.debounce_key}", now)
        # The time we hold the key, not the time we asked: the enqueue before ours may
        # have taken its time after ours, and a debounce never moves run_at back.
        now = timezone.now()
        # started_at is set by the first claim and never cleared: a job retried, snoozed
        # or given back has been leased, and its key starts a new job.
        waiting = Q(state=State.PENDING, started_at__isnull=True)
        # The job's lock too: a claim racing this enqueue either took the job first (we
        # wait for it, then see it leased) or skips it (SKIP LOCKED) and sees the new run_at.
        job = (
            Job.objects.using(db).select_for_update().filter(waiting, id=row.job_id).first()
            if row.job_id is not None
            else None
        )
        if job is not None:
            old, new = job.run_at, _debounced_run_at(job.created_at, req, now)
            replace = req.debounce_mode == "replace"
            changes = {"run_at": new, **({"payload": req.payload} if replace else {})}
            if Job.objects.using(db).filter(waiting, id=job.id).update(**changes):
                _event(
                    job.id,
                    EventType.DEBOUNCED,
                    now,
                    from_state=State.PENDING,
                    to_state=State.PENDING,
                    # Short enough for history's column; the metadata has the exact times.
                    message=f"run_at {old:%H:%M:%S.%f}"[:-3]
                    + f" -> {new:%H:%M:%S.%f}"[:-3]
                    + " UTC"
                    + (", payload replaced" if replace else ""),
                    metadata={
                        "key": req.debounce_key,
                        "old_run_at": old.isoformat(),
                        "new_run_at": new.isoformat(),
                        "payload_replaced": replace,
                        "capped": new < now + timedelta(seconds=req.debounce_for),
                    },
                ).save(using=db, force_insert=True)
                job.run_at = new
                if replace:
                    job.payload = req.payload
                if new <= now:  # capped by max_wait: due now
                    engines.of(connections[db]).notify(_ready_queues([job], now))
                return job, False
        job = _insert_keyed(
            db, row, req, now, _debounced_run_at(now, req, now), debounce_key=req.debounce_key
        )
    return job, True


def _unique(req, db, now):
    """enqueue() with a unique_key: return the key's newest job while its state is one of
    unique_while, else insert a new job that takes the key; return (job, created)."""
    with transaction.atomic(using=db):
        row = _lock_key(db, f"unique:{req.unique_key}", now)
        if row.job_id is not None:
            # A plain read under the key's lock: only enqueues with this key are held
            # back, and a state read just before a claim is as true as one just after.
            holder = Job.objects.using(db).filter(id=row.job_id, state__in=req.unique_while).first()
            if holder is not None:
                return holder, False
        extra = {"unique_key": req.unique_key}
        if row.job_id is not None:
            extra["after"] = row.job_id  # the job the key stood for until now
        job = _insert_keyed(db, row, req, now, **extra)
    return job, True


def _enqueue_waiting(db, req, now):
    """enqueue() of a job with depends_on: waiting until they end (workflows.py)."""
    with transaction.atomic(using=db):
        if req.idempotency_key is not None:
            existing = Job.objects.using(db).filter(idempotency_key=req.idempotency_key).first()
            if existing is not None:
                return existing, False
        states = workflows.upstreams(db, req.depends_on)
        job = _new_job(req, now)
        job.state = State.WAITING
        job.depends = req.depends
        job.waiting_for = sum(1 for state in states.values() if state not in workflows.ENDED)
        job.save(using=db, force_insert=True)
        workflows.link(db, job, req.depends_on)
        event = _enqueued_event(job, now, depends_on=list(req.depends_on))
        event.to_state = State.WAITING
        event.save(using=db, force_insert=True)
        then, failed = workflows.at_enqueue(req.depends, states)
        if then == "cancel":
            cancel(job.id, actor="workflow", reason="a job it depends on had failed", using=db)
            workflows.dropped(db, job.id, failed)
        elif then == "hold":
            _hold(db, job.id, failed, now)
        elif then == "wake":
            _unblock(db, [job.id], now)
        job.refresh_from_db(using=db)
    return job, True


def _enqueue_ordered(db, req, now):
    """enqueue() with an ordering_key: behind the key's newest job, which it waits for
    (workflows.py, Ordered keys). The key's AdmissionKey row is locked first, so of
    concurrent enqueues with one key each finds the one before it: they line up in the
    order they take that lock, which is their enqueue order."""
    with transaction.atomic(using=db):
        if req.idempotency_key is not None:
            existing = Job.objects.using(db).filter(idempotency_key=req.idempotency_key).first()
            if existing is not None:
                return existing, False
        row = _lock_key(db, f"ordering:{req.ordering_key}", now)
        ahead = None
        if row.job_id is not None:
            ahead = Job.objects.using(db).filter(id=row.job_id).values_list("id", "state").first()
        if ahead is None or not workflows.keeps_key(ahead[1], req.ordering_blocks):
            return _insert_keyed(db, row, req, now, ordering_key=req.ordering_key), True
        # Its state is read again under its lock there: one ending now is waited for.
        depends = workflows.ordering_depends(req, ahead[0])
        job, _ = _enqueue_waiting(db, dataclasses.replace(req, depends_on=(ahead[0],), depends=depends), now)
        AdmissionKey.objects.using(db).filter(id=row.id).update(job_id=job.id)
    return job, True


def _unblock(db, job_ids, now, current=None):
    """Waiting jobs whose last dependency ended (``current``: (id, state, result) of the
    one ending now) go to pending, each with its event."""
    queues = set()
    for job in Job.objects.using(db).select_for_update().filter(id__in=job_ids, state=State.WAITING):
        changes = {"state": State.PENDING, "run_at": max(job.run_at, now)}
        meta = {"after": current[0]} if current else {}
        payload = workflows.passed_payload(db, job, current)
        if payload is not None:
            try:
                changes["payload"] = validation.payload(_sealed(job, payload))
            except InvalidJob as exc:
                # Too large with its dependencies' results: it runs without them rather
                # than fail the end of the job that woke it.
                meta["pass_error"] = str(exc)
        Job.objects.using(db).filter(id=job.id).update(**changes)
        _event(
            job.id,
            EventType.UNBLOCKED,
            now,
            from_state=State.WAITING,
            to_state=State.PENDING,
            metadata=meta,
        ).save(using=db)
        if changes["run_at"] <= now:
            queues.add(job.queue_name)
    engines.of(connections[db]).notify(sorted(queues))


def _hold(db, job_id, upstream_id, now):
    """A waiting job whose dependency failed stays waiting, held for an operator."""
    job = Job.objects.using(db).select_for_update().get(id=job_id)
    Job.objects.using(db).filter(id=job_id).update(depends={**(job.depends or {}), "held": True})
    _event(
        job_id,
        EventType.HELD,
        now,
        from_state=State.WAITING,
        to_state=State.WAITING,
        message="a job it depends on failed: requeue runs it anyway, cancel drops it",
        metadata={"after": upstream_id} if upstream_id else {},
    ).save(using=db)


def _workflow(db, job, state, now, result, error):
    """Count a workflow job's end in its group and its dependents, and do what that
    decides (workflows.Plan), in the caller's transaction; return what its event says."""
    plan = workflows.job_ended(db, job, state, now)
    for other in plan.cancel:
        # One claimed or ended meanwhile settles on its own.
        with suppress(InvalidTransition):
            cancel(other, actor="workflow", reason=f"job {job.id} ended {state}", using=db)
    for other in plan.drop:
        with suppress(InvalidTransition):
            cancel(other, actor="workflow", reason=f"job {job.id} ended {state}", using=db)
            workflows.dropped(db, other, job.id)
    for other in plan.hold:
        _hold(db, other, job.id, now)
    if plan.wake:
        _unblock(db, plan.wake, now, (job.id, state, result))
    meta = plan.meta
    if plan.fire is not None:
        req, refused = workflows.callback_request(db, plan.fire, now, (job.id, state, result, error))
        # Its parent is the member whose end decided it: both timelines show the link.
        callback = (
            enqueue(dataclasses.replace(req, parent_id=job.id), using=db)[0] if req is not None else None
        )
        meta.update(workflows.callback_enqueued(db, plan.fire, callback and callback.id, refused))
    return meta


def bulk_enqueue(reqs, *, using=None):
    """Insert many validated requests in one transaction; return the jobs in order.

    Requests with an idempotency key go one by one (each may match an existing job);
    the rest are inserted with multi-row INSERTs.
    """
    db = _db(using)
    now = timezone.now()
    out = [None] * len(reqs)
    kinds = {req.kind for req in reqs}
    queues = {req.queue_name for req in reqs}
    with (
        telemetry.enqueuing(
            kinds.pop() if len(kinds) == 1 else "(several)",
            queues.pop() if len(queues) == 1 else "(several)",
            count=len(reqs),
        ),
        transaction.atomic(using=db),
    ):
        plain = []
        for i, req in enumerate(reqs):
            if (
                req.idempotency_key is not None
                or req.debounce_key is not None
                or req.unique_key is not None
                or req.depends_on
                or req.ordering_key is not None
            ):
                out[i], _ = enqueue(req, using=db)
            else:
                plain.append(i)
        # Chunks of more than one: NOTIFY once per queue for the batch, not per chunk.
        jobs = _insert_plain(db, [reqs[i] for i in plain], now, savepoint=False)
        for i, job in zip(plain, jobs):
            out[i] = job
    return out


# --- worker-owned edges ------------------------------------------------------------------


def claim(
    worker_id, *, limit=1, queues=None, kinds=None, lease_seconds=None, aging=None, now=None, using=None
):
    """Lease up to ``limit`` ready jobs to ``worker_id``; return them in lease order."""
    return _claim(
        worker_id,
        limit=limit,
        queues=queues,
        kinds=kinds,
        lease_seconds=lease_seconds,
        aging=aging,
        now=now,
        using=using,
    )()


def claims_skip_locked(using=None):
    """Whether an empty claim may have passed over ready jobs locked for an instant by
    another transaction (PostgreSQL, MariaDB: SKIP LOCKED), so that only a second claim
    tells an empty queue."""
    return engines.of(connections[_db(using)]).skips_locked_rows


def _in_order(connection, found, key):
    return sorted(rows.JobReader.on(connection).jobs(found), key=key) if found else []


def _claim(
    worker_id, *, limit=1, queues=None, kinds=None, lease_seconds=None, aging=None, now=None, using=None
):
    """claim(), returning a function that builds the leased Job instances: a caller's
    transaction (complete_and_claim) commits first, as reading the rows needs no lock
    and holding SQLite's write lock for it keeps every other worker waiting."""
    validation.batch_size(limit)
    db = _db(using)
    connection = connections[db]
    lease = float(settings.LEASE_SECONDS if lease_seconds is None else lease_seconds)
    aging = float(settings.AGING_INTERVAL if aging is None else aging)
    if queues and "*" in queues:
        queues = None
    now = now or timezone.now()
    expires = now + timedelta(seconds=lease)
    at_db = connection.ops.adapt_datetimefield_value(now)
    # One claimed event per leased job; the engine fills in each one's id and attempt.
    event = rows.event_params(
        connection,
        None,
        EventType.CLAIMED,
        at_db,
        None,
        worker_id,
        State.PENDING,
        State.LEASED,
        "",
        {"lease_expires_at": expires.isoformat()},
    )
    engine = engines.of(connection)
    claim_one = partial(
        engine.claim,
        owner=worker_id,
        now=now,
        expires=expires,
        event=event,
        queues=list(queues) if queues else None,
        aging_us=ordering.aging_microseconds(aging),
    )
    in_order = partial(ordering.sort_key, now=now, aging_seconds=aging)
    if not flow.likely_gated(db):
        # Nothing paused, nothing limited (as the last claim here found): one claim that
        # reads the gates itself and leases nothing if one exists (exact: the same
        # statement or transaction), and only then the long way below.
        found = claim_one(limit=limit, kinds=list(kinds) if kinds else None, unless_gated=True)
        if found is not None:
            return partial(_in_order, connection, found, in_order)
    # Paused queues/kinds are never leased; limited (and fair) kinds are claimed one by
    # one under their limit row's lock before the main claim (flow.py says why).
    pauses, limits = flow.claim_gates(db)

    def lease(n, **filters):
        found = claim_one(limit=n, exclude_queues=pauses.queues, **filters)
        return rows.JobReader.on(connection).jobs(found) if found else []

    def lease_fair(kind, tenants, weights, n):
        found = engine.claim_fair(
            owner=worker_id,
            kind=kind,
            tenants=tenants,
            weights=weights,
            limit=n,
            now=now,
            expires=expires,
            event=event,
            queues=list(queues) if queues else None,
            aging_us=ordering.aging_microseconds(aging),
            exclude_queues=pauses.queues,
        )
        return rows.JobReader.on(connection).jobs(found) if found else []

    jobs = []
    for kind in flow.kinds_to_claim(limits, kinds, pauses):
        if len(jobs) >= limit:
            break
        with transaction.atomic(using=db, savepoint=False):
            row, free = flow.reserve(kind, limit - len(jobs), now, using=db)
            if free and row.fair:
                got = flow.lease_fair(row, free, partial(lease_fair, kind), using=db)
                flow.record_starts(row, len(got), now, using=db)
                jobs += got
            elif free:
                got = flow.lease_within(row, free, partial(lease, kinds=[kind]), using=db)
                flow.record_starts(row, len(got), now, using=db)
                jobs += got
    excluded = pauses.kinds | set(limits)
    wanted = [k for k in kinds if k not in excluded] if kinds else None
    if len(jobs) < limit and (wanted is None or wanted):
        # Atomic with its events on its own (on PostgreSQL one statement, no BEGIN/COMMIT).
        jobs += lease(limit - len(jobs), kinds=wanted, exclude_kinds=excluded)
    jobs.sort(key=in_order)
    return lambda: jobs


def complete_and_claim(done, worker_id, **claim_options):
    """complete_many(done) and claim(worker_id, **claim_options) in one transaction;
    return (ids completed, jobs claimed).

    A worker acknowledging its last job as it leases the next pays one commit for both
    instead of two: at --batch 1 the commit is most of what a no-op job costs. The
    settle-only edges nest without savepoints (a failure anywhere rolls back both, and
    the caller acknowledges on its own before retrying the claim)."""
    db = _db(claim_options.get("using"))
    # What needs no lock comes before the transaction or after its commit (validating
    # the results, building the claimed jobs): on SQLite the whole transaction holds the
    # one write lock every worker waits for.
    done = _validated(done)
    with transaction.atomic(using=db):
        completed = complete_many(
            done, worker_id=worker_id, now=claim_options.get("now"), using=db, validated=True
        )
        built = _claim(worker_id, **{**claim_options, "using": db})
    try:
        return completed, built()
    except Exception as exc:
        raise ClaimNotRead(completed) from exc


# What a terminal edge reads to enqueue follow-ups (not the payload, which may be large).
_FOLLOW_UP_FIELDS = (
    "id",
    "kind",
    "queue_name",
    "attempts",
    "created_at",
    "started_at",
    "on_success",
    "on_failure",
    "webhook_url",
    "group_id",
    "in_workflow",
)


def _follow_ups(db, job, state, now, *, result=None, error=None):
    """Enqueue a finished job's chained job and webhook delivery, in the caller's
    transaction; return what its terminal event records about them. (Every terminal
    edge calls this: it also tells wait() callers, on commit.)"""
    engines.of(connections[db]).notify_ended([job.id])
    child, chained = chaining.follow_up(job, state, now, result=result, error=error)
    if child is not None:
        child, _ = enqueue(child, using=db)
        log.debug(
            "chained id=%s -> id=%s kind=%s", job.id, child.id, child.kind, extra=telemetry.job_fields(job)
        )
        chained = {"chained": child.id}
    hook, hooked = webhooks.delivery(job, state, now, result=result, error=error)
    if hook is not None:
        hook, _ = enqueue(hook, using=db)
        hooked = {"webhook": hook.id}
    if job.in_workflow:
        return {**chained, **hooked, **_workflow(db, job, state, now, result, error)}
    return {**chained, **hooked}


def _held(db, worker_id, pairs):
    """The jobs of ``pairs`` [(job_id, attempt)] this worker still holds (engines.base.Fence)."""
    return Job.objects.using(db).filter(Fence(worker_id, pairs).q())


def _lost(job_id, worker_id, attempt, action):
    log.warning(
        "lease lost id=%s worker=%s attempt=%s: %s refused (recovered, cancelled or re-claimed)",
        job_id,
        worker_id,
        attempt,
        action,
        extra={"job_id": job_id, "attempt": attempt, "worker_id": worker_id},
    )


def _complete_plain(db, done, worker_id, now):
    """Complete those of ``done`` [(job_id, attempt, result, metadata)] that this worker
    still holds and that have no follow-up to enqueue (no on_success, no webhook), with
    their events, in one transaction (on PostgreSQL one statement). Return the ids
    completed; the caller settles the rest the long way, which also tells a lost lease
    from a follow-up."""
    connection = connections[db]
    at_db = connection.ops.adapt_datetimefield_value(now)
    # The engine fills in each event's job id and attempt, and its metadata from ``done``.
    event = rows.event_params(
        connection, None, EventType.COMPLETED, at_db, None, worker_id, State.LEASED, State.COMPLETED, "", {}
    )
    return engines.of(connection).complete_plain(done, worker_id, at_db, event)


def complete(job_id, *, worker_id, attempt, result=None, output=None, using=None):
    """Mark a leased job completed; return False if this worker no longer holds it.

    ``output`` is what the handler printed (capture.py), kept in the event."""
    result = validation.payload(result, "result")
    db = _db(using)
    now = timezone.now()
    if _complete_plain(db, [(job_id, attempt, result, _with_output(None, output))], worker_id, now):
        return True
    with transaction.atomic(using=db):
        changed = _held(db, worker_id, [(job_id, attempt)]).update(
            state=State.COMPLETED,
            finished_at=now,
            result=result,
            lease_owner=None,
            lease_expires_at=None,
        )
        if not changed:
            _lost(job_id, worker_id, attempt, "complete")
            return False
        job = Job.objects.using(db).only(*_FOLLOW_UP_FIELDS).get(id=job_id)
        _event(
            job_id,
            EventType.COMPLETED,
            now,
            from_state=State.LEASED,
            to_state=State.COMPLETED,
            attempt=attempt,
            worker=worker_id,
            metadata=_with_output(_follow_ups(db, job, State.COMPLETED, now, result=result), output),
        ).save(using=db)
    return True


# Whether a job has anything to enqueue when it completes; read with the batch's lock.
_HAS_FOLLOW_UP = ExpressionWrapper(
    Q(on_success__isnull=False) | Q(webhook_url__isnull=False) | Q(in_workflow__isnull=False),
    output_field=BooleanField(),
)


def _validated(done):
    """``done`` as complete_many takes it, [(job_id, attempt, result, output)], each
    result checked (validation.payload)."""
    return [(d[0], d[1], validation.payload(d[2], "result"), d[3] if len(d) > 3 else None) for d in done]


def complete_many(done, *, worker_id, now=None, using=None, validated=False):
    """Mark many leased jobs completed in one transaction (batched acks).

    ``done`` is [(job_id, attempt, result)] for handlers that have returned, or
    [(job_id, attempt, result, output)] with what each printed. Return the ids completed;
    the others were no longer this worker's (and are logged as lost). ``now``, if given,
    is their finished_at: the caller builds their TaskResults from it, with no read back.
    ``validated``: ``done`` comes from _validated().
    """
    if not validated:
        done = _validated(done)
    outputs = {d[0]: d[3] for d in done if d[3]}
    done = [(job_id, attempt, result) for job_id, attempt, result, _ in done]
    if not done:
        return set()
    db = _db(using)
    now = now or timezone.now()
    fast = _complete_plain(
        db,
        [
            (job_id, attempt, result, _with_output(None, outputs.get(job_id)))
            for job_id, attempt, result in done
        ],
        worker_id,
        now,
    )
    done = [d for d in done if d[0] not in fast]
    if not done:
        return fast
    # The rest have a follow-up to enqueue, or are no longer ours.
    with transaction.atomic(using=db, savepoint=False):
        # Lock what we still hold, then write by id alone: the lock keeps the fence true.
        locked = list(
            _held(db, worker_id, [(job_id, attempt) for job_id, attempt, _ in done])
            .select_for_update()
            .annotate(has_follow_up=_HAS_FOLLOW_UP)
            .values_list("id", "has_follow_up")
        )
        held = {job_id for job_id, _ in locked}
        follow = {job_id for job_id, has_follow_up in locked if has_follow_up}
        by_result = {}
        for job_id, _, result in done:
            if job_id in held:
                by_result.setdefault(json.dumps(result, sort_keys=True), (result, []))[1].append(job_id)
        # One UPDATE per distinct result: no-op jobs (all None) settle in a single statement.
        for result, ids in by_result.values():
            Job.objects.using(db).filter(id__in=ids).update(
                state=State.COMPLETED,
                finished_at=now,
                result=result,
                lease_owner=None,
                lease_expires_at=None,
            )
        meta = {}
        if follow:
            results = {job_id: result for job_id, _, result in done}
            for job in Job.objects.using(db).only(*_FOLLOW_UP_FIELDS).filter(id__in=follow):
                meta[job.id] = _follow_ups(db, job, State.COMPLETED, now, result=results[job.id])
        Event.objects.using(db).bulk_create(
            [
                _event(
                    job_id,
                    EventType.COMPLETED,
                    now,
                    from_state=State.LEASED,
                    to_state=State.COMPLETED,
                    attempt=attempt,
                    worker=worker_id,
                    metadata=_with_output(meta.get(job_id), outputs.get(job_id)),
                )
                for job_id, attempt, _ in done
                if job_id in held
            ]
        )
    for job_id, attempt, _ in done:
        if job_id not in held:
            _lost(job_id, worker_id, attempt, "complete")
    return held | fast


def _with_output(metadata, output):
    """An attempt's terminal event metadata, plus what its handler printed if anything."""
    return {**(metadata or {}), "output": output} if output else metadata


def _dead_letter_row(job, now, error, reason):
    return DeadLetter(
        job_id=job.id,
        kind=job.kind,
        payload=job.payload,
        attempts=job.attempts,
        error=error,
        reason=reason,
        created_at=now,
    )


def _or(value, default):
    """A job's own setting, or the default when the row leaves it empty."""
    return default if value is None else value


def fail(
    job_id,
    *,
    worker_id,
    attempt,
    error,
    retry=True,
    retry_delay=None,
    reason=None,
    crashed=False,
    output=None,
    using=None,
):
    """Record a failed attempt: back to pending with backoff, or to dead_letter when the
    budget is spent (or ``retry`` is False, ``reason`` saying why: by default
    "not_retryable"). ``crashed``: its worker process died or was killed for its timeout;
    the job's crashes count one more, and at MAX_CRASHES it is dead-lettered as "poison".
    Return the new state, or None if this worker no longer holds the job. ``output`` is
    what the handler printed (capture.py)."""
    db = _db(using)
    now = timezone.now()
    error = validation.payload(error, "error")
    with transaction.atomic(using=db):
        job = _held(db, worker_id, [(job_id, attempt)]).select_for_update().first()
        if job is None:
            _lost(job_id, worker_id, attempt, "fail")
            return None
        message = (error or {}).get("message", "") if isinstance(error, dict) else str(error)
        crashes = {}
        if crashed:
            # Counted under the row lock, in the edge that records the crash: a payload
            # that keeps killing its worker's process stops being run, attempts left or not.
            crashes = {"crashes": (job.crashes or 0) + 1}
            if crashes["crashes"] >= settings.MAX_CRASHES:
                retry, reason = False, "poison"
            _count_crash(db, job.kind, now, poisoned=not retry and reason == "poison")
        if retry and job.attempts < job.max_attempts:
            seconds = (
                retry_delay
                if retry_delay is not None
                else backoff.delay(
                    job.attempts,
                    base=_or(job.backoff_base, settings.BACKOFF_BASE),
                    cap=_or(job.backoff_max, settings.BACKOFF_MAX_SECONDS),
                    jitter=_or(job.backoff_jitter, settings.BACKOFF_JITTER),
                )
            )
            run_at = now + timedelta(seconds=seconds)
            Job.objects.using(db).filter(id=job.id).update(
                state=State.PENDING,
                run_at=run_at,
                last_error=error,
                lease_owner=None,
                lease_expires_at=None,
                **crashes,
            )
            _event(
                job.id,
                EventType.FAILED,
                now,
                from_state=State.LEASED,
                to_state=State.PENDING,
                attempt=attempt,
                worker=worker_id,
                message=message,
                metadata=_with_output(
                    {"error": error, "retry_at": run_at.isoformat(), "delay": seconds, **crashes}, output
                ),
            ).save(using=db)
            return State.PENDING
        Job.objects.using(db).filter(id=job.id).update(
            state=State.DEAD_LETTER,
            finished_at=now,
            last_error=error,
            lease_owner=None,
            lease_expires_at=None,
            **crashes,
        )
        reason = "failed" if retry else (reason or "not_retryable")
        _dead_letter_row(job, now, error, reason).save(using=db)
        _event(
            job.id,
            EventType.DEAD_LETTERED,
            now,
            from_state=State.LEASED,
            to_state=State.DEAD_LETTER,
            attempt=attempt,
            worker=worker_id,
            message=message,
            metadata=_with_output(
                {
                    "error": error,
                    "reason": reason,
                    **crashes,
                    **_follow_ups(db, job, State.DEAD_LETTER, now, error=error),
                },
                output,
            ),
        ).save(using=db)
        return State.DEAD_LETTER


def release(job_id, *, worker_id, attempt, using=None):
    """Give back a claimed job this worker did not start; the attempt is not consumed."""
    db = _db(using)
    now = timezone.now()
    with transaction.atomic(using=db):
        changed = (
            _held(db, worker_id, [(job_id, attempt)])
            .filter(cancel_requested_at__isnull=True)
            .update(state=State.PENDING, attempts=attempt - 1, lease_owner=None, lease_expires_at=None)
        )
        if not changed:
            if _held(db, worker_id, [(job_id, attempt)]).exists():
                # Its abort was asked for: giving it back would run it again.
                return abort(
                    job_id, worker_id=worker_id, attempt=attempt, how="released unfinished", using=db
                )
            _lost(job_id, worker_id, attempt, "release")
            return False
        _event(
            job_id,
            EventType.RELEASED,
            now,
            from_state=State.LEASED,
            to_state=State.PENDING,
            attempt=attempt,
            worker=worker_id,
        ).save(using=db)
    return True


def snooze(job_id, *, worker_id, attempt, seconds, output=None, using=None):
    """Send a job whose handler raised Snooze back to pending, ``seconds`` from now, with
    its attempt not spent. Return the number of times it has snoozed, or None if the
    lease was lost. A job that has snoozed MAX_SNOOZES times already is left leased and
    0 returned: the caller fails the attempt instead."""
    db = _db(using)
    now = timezone.now()
    with transaction.atomic(using=db):
        held = _held(db, worker_id, [(job_id, attempt)]).filter(cancel_requested_at__isnull=True)
        if not held.exists():
            if _held(db, worker_id, [(job_id, attempt)]).exists():
                # Its abort was asked for: snoozing would run it again.
                abort(job_id, worker_id=worker_id, attempt=attempt, how="snoozed", using=db)
                return None
            _lost(job_id, worker_id, attempt, "snooze")
            return None
        count = Event.objects.using(db).filter(job_id=job_id, type=EventType.SNOOZED).count() + 1
        if count > settings.MAX_SNOOZES:
            return 0
        run_at = now + timedelta(seconds=seconds)
        held.update(
            state=State.PENDING, attempts=attempt - 1, run_at=run_at, lease_owner=None, lease_expires_at=None
        )
        _event(
            job_id,
            EventType.SNOOZED,
            now,
            from_state=State.LEASED,
            to_state=State.PENDING,
            attempt=attempt,
            worker=worker_id,
            message=f"snoozed for {seconds:g}s (snooze {count} of at most {settings.MAX_SNOOZES})",
            metadata=_with_output(
                {"seconds": seconds, "run_at": run_at.isoformat(), "snoozes": count}, output
            ),
        ).save(using=db)
    return count


def release_orphans(worker_id, *, keep, using=None):
    """Give back every job leased to ``worker_id`` (one exact owner) that is not in
    ``keep`` (the ids that owner knows it holds); return their ids.

    For a claim that failed as far as its caller could tell but committed (the answer
    was lost with the connection): the owner never saw those jobs, so nothing of theirs
    ran, and their attempts are given back now instead of spent by recovery a lease
    later. Each goes through release(), so each gets its own fenced write and event."""
    db = _db(using)
    leased = Job.objects.using(db).leased().filter(lease_owner=worker_id).exclude(id__in=list(keep))
    out = []
    for job_id, attempt in leased.values_list("id", "attempts"):
        if release(job_id, worker_id=worker_id, attempt=attempt, using=db):
            log.warning(
                "released id=%s worker=%s: claimed by a claim whose answer was lost",
                job_id,
                worker_id,
                extra={"job_id": job_id, "attempt": attempt, "worker_id": worker_id},
            )
            out.append(job_id)
    return out


def hand_over(pairs, *, from_owner, to_owner, lease_seconds=None, using=None):
    """Move the claimed-but-unstarted jobs ``pairs`` [(job_id, attempt)] from one lease
    owner to another (a worker child killed for a timeout to its replacement), and return
    them as Job instances, highest priority first.

    Not a transition (no event, like a renewal): each stays leased, its attempt unspent,
    and the replacement runs it, instead of a release and a new claim per job for every
    timeout kill. A job whose abort was requested is left where it is (released by the
    caller, which cancels it); one no longer held by ``from_owner`` is not moved."""
    db = _db(using)
    lease = float(settings.LEASE_SECONDS if lease_seconds is None else lease_seconds)
    with transaction.atomic(using=db):
        _held(db, from_owner, pairs).filter(cancel_requested_at__isnull=True).update(
            lease_owner=to_owner, lease_expires_at=timezone.now() + timedelta(seconds=lease)
        )
        return list(_held(db, to_owner, pairs).order_by("-priority", "id"))


def renew(job_ids, *, worker_id, lease_seconds=None, started=None, using=None):
    """Extend this worker's leases (a heartbeat, not a transition: no event).

    ``started`` {job_id: attempt}: the held jobs whose handlers this worker has started,
    noted on their rows (Job.started_attempt) so that recovery tells a job that ran from
    one that was claimed and never started. Return the ids still held; a missing id means
    the lease was lost.
    """
    db = _db(using)
    lease = float(settings.LEASE_SECONDS if lease_seconds is None else lease_seconds)
    now = timezone.now()
    with transaction.atomic(using=db):
        # By id and owner: the heartbeat knows no attempts (engines.base.Fence says why).
        ids = set(_held(db, worker_id, [(job_id, None) for job_id in job_ids]).values_list("id", flat=True))
        if ids:
            _held(db, worker_id, [(job_id, None) for job_id in ids]).update(
                lease_expires_at=now + timedelta(seconds=lease)
            )
        if started:
            _mark_started(db, worker_id, started)
    return ids


def mark_started(started, *, worker_id, using=None):
    """Note on the rows of ``started`` {job_id: attempt}, still held by this worker, that
    those attempts reached their handlers (Job.started_attempt; not a transition: no
    event). For a job the worker gives up on after running it: its lease will lapse, and
    recovery must spend the attempt, not give it back."""
    db = _db(using)
    with transaction.atomic(using=db):
        _mark_started(db, worker_id, started)


def _mark_started(db, worker_id, started):
    # Fenced by attempt as well: only the attempt that ran is marked.
    _held(db, worker_id, list(started.items())).exclude(started_attempt=F("attempts")).update(
        started_attempt=F("attempts")
    )


def recover(*, limit=500, now=None, owned_by=None, owner=None, exclude=(), using=None):
    """Take back leases past their deadline: each consumes its attempt and goes to
    pending, or to dead_letter when none are left; one whose row never showed its
    attempt running (Job.started_attempt) gets the attempt back and goes to pending, at
    most RECOVERY_RETURNS times per job. Return [(id, new_state)].

    With ``owned_by`` (a lease-owner prefix: a stopped worker's name), or ``owner`` (one
    exact lease owner: a worker child that died), take back those leases whatever their
    deadline: nobody will settle or renew them. ``exclude``: ids to leave alone (a dead
    child's unstarted claims, about to be handed over)."""
    db = _db(using)
    now = now or timezone.now()
    out = []
    with transaction.atomic(using=db):
        if owner is not None:
            qs = Job.objects.using(db).leased().filter(lease_owner=owner)
        elif owned_by is None:
            qs = Job.objects.using(db).expired(now)
        else:
            qs = Job.objects.using(db).leased().filter(lease_owner__startswith=owned_by)
        taken_back = "whose worker process died" if owner is not None else "of a worker that had stopped"
        owned_by = owned_by or owner
        if exclude:
            qs = qs.exclude(id__in=list(exclude))
        qs = qs.order_by("lease_expires_at", "id")
        if connections[db].features.has_select_for_update_skip_locked:
            # Two workers recovering at once split the work instead of waiting on each other.
            qs = qs.select_for_update(skip_locked=True)
        jobs = list(qs[:limit])
        if not jobs:
            return out
        events, letters, back, dead, aborted, given_back = [], [], [], [], [], []
        # Follow-ups once the rows say their new states: a group's callback reads them.
        ended = []
        returns = settings.RECOVERY_RETURNS
        for job in jobs:
            error = events_.error(
                "LeaseExpired",
                f"lease held by {job.lease_owner} expired at {job.lease_expires_at.isoformat()}"
                if owned_by is None
                else f"lease held by {job.lease_owner}, {taken_back}",
            )
            to = State.PENDING if job.attempts < job.max_attempts else State.DEAD_LETTER
            # Never seen running by its supervisor's renewals: claimed, then lost with its
            # worker before it started (or within one renewal of its start, hence the bound).
            unstarted = job.started_attempt != job.attempts and (job.returned_attempts or 0) < returns
            if job.cancel_requested_at is not None:
                # Its abort was asked for: the worker died before settling it; do not retry.
                to = State.CANCELLED
            elif unstarted:
                to = State.PENDING
            meta = {"error": error}
            if to == State.PENDING and unstarted:
                given_back.append(job.id)
                meta["attempt_returned"] = True
            else:
                {State.PENDING: back, State.DEAD_LETTER: dead, State.CANCELLED: aborted}[to].append(job.id)
            if to == State.DEAD_LETTER:
                letters.append(_dead_letter_row(job, now, error, "lease_expired"))
                ended.append((meta, job, State.DEAD_LETTER, error))
            elif to == State.CANCELLED:
                ended.append((meta, job, State.CANCELLED, None))
            events.append(
                _event(
                    job.id,
                    EventType.RECOVERED,
                    now,
                    from_state=State.LEASED,
                    to_state=to,
                    attempt=job.attempts,
                    worker=job.lease_owner,
                    message=error["message"]
                    + (
                        "; never seen started: its attempt is given back"
                        if "attempt_returned" in meta
                        else ""
                    ),
                    metadata=meta,
                )
            )
            out.append((job.id, to))
        lapsed = {"id__in": back + dead + aborted + given_back, "state": State.LEASED}
        if owned_by is None:
            lapsed["lease_expires_at__lt"] = now
        if aborted:
            Job.objects.using(db).filter(**{**lapsed, "id__in": aborted}).update(
                state=State.CANCELLED,
                finished_at=now,
                lease_owner=None,
                lease_expires_at=None,
                idempotency_key=None,
            )
        if back:
            Job.objects.using(db).filter(**{**lapsed, "id__in": back}).update(
                state=State.PENDING,
                run_at=now,
                lease_owner=None,
                lease_expires_at=None,
            )
        if given_back:
            Job.objects.using(db).filter(**{**lapsed, "id__in": given_back}).update(
                state=State.PENDING,
                run_at=now,
                lease_owner=None,
                lease_expires_at=None,
                attempts=F("attempts") - 1,
                returned_attempts=Coalesce("returned_attempts", 0) + 1,
            )
        if dead:
            Job.objects.using(db).filter(**{**lapsed, "id__in": dead}).update(
                state=State.DEAD_LETTER,
                finished_at=now,
                lease_owner=None,
                lease_expires_at=None,
            )
            DeadLetter.objects.using(db).bulk_create(letters)
        for meta, job, to, error in ended:
            meta.update(_follow_ups(db, job, to, now, error=error))
        Event.objects.using(db).bulk_create(events)
    for job_id, to in out:
        log.warning("recovered id=%s state=%s", job_id, to, extra={"job_id": job_id})
    return out


# --- operator edges ------------------------------------------------------------------------


def _locked(db, job_id, allowed, action):
    job = Job.objects.using(db).select_for_update().filter(id=job_id).first()
    if job is None:
        raise JobNotFound(job_id)
    if job.state not in allowed:
        raise InvalidTransition(job_id, job.state, action)
    return job


def _refuse_delivery_edit(job):
    # A delivery's payload is the body the queue signs: an edited one would go out
    # signed with the real WEBHOOK_SECRET.
    if job.kind == validation.WEBHOOK_KIND:
        raise InvalidJob(f"job {job.id} is a webhook delivery: its payload cannot be replaced", "payload")


def _sealed(job, payload):
    """A replacement payload for ``job`` with what its kind (or its stored payload) has
    encrypted encrypted (core/encryption.py), checked again for size."""
    sealed = encryption.seal(job.kind, payload, like=job.payload)
    return payload if sealed is payload else validation.payload(sealed)


def requeue(job_id, *, payload=_UNSET, max_attempts=None, actor="", using=None):
    """Send a dead-lettered (or cancelled) job back to pending with a fresh budget."""
    if payload is not _UNSET:
        payload = validation.payload(payload)
    if max_attempts is not None:
        max_attempts = validation.max_attempts(max_attempts)
    db = _db(using)
    now = timezone.now()
    with transaction.atomic(using=db):
        job = _locked(db, job_id, {State.DEAD_LETTER, State.CANCELLED, State.WAITING}, "requeue")
        workflows.lock_for_revival(db, job)
        changes = {
            "state": State.PENDING,
            "attempts": 0,
            "run_at": now,
            "finished_at": None,
            "result": None,
            "cancel_requested_at": None,
            # A fresh budget of crashes too: a poison job is requeued once its fix is deployed.
            "crashes": None,
        }
        meta = {"previous_attempts": job.attempts, **workflows.reopened(db, job, job.state)}
        if job.crashes:
            meta["previous_crashes"] = job.crashes
        if payload is not _UNSET:
            _refuse_delivery_edit(job)
            changes["payload"] = _sealed(job, payload)
            meta["payload_replaced"] = True
            meta["previous_payload"] = job.payload
        if max_attempts is not None:
            changes["max_attempts"] = max_attempts
            meta["previous_max_attempts"] = job.max_attempts
        if job.depends:
            changes["depends"] = workflows.cleared(job.depends)
        Job.objects.using(db).filter(id=job.id).update(**changes)
        DeadLetter.objects.using(db).filter(job_id=job.id, resolved_at__isnull=True).update(
            resolved_at=now, resolution="requeued"
        )
        _event(
            job.id,
            EventType.REQUEUED,
            now,
            from_state=job.state,
            to_state=State.PENDING,
            worker=actor,
            metadata=meta,
        ).save(using=db)
        if job.in_workflow and job.state in (State.DEAD_LETTER, State.CANCELLED):
            _revive(db, job.id, now, actor)
    job.refresh_from_db(using=db)
    return job


def _revive(db, upstream_id, now, actor):
    """The dependents ``upstream_id``'s failure cancelled or held wait for it again, and
    theirs for them, down the line (workflows.py, Revival), in the caller's transaction."""
    todo = [upstream_id]
    while todo:
        after = todo.pop(0)
        for job_id, state, depends, left in workflows.revivable(db, after):
            changes = {"depends": workflows.cleared(depends)}
            meta = {"after": after}
            if state == State.CANCELLED:
                job = Job.objects.using(db).get(id=job_id)
                meta.update(workflows.reopened(db, job, State.CANCELLED))
                changes.update(state=State.WAITING, finished_at=None, waiting_for=left)
                todo.append(job_id)
            Job.objects.using(db).filter(id=job_id).update(**changes)
            _event(
                job_id,
                EventType.REVIVED,
                now,
                from_state=state,
                to_state=State.WAITING,
                worker=actor,
                message=f"job {after} it waits for is back: it waits for it again",
                metadata=meta,
            ).save(using=db)


def cancel(job_id, *, actor="", reason="", using=None):
    """Cancel a pending job (a leased one is stopped by request_abort: aborting.cancel).

    The idempotency key is released, so the same key can enqueue a fresh job.
    """
    db = _db(using)
    now = timezone.now()
    with transaction.atomic(using=db):
        workflows.lock_ahead(db, job_id)
        job = _locked(db, job_id, {State.PENDING, State.WAITING}, "cancel")
        Job.objects.using(db).filter(id=job.id).update(
            state=State.CANCELLED,
            finished_at=now,
            lease_owner=None,
            lease_expires_at=None,
            idempotency_key=None,
        )
        _event(
            job.id,
            EventType.CANCELLED,
            now,
            from_state=job.state,
            to_state=State.CANCELLED,
            attempt=job.attempts,
            worker=actor,
            message=reason,
            metadata={
                "idempotency_key": job.idempotency_key,
                "lease_owner": job.lease_owner,
                **_follow_ups(db, job, State.CANCELLED, now),
            },
        ).save(using=db)
    job.refresh_from_db(using=db)
    return job


def request_abort(job_id, *, actor="", reason="", using=None):
    """Ask the worker running a leased job to stop it (aborting.py says how).

    The job stays leased until its handler returns or its process is killed; then the
    worker's ``abort`` edge cancels it. Asking again changes nothing and writes nothing.
    """
    db = _db(using)
    now = timezone.now()
    with transaction.atomic(using=db):
        job = _locked(db, job_id, {State.LEASED}, "abort")
        if job.cancel_requested_at is None:
            Job.objects.using(db).filter(id=job.id).update(cancel_requested_at=now)
            _event(
                job.id,
                EventType.ABORT_REQUESTED,
                now,
                from_state=State.LEASED,
                to_state=State.LEASED,
                attempt=job.attempts,
                worker=actor,
                message=reason,
                metadata={"lease_owner": job.lease_owner},
            ).save(using=db)
    job.refresh_from_db(using=db)
    return job


def abort(job_id, *, worker_id, attempt, how, error=None, output=None, using=None):
    """Cancel a leased job whose abort was requested, once its handler has stopped (or
    its process was killed); return False if this worker no longer holds it. ``output``
    is what the attempt printed, kept on the event as the other endings keep it."""
    db = _db(using)
    now = timezone.now()
    with transaction.atomic(using=db):
        job = (
            _held(db, worker_id, [(job_id, attempt)])
            .filter(cancel_requested_at__isnull=False)
            .select_for_update()
            .first()
        )
        if job is None:
            _lost(job_id, worker_id, attempt, "abort")
            return False
        Job.objects.using(db).filter(id=job.id).update(
            state=State.CANCELLED,
            finished_at=now,
            lease_owner=None,
            lease_expires_at=None,
            idempotency_key=None,
        )
        meta = {"how": how, "idempotency_key": job.idempotency_key}
        if error is not None:
            meta["error"] = validation.payload(error, "error")
        _event(
            job.id,
            EventType.CANCELLED,
            now,
            from_state=State.LEASED,
            to_state=State.CANCELLED,
            attempt=attempt,
            worker=worker_id,
            message=f"aborted: {how}",
            metadata=_with_output({**meta, **_follow_ups(db, job, State.CANCELLED, now)}, output),
        ).save(using=db)
    return True


def _edit(db, job_id, allowed, action, changes, event_type, metadata, actor):
    """An operator's edit of a job that keeps its state: lock it, check ``allowed``,
    apply ``changes(job)`` and append ``event_type`` with ``metadata(job)``; return it."""
    now = timezone.now()
    with transaction.atomic(using=db):
        job = _locked(db, job_id, allowed, action)
        Job.objects.using(db).filter(id=job.id).update(**changes(job, now))
        _event(
            job.id,
            event_type,
            now,
            from_state=job.state,
            to_state=job.state,
            worker=actor,
            metadata=metadata(job),
        ).save(using=db)
    job.refresh_from_db(using=db)
    return job


def retry_now(job_id, *, actor="", using=None):
    """Make a scheduled or retrying job ready now."""
    return _edit(
        _db(using),
        job_id,
        {State.PENDING},
        "retry now",
        lambda job, now: {"run_at": now},
        EventType.RESCHEDULED,
        lambda job: {"previous_run_at": job.run_at.isoformat()},
        actor,
    )


def change_priority(job_id, priority, *, actor="", using=None):
    """Give a pending or dead-lettered job a new priority."""
    priority = validation.priority(priority)
    return _edit(
        _db(using),
        job_id,
        {State.PENDING, State.DEAD_LETTER},
        "change priority",
        lambda job, now: {"priority": priority},
        EventType.PRIORITY_CHANGED,
        lambda job: {"from": job.priority, "to": priority},
        actor,
    )


def change_payload(job_id, payload, *, actor="", using=None):
    """Replace a pending or dead-lettered job's payload."""
    payload = validation.payload(payload)
    return _edit(
        _db(using),
        job_id,
        {State.PENDING, State.DEAD_LETTER},
        "edit payload",
        lambda job, now: _refuse_delivery_edit(job) or {"payload": _sealed(job, payload)},
        EventType.PAYLOAD_CHANGED,
        lambda job: {"previous_payload": job.payload},
        actor,
    )


def _count_crash(db, kind, now, *, poisoned):
    """One more crash of ``kind`` (KindCrashes), and one more poison pill if ``poisoned``:
    in the failing edge's transaction, so the totals never disagree with the jobs."""
    changes = {"crashes": F("crashes") + 1, "poisoned": F("poisoned") + int(poisoned), "last_crash_at": now}
    if KindCrashes.objects.using(db).filter(kind=kind).update(**changes):
        return
    try:
        with transaction.atomic(using=db):  # two first crashes of a kind at once: one inserts
            KindCrashes.objects.using(db).create(
                kind=kind, crashes=1, poisoned=int(poisoned), last_crash_at=now
            )
    except IntegrityError:
        KindCrashes.objects.using(db).filter(kind=kind).update(**changes)


def reencrypt(*, batch_size=500, using=None):
    """Re-encrypt every stored encrypted value (jobs' payloads, dead letters' copies, the
    previous payloads on requeued and payload_changed events) under the first key of
    ENCRYPTION_KEYS; return {"jobs": n, "dead_letters": n, "events": n, "tokens": n}
    rewritten. A row no key opens raises UndecryptablePayload naming nothing else: fix
    the keys and run it again (what was rotated stays rotated). No event: the values
    are the same, only their encryption changes."""
    db = _db(using)
    counts = {"jobs": 0, "dead_letters": 0, "events": 0, "tokens": 0}
    tables = (
        ("jobs", Job.objects.using(db), "payload", encryption.DEPTH),
        ("dead_letters", DeadLetter.objects.using(db), "payload", encryption.DEPTH),
        (
            "events",
            Event.objects.using(db).filter(type__in=(EventType.REQUEUED, EventType.PAYLOAD_CHANGED)),
            "metadata",
            encryption.DEPTH + 1,  # metadata["previous_payload"]
        ),
    )
    for name, qs, column, depth in tables:
        last = 0
        while True:
            batch = list(qs.filter(id__gt=last).order_by("id").values_list("id", column)[:batch_size])
            if not batch:
                break
            last = batch[-1][0]
            with transaction.atomic(using=db):
                for row_id, value in batch:
                    if not encryption.holds_tokens(value, depth):
                        continue
                    new, n = encryption.rotated(value, depth)
                    if n:
                        qs.model.objects.using(db).filter(id=row_id).update(**{column: new})
                        counts[name] += 1
                        counts["tokens"] += n
    return counts
