"""The worker loop: lease a batch, run each job's handler, settle it through transitions.

``run(options)`` starts the supervisor (supervisor.py) that forks ``concurrency``
child processes; each child runs ``Loop`` on ``threads`` threads. ``run_once()`` is the
same loop body in the calling process, for scripts and tests.

What the supervisor and a child share is a small block of shared memory (slots.py):
per thread, the job it is running, its attempt and its deadline, and the finished jobs
awaiting a batched acknowledgement. The supervisor reads it to kill a child whose job
overran, and to settle what a child that died had in hand. Everything else goes
through the database. How an idle child waits (poll, or LISTEN) is wakeup.py.

Chunked kinds (registry.chunking): once per claimed batch, its jobs of such a kind are
gathered into a Chunk (grouped()), which one thread runs in one handler call
(_run_chunk), first claiming more of that kind if it holds fewer than the chunk's size,
for up to its chunk_wait_ms (_fill). Each job still settles on its own. A batch with no
chunked kind costs one look at its kinds; each job, one type check in _thread.
"""

import ctypes
import functools
import logging
import os
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, replace

from django.db import close_old_connections, connection, connections
from django.utils import timezone

from queue_app.conf import settings
from queue_app.core import telemetry, transitions
from queue_app.exceptions import ClaimNotRead, NotStarted
from queue_app.handlers import registry
from queue_app.worker import capture, execution, outages
from queue_app.worker.wakeup import Waiter

log = logging.getLogger("queue_app")

# Longest a finished job waits for its batched acknowledgement while others run.
ACK_DELAY = 0.05
# Failed claims in a row after which a --burst worker gives up instead of retrying.
BURST_CLAIM_RETRIES = 5
# Seconds between the claims that fill a chunk while it waits (its chunk_wait_ms).
CHUNK_FILL_POLL = 0.02


@dataclass(frozen=True)
class Options:
    """How a worker runs; every field defaults from queue_app.conf."""

    queues: tuple = ()
    kinds: tuple = ()
    concurrency: int = None
    threads: int = None
    batch: int = None
    lease: float = None
    poll: float = None
    aging: float = None
    heartbeat: float = None
    recovery_interval: float = None
    grace: float = None
    timeout: float = None
    max_jobs: int = None
    max_runtime: float = None
    burst: bool = None
    name: str = None
    # The knobs resolved() took from runtime settings (no flag set them): current()
    # reads those again, so `manage.py config set` reaches a running worker.
    from_settings: frozenset = frozenset()

    def resolved(self):
        """Return a copy with every unset knob filled from settings."""
        lease = float(self.lease if self.lease is not None else settings.LEASE_SECONDS)
        heartbeat = self.heartbeat if self.heartbeat is not None else settings.HEARTBEAT_INTERVAL
        return Options(
            queues=tuple(self.queues or settings.WORKER_QUEUES or ["*"]),
            kinds=tuple(self.kinds or settings.WORKER_KINDS or ()),
            concurrency=int(self.concurrency or settings.WORKER_CONCURRENCY),
            threads=int(self.threads or settings.WORKER_THREADS),
            batch=int(self.batch or settings.WORKER_BATCH),
            lease=lease,
            poll=float(self.poll if self.poll is not None else settings.POLL_INTERVAL),
            aging=float(self.aging if self.aging is not None else settings.AGING_INTERVAL),
            # Renew well inside the lease so one slow round trip does not lose it.
            heartbeat=float(heartbeat if heartbeat else lease / 3),
            recovery_interval=float(
                self.recovery_interval if self.recovery_interval is not None else settings.RECOVERY_INTERVAL
            ),
            grace=float(self.grace if self.grace is not None else settings.GRACE_SECONDS),
            timeout=self.timeout if self.timeout is not None else settings.DEFAULT_TIMEOUT,
            max_jobs=self.max_jobs if self.max_jobs is not None else settings.WORKER_MAX_JOBS,
            max_runtime=self.max_runtime if self.max_runtime is not None else settings.WORKER_MAX_RUNTIME,
            burst=bool(self.burst if self.burst is not None else settings.WORKER_BURST),
            name=self.name or execution.default_worker_id(),
            from_settings=frozenset(
                knob
                for knob, given in (
                    ("lease", self.lease),
                    ("aging", self.aging),
                    ("recovery_interval", self.recovery_interval),
                    (
                        "heartbeat",
                        self.heartbeat if self.heartbeat is not None else settings.HEARTBEAT_INTERVAL,
                    ),
                )
                if given is None
            ),
        )

    def current(self):
        """These options with the knobs from runtime settings read again (conf caches
        them for RUNTIME_SETTINGS_TTL, so this costs no query); self when none changed."""
        if not self.from_settings:
            return self
        knobs = {
            "lease": float(settings.LEASE_SECONDS),
            "aging": float(settings.AGING_INTERVAL),
            "recovery_interval": float(settings.RECOVERY_INTERVAL),
        }
        changes = {k: v for k, v in knobs.items() if k in self.from_settings and getattr(self, k) != v}
        if "heartbeat" in self.from_settings:
            heartbeat = changes.get("lease", self.lease) / 3
            if heartbeat != self.heartbeat:
                changes["heartbeat"] = heartbeat
        return replace(self, **changes) if changes else self


def run_once(options=None, *, worker_id=None):
    """Claim one batch and run it here, in this process; return [(job_id, outcome)].
    The jobs of a chunked kind run in chunks of what the claim brought (no waiting)."""
    options = (options or Options()).resolved()
    worker_id = worker_id or f"{options.name}/0.0"
    out = []
    for item in grouped(_claim(options, worker_id, options.batch)):
        if item.__class__ is Chunk:
            out.extend((job.id, state) for job, state in execution.execute_chunk(item.jobs, worker_id))
        else:
            out.append((item.id, execution.execute(item, worker_id)))
    return out


class Chunk:
    """Claimed jobs of one chunked kind, for one handler call."""

    __slots__ = ("jobs", "kind", "since", "size", "wait")

    def __init__(self, kind, chunking, size):
        self.jobs = []
        self.kind = kind
        self.size = size  # the kind's chunk size, within the child's room for it
        self.wait = chunking.wait_ms / 1000
        self.since = time.monotonic()


def grouped(jobs, *, room=None, plain=None):
    """``jobs`` with those of a chunked kind gathered into Chunks of at most its size (and
    ``room``), each where its first job was. ``plain``: a set of kinds known not to be
    chunked, added to (a worker's cache: resolving a Task kind imports its module)."""
    if plain is not None and all(job.kind in plain for job in jobs):
        return jobs
    chunkings = {}
    for kind in {job.kind for job in jobs}:
        if plain is not None and kind in plain:
            continue
        chunking = registry.chunking(kind)
        if chunking is not None:
            chunkings[kind] = chunking
        elif plain is not None:
            if len(plain) >= 1024:
                plain.clear()
            plain.add(kind)
    if not chunkings:
        return jobs
    out, filling = [], {}
    for job in jobs:
        chunking = chunkings.get(job.kind)
        if chunking is None:
            out.append(job)
            continue
        chunk = filling.get(job.kind)
        if chunk is None or len(chunk.jobs) >= chunk.size:
            size = chunking.size if room is None else max(1, min(chunking.size, room))
            chunk = filling[job.kind] = Chunk(job.kind, chunking, size)
            out.append(chunk)
        chunk.jobs.append(job)
    return out


def _claim_options(options, limit):
    return {
        "limit": limit,
        "queues": list(options.queues),
        "kinds": list(options.kinds) or None,
        "lease_seconds": options.lease,
        "aging": options.aging,
    }


def _claim(options, owner, limit):
    now = timezone.now()
    return execution.claimed(transitions.claim(owner, now=now, **_claim_options(options, limit)), now)


class Loop:
    """One child process: threads that take jobs from a local buffer refilled by claims."""

    def __init__(self, options, owner, slots, budget, inherited=()):
        self.options = options
        self.owner = owner
        self.slots = slots
        # Claimed jobs handed over from the child this one replaces (transitions.hand_over).
        self.inherited = list(inherited)
        self.budget = budget
        self.buffer = deque()
        self.lock = threading.Lock()
        # job id -> its Slots buffer cell, for the jobs in self.buffer.
        self.buffered = {}
        self.cell_lock = threading.Lock()
        self.stopping = threading.Event()
        self.waiter = None
        self.acks = []
        # The deferred attempt spans of self.acks' jobs (with a tracer provider set): each
        # ends with what their acknowledgement recorded (telemetry.acknowledged).
        self.ack_spans = []
        self.acks_since = 0.0
        self.ack_lock = threading.Lock()
        # One acknowledgement in flight at a time: its jobs keep their Slots cells until it
        # commits, and Slots has room for one batch in flight and one filling.
        self.flush_lock = threading.Lock()
        self.claim_errors = 0
        # A --burst worker's empty claim was tried once more (_next).
        self.burst_rechecked = False
        # Kinds seen not to be chunked (grouped()); a chunk's room: its thread's Slots cells.
        self.plain = set()
        self.chunk_room = slots.chunk + 1

    def run(self):
        """Run until stopped, drained (burst) or out of budget; release what is left."""
        telemetry.bind_worker(self.owner)
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        # Ctrl-C reaches the whole process group; the supervisor decides what it means.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.waiter = Waiter.for_connection(self.options, self.slots.wakeups)
        for job in self.inherited:
            self.buffered[job.id] = self.slots.hold_buffered(job.id, job.attempts)
        self.buffer.extend(self._grouped(self.inherited))
        threading.Thread(target=self._flusher, name="jq-acks", daemon=True).start()
        try:
            if self.options.threads == 1:
                self._thread(0)
            else:
                threads = [
                    threading.Thread(target=self._thread, args=(i,), name=f"jq-{i}", daemon=True)
                    for i in range(self.options.threads)
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    # A timed join keeps the main thread free to run signal handlers.
                    while t.is_alive():
                        t.join(0.2)
            self._release_buffer()
        finally:
            if self.waiter:
                self.waiter.close()
        self.slots.mark_clean()

    def _thread(self, i):
        try:
            while True:
                job = self._next()
                if job is None:
                    return
                if job.__class__ is Chunk:
                    self._run_chunk(i, job)
                else:
                    self._run(i, job)
        finally:
            connection.close()

    def _next(self):
        with self.lock:
            while not self.stopping.is_set():
                if self.buffer:
                    return self.buffer.popleft()
                if self.waiter.wait_first and not self.budget.spent:
                    # The last claim came back short: claim again on news (wakeup.py).
                    self._flush_acks()
                    self.waiter.wait(self.options.poll, self.stopping)
                    continue
                limit = self.budget.take(self.options.batch)
                if not limit:
                    self._flush_acks()
                    return None
                try:
                    self.options = self.options.current()  # runtime settings (core/runtime.py)
                    asked = time.monotonic()
                    jobs = self._settle_and_claim(limit)
                    if self.claim_errors:
                        outages.answered(self.owner)  # the episode's closing line
                    self.claim_errors = 0
                    if jobs:
                        self.burst_rechecked = False
                        self.slots.leases_hold_until(asked + self.options.lease)
                except Exception as exc:
                    self.claim_errors += 1
                    close_old_connections()
                    connection.close()
                    if outages.is_outage(exc):
                        # Expected, and said once per episode (outages.py).
                        outages.wait_for_database(self.owner, exc, self.stopping)
                    elif self.claim_errors == 1:
                        # The traceback once; a line per retry after that.
                        log.exception(
                            "claim failed worker=%s; retrying every %ss", self.owner, self.options.poll
                        )
                    else:
                        log.warning(
                            "claim failed again worker=%s (%s times): %s", self.owner, self.claim_errors, exc
                        )
                    self._release_orphans()
                    jobs = []
                self.budget.give_back(limit - len(jobs))
                self.waiter.claimed(len(jobs), limit)
                if jobs:
                    with self.cell_lock:
                        for job in jobs:
                            self.buffered[job.id] = self.slots.hold_buffered(job.id, job.attempts)
                    self.buffer.extend(self._grouped(jobs))
                    continue
                # A burst worker leaves when the queue is empty, not when one claim
                # failed: it retries a few polls first, as a long-running one retries always.
                # Nor on one empty claim where claims skip locked rows: a ready job another
                # transaction held for an instant was passed over; a second claim, a poll
                # later, sees it.
                if self.options.burst and not self.claim_errors and not self.burst_rechecked:
                    self.burst_rechecked = transitions.claims_skip_locked()
                    if self.burst_rechecked:
                        self.stopping.wait(self.options.poll)
                        continue
                if self.options.burst and not 0 < self.claim_errors < BURST_CLAIM_RETRIES:
                    return None
                try:
                    self.waiter.wait(self.options.poll, self.stopping)
                except Exception:  # the waiters handle their own; never lose the thread
                    log.exception("waiting for work failed worker=%s", self.owner)
                    self.stopping.wait(self.options.poll)
            return None

    def _run(self, i, job):
        cell = self.buffered[job.id]
        if self.slots.buffered_abort_requested(cell, job.id):
            return self._abort_unstarted(job)
        timeout = job.timeout if job.timeout is not None else self.options.timeout
        if timeout:
            # This job may get the process killed: settle the finished ones first.
            self._flush_acks()
        if time.monotonic() > self.slots.leases_until:
            # Stalled past the lease (stopped, swapped out, a long job ahead): it may no
            # longer be ours. The supervisor's next renewal says (or takes it back).
            self._await_renewal(cell, job.id)
        self.slots.start(i, job.id, job.attempts, timeout)
        # Running first, the flag second; the supervisor the other way round (_take_back).
        if self.slots.taken_back(cell, job.id):
            # It waited too long (or its lease was lost): the supervisor gave it back.
            log.info("not starting id=%s worker=%s: taken back while it waited", job.id, self.owner)
            self.slots.clear(i)
            self._unbuffer(job)
            return
        # Only now: the supervisor always sees the job as buffered or running.
        self._unbuffer(job)
        # The supervisor flags an abort request in this thread's cell (aborting.py).
        probe = functools.partial(self.slots.abort_requested, i, job.id)
        try:
            self._until_started(self._execute_batched, (job, probe), "id=%s", job.id)
        except Exception:
            # Settling failed (database gone?): the lease lapses and recovery takes it back.
            log.exception("could not settle id=%s worker=%s", job.id, self.owner)
            connection.close()
            self._mark_ran({job.id: job.attempts})
        finally:
            self.slots.clear(i)
            self.slots.add_done()

    def _until_started(self, execute, args, what, *what_args):
        """execute(*args), again each time it raises NotStarted: its handler was never
        called, so once the database answers it is started (the lease is still ours: the
        supervisor renews what is running); not when the worker stops meanwhile, which
        is said naming ``what % what_args``."""
        while True:
            try:
                return execute(*args)
            except NotStarted as exc:
                if outages.wait_for_database(self.owner, exc.error, self.stopping) is None:
                    log.warning(
                        "left unstarted %s worker=%s: stopping while the database is away",
                        what % what_args,
                        self.owner,
                    )
                    return None

    def _mark_ran(self, started):
        """Jobs given up on after they ran, {job_id: attempt}: their leases lapse, and
        recovery must spend their attempts, not give them back as if never started
        (transitions.mark_started). Best effort: the database may be what failed."""
        try:
            transitions.mark_started(started, worker_id=self.owner)
        except Exception as exc:
            log.warning("could not mark %s jobs as run worker=%s: %s", len(started), self.owner, exc)
            connection.close()

    def _await_renewal(self, cell, job_id):
        deadline = time.monotonic() + 2 * self.options.heartbeat + 1
        while time.monotonic() > self.slots.leases_until and time.monotonic() < deadline:
            if self.slots.taken_back(cell, job_id) or self.stopping.wait(0.02):
                return

    def _unbuffer(self, job):
        with self.cell_lock:
            self.slots.drop_buffered(self.buffered.pop(job.id))

    def _abort_unstarted(self, job):
        """Cancel a claimed job whose abort the supervisor flagged before it started."""
        try:
            outages.retrying(
                transitions.abort,
                job.id,
                worker_id=self.owner,
                attempt=job.attempts,
                how="was not started (its abort was requested while it waited its turn)",
                who=self.owner,
                stopping=self.stopping,
            )
        except Exception:
            log.exception("could not cancel id=%s worker=%s; its lease will lapse", job.id, self.owner)
            connection.close()
        finally:
            self._unbuffer(job)
            self.slots.add_done()

    def _execute_batched(self, job, abort_probe=None):
        """execution.execute(), except that a success is acknowledged with others in one
        transaction (complete_many). A job is never reported done before its handler
        returned; a crash before the flush means those jobs run again (at-least-once).
        A django.tasks job's task_finished waits for that commit (_acknowledge); a failure
        is settled at once, inside its exception handler, as execute() does."""
        with telemetry.attempt(job, self.owner) as traced:
            output = capture.Capture()  # as execute(): per thread, kept with the attempt
            try:
                result = execution.attempt(job, self.owner, output, abort_probe=abort_probe)
            except NotStarted:
                raise
            except execution.HANDLER_ERRORS as exc:
                traced.failed(exc)
                # Fenced, so a retry after a reconnect is safe even if the first try committed.
                traced.settled(
                    outages.retrying(
                        execution.settle_failure,
                        job,
                        self.owner,
                        exc,
                        output,
                        who=self.owner,
                        stopping=self.stopping,
                    )
                )
                return
            # Acknowledged later, with others (complete_many): its span ends then, with
            # what that recorded (completed, or lost to the fence); its run time ends here.
            waiting = traced.defer()
        with self.ack_lock:
            if not self.acks:
                self.acks_since = time.monotonic()
            cell = self.slots.hold_ack(job.id, job.attempts)
            self.acks.append((job.id, job.attempts, result, cell, output.value(), job))
            if waiting is not None:
                self.ack_spans.append(waiting)
            due = len(self.acks) >= self.options.batch or time.monotonic() - self.acks_since > ACK_DELAY
        # With nothing left in the buffer this thread's next step is a claim, which takes
        # the acknowledgement along (_settle_and_claim); the flusher bounds the wait if
        # another thread holds the claim.
        if due and self.buffer:
            self._flush_acks()

    def _flusher(self):
        """Acknowledge finished jobs that have waited ACK_DELAY, e.g. behind a long job."""
        try:
            while not self.stopping.wait(ACK_DELAY):
                with self.ack_lock:
                    overdue = self.acks and time.monotonic() - self.acks_since > ACK_DELAY
                if overdue:
                    self._flush_acks()
        finally:
            connection.close()

    def _flush_acks(self):
        with self.flush_lock:
            self._flush_acks_locked()

    def _flush_acks_locked(self):
        with self.ack_lock:
            acks, self.acks = self.acks, []
            spans, self.ack_spans = self.ack_spans, []
        if not acks:
            return
        try:
            self._acknowledge(acks, spans)
        finally:
            with self.ack_lock:
                self.slots.drop_acks([a[3] for a in acks])

    def _acknowledge(self, acks, spans):
        now = timezone.now()
        try:
            # The jobs keep their Slots cells meanwhile, so the supervisor renews them.
            completed = outages.retrying(
                transitions.complete_many,
                [(*a[:3], a[4]) for a in acks],
                worker_id=self.owner,
                now=now,
                who=self.owner,
                stopping=self.stopping,
            )
        except Exception as exc:
            # Stopping with the database away (or a bug): the leases lapse and recovery
            # hands the jobs out again: at-least-once. Their spans say so: no outcome (it
            # may have committed, only its answer lost), this error.
            telemetry.unacknowledged(spans, exc)
            log.exception("could not acknowledge %s jobs worker=%s", len(acks), self.owner)
            connection.close()
            self._mark_ran({a[0]: a[1] for a in acks})
            return
        self._acknowledged(acks, spans, completed, now)

    def _acknowledged(self, acks, spans, completed, now):
        """After an acknowledgement of ``acks`` committed ``completed`` (ids): their spans
        end with it, then task_finished goes out for each (execution.acknowledged)."""
        telemetry.acknowledged(spans, completed)
        execution.acknowledged([(a[5], a[2]) for a in acks], completed, now, worker_id=self.owner)

    def _settle_and_claim(self, limit):
        """Claim up to ``limit`` jobs, acknowledging the finished ones in the same
        transaction (transitions.complete_and_claim): one commit per job at --batch 1."""
        with self.flush_lock:
            with self.ack_lock:
                acks, self.acks = self.acks, []
                spans, self.ack_spans = self.ack_spans, []
            if not acks:
                return _claim(self.options, self.owner, limit)
            # One instant for both: the acknowledged jobs' finished_at and the claimed
            # ones' claimed_at, which their TaskResults are built from.
            now = timezone.now()
            try:
                completed, jobs = transitions.complete_and_claim(
                    [(*a[:3], a[4]) for a in acks],
                    self.owner,
                    now=now,
                    **_claim_options(self.options, limit),
                )
            except ClaimNotRead as exc:
                # Committed: the acknowledgements stand (task_finished is owed); what it
                # leased, the caller's retry path gives back (_release_orphans).
                self._acknowledged(acks, spans, exc.completed, now)
                raise
            except Exception:
                # Both rolled back: acknowledge on their own, and let the caller's retry
                # path deal with the claim.
                connection.close()
                self._acknowledge(acks, spans)
                raise
            finally:
                with self.ack_lock:
                    self.slots.drop_acks([a[3] for a in acks])
            self._acknowledged(acks, spans, completed, now)
            return execution.claimed(jobs, now)

    def _release_orphans(self):
        """After a claim that failed: if it committed and only its answer was lost, the
        jobs it leased are ours but unknown to us; give them back (transitions.release_orphans)."""
        # Under ack_lock no job moves from running to awaiting acknowledgement, so held()
        # misses nothing this child holds; claims are serialised by self.lock.
        try:
            with self.ack_lock:
                keep = set(self.slots.held())
            transitions.release_orphans(self.owner, keep=keep)
        except Exception as exc:
            if not outages.is_outage(exc):
                log.exception("could not release orphaned claims worker=%s", self.owner)
            connection.close()

    def _release_buffer(self):
        self._flush_acks()
        while self.buffer:
            item = self.buffer.popleft()
            for job in item.jobs if item.__class__ is Chunk else (item,):
                self._release_unstarted(job)
        connection.close()

    def _release_unstarted(self, job):
        if self.slots.taken_back(self.buffered[job.id], job.id):
            self._unbuffer(job)
            return
        try:
            transitions.release(job.id, worker_id=self.owner, attempt=job.attempts)
        except Exception:
            log.exception("could not release id=%s; its lease will lapse", job.id)
        finally:
            self._unbuffer(job)

    # --- chunks ----------------------------------------------------------------------------

    def _grouped(self, jobs):
        return grouped(jobs, room=self.chunk_room, plain=self.plain)

    def _run_chunk(self, i, chunk):
        """Run a chunk's jobs in one handler call on thread ``i``; each settles on its own."""
        jobs = []
        for job in self._fill(chunk):
            if self.slots.buffered_abort_requested(self.buffered[job.id], job.id):
                self._abort_unstarted(job)
            else:
                jobs.append(job)
        if not jobs:
            return
        timeout = execution.chunk_timeout(jobs, self.options.timeout)
        if timeout:
            self._flush_acks()  # as _run: this call may get the process killed
        if time.monotonic() > self.slots.leases_until:
            self._await_renewal(self.buffered[jobs[0].id], jobs[0].id)
        # Running first, the flags second, as _run; one taken back is left out, and the
        # rest marked again without it.
        while jobs:
            self.slots.start_chunk(i, [(job.id, job.attempts) for job in jobs], timeout)
            taken = [job for job in jobs if self.slots.taken_back(self.buffered[job.id], job.id)]
            if not taken:
                break
            self.slots.clear_chunk(i)
            for job in taken:
                log.info("not starting id=%s worker=%s: taken back while it waited", job.id, self.owner)
                self._unbuffer(job)
                jobs.remove(job)
        if not jobs:
            return
        for job in jobs:
            self._unbuffer(job)
        probes = [
            functools.partial(self.slots.chunk_abort_requested, i, k, job.id) for k, job in enumerate(jobs)
        ]
        try:
            self._until_started(
                self._execute_chunk, (jobs, probes), "a chunk of %s kind=%s", len(jobs), chunk.kind
            )
        except Exception:
            # As _run: the leases lapse and recovery takes back what did not settle.
            log.exception(
                "could not settle a chunk of %s kind=%s worker=%s", len(jobs), chunk.kind, self.owner
            )
            connection.close()
            self._mark_ran({job.id: job.attempts for job in jobs})
        finally:
            self.slots.clear_chunk(i)
            self.slots.add_done(len(jobs))

    def _execute_chunk(self, jobs, probes):
        retrying = functools.partial(outages.retrying, who=self.owner, stopping=self.stopping)
        execution.execute_chunk(jobs, self.owner, abort_probes=probes, retrying=retrying)

    def _fill(self, chunk):
        """The chunk's jobs, with more of its kind claimed until it holds its size or its
        chunk_wait_ms (from its claim) is over; one claim at least, even with no wait."""
        jobs = chunk.jobs
        deadline = chunk.since + chunk.wait
        while len(jobs) < chunk.size and not self.stopping.is_set():
            want = chunk.size - len(jobs)
            more = self._claim_more(chunk.kind, want)
            jobs.extend(more)
            if len(more) == want:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.stopping.wait(min(CHUNK_FILL_POLL, left))
        return jobs

    def _claim_more(self, kind, want):
        """Claim up to ``want`` more jobs of ``kind`` into this child's Slots, as _next
        claims (under self.lock: _release_orphans must see every claim recorded)."""
        with self.lock:
            limit = self.budget.take(min(want, settings.MAX_BATCH))
            if not limit:
                return []
            jobs = []
            try:
                asked = time.monotonic()
                jobs = _claim(replace(self.options, kinds=(kind,)), self.owner, limit)
                if jobs:
                    self.slots.leases_hold_until(asked + self.options.lease)
            except Exception as exc:
                log.warning("claim to fill a chunk failed kind=%s worker=%s: %s", kind, self.owner, exc)
                close_old_connections()
                connection.close()
                self._release_orphans()
            self.budget.give_back(limit - len(jobs))
            with self.cell_lock:
                for job in jobs:
                    self.buffered[job.id] = self.slots.hold_buffered(job.id, job.attempts)
            return jobs


def child_main(options, owner, slots, budget, parent_pid, inherited=()):
    """Entry point of a forked child; never returns."""
    code = 0
    try:
        _die_with_parent(parent_pid)
        outages.forked(on_begin=slots.add_reconnect)
        connections.close_all()
        Loop(options, owner, slots, budget, inherited).run()
    except BaseException:
        log.exception("worker child %s failed", owner)
        code = 1
    finally:
        try:
            connections.close_all()
            telemetry.flush()  # a batching span processor's last spans: os._exit skips its own
        finally:
            # Skip the parent's atexit hooks and buffers (pytest, Django): this is a fork.
            os._exit(code)


def _die_with_parent(parent_pid):
    """Ask Linux to SIGKILL this child if the supervisor dies, so no orphan keeps running
    jobs whose leases nobody renews."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
