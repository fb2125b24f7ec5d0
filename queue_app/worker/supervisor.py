"""The prefork supervisor behind runworker: forks the children, watches them, and does
what only a process that outlives them can do.

- Timeouts: a child whose job passed its deadline is SIGKILLed (a handler stuck in C
  code never yields, so nothing gentler works) and replaced; the job fails with a
  timeout error and follows the normal retry / dead-letter path.
- Aborts (aborting.py): every ABORT_CHECK_INTERVAL it looks for abort requests on the
  jobs its children run and flags them in shared memory; a job still running
  ABORT_GRACE_SECONDS later has its child killed and replaced, and is cancelled.
- Crashes: a child that dies on its own (os._exit, segfault) has the job it was running
  failed with the exit status as the error, its unstarted claims released, and is
  replaced.
- Heartbeat: renews the leases of the jobs its children report holding in shared
  memory (running, finished awaiting their acknowledgement, buffered), so a child busy
  in C code still keeps its leases, while a job whose outcome a child could not record
  (it gave up on it) is not renewed: its lease lapses and recovery takes it back with
  its attempt spent. It also stamps the registry row, where it reads stop requests.
- Recovery of expired leases at start and every recovery interval.
- Wake-ups (wakeup.py): one watch for new work (LISTEN, or a look at the database every
  few milliseconds) on a thread of its own, so the 50 ms tick never blocks on it; each
  piece of news wakes one idle child, not all of them. The watch pauses around every
  fork: a child inherits neither its thread's locks nor its connection.
- Shutdown: the first SIGTERM/SIGINT (or a stop request) tells the children to stop
  leasing and finish; after the grace period the children are killed: a job still
  running fails (its attempt spent, so a job longer than the grace cannot run forever
  across deploys), one never started is released. A second signal kills the children
  at once and settles what they held the same way: the running jobs fail (and a Task's
  task_finished goes out), the unstarted ones are released; nothing waits for a lease.

Each child leases under its own owner id, ``<worker name>/<run token>/<slot>.<generation>``:
unique to this run, so the supervisor settles exactly a dead child's jobs, and a later
worker reusing the name never renews (adopts) this run's leases.
"""

import contextlib
import logging
import multiprocessing
import os
import signal
import time
import uuid

from django.db import DatabaseError, connections

from queue_app.conf import settings
from queue_app.core import aborting, events, flow, telemetry, transitions
from queue_app.handlers import registry
from queue_app.tasks import running as task_running
from queue_app.worker import outages, wakeup
from queue_app.worker import registry as workers
from queue_app.worker import schedules as scheduling
from queue_app.worker.loop import Options, child_main
from queue_app.worker.slots import Budget, Slots, WakeUps

log = logging.getLogger("queue_app")

TICK = 0.05
# Seconds between looks for a stop request: one indexed read, so `stopworkers` takes
# effect within about a second whatever the heartbeat interval.
STOP_CHECK = 1.0
# Between tries to register while the database refuses (doubling from the first).
REGISTER_RETRY_MIN = 0.25
REGISTER_RETRY_MAX = 5.0


class Child:
    def __init__(self, slot, generation, owner, slots, pid):
        self.slot = slot
        self.generation = generation
        self.owner = owner
        self.slots = slots
        self.pid = pid
        self.timed_out = None  # (job_id, attempt, timeout) once killed for overrunning
        self.timed_out_with = set()  # the ids of the chunk that overran with it (Slots.companions)
        self.aborts = {}  # job_id -> (attempt, kill deadline) once its abort was requested
        self.killed_for_abort = False
        self.buffered_since = {}  # (job_id, attempt) -> when the heartbeat first saw it buffered


def _timeout_error(job_id, seconds):
    return events.error(
        "TimeoutError", f"job {job_id} ran past its {seconds:g}s timeout; its worker process was killed"
    )


def _crash_error(how, finished=False):
    what = "that had run the job" if finished else "running the job"
    tail = " before the job's completion was recorded" if finished else ""
    return events.error("WorkerCrashed", f"the worker process {what} {how}{tail}")


def _shutdown_error(why):
    return events.error("WorkerStopped", f"killed at shutdown: the job was still running when {why}")


def _describe(status):
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            return f"was killed by signal {signal.Signals(sig).name}"
        except ValueError:
            return f"was killed by signal {sig}"
    return f"exited with code {os.WEXITSTATUS(status)}"


class Supervisor:
    def __init__(self, options):
        self.options = options
        self.ctx = multiprocessing.get_context("fork")
        self.budget = Budget(self.ctx, options.max_jobs)
        self.wakeups = WakeUps(self.ctx)
        self.watcher = None
        self.children = {}  # pid -> Child
        self.generations = [0] * options.concurrency
        self.signals = 0
        self.stopping = False
        # Quiet (a quiet request): children told to finish and leave, none spawned again,
        # the supervisor up and heartbeating until it is told to stop.
        self.quiet = False
        self.stop_deadline = None
        self.record = None
        self.done_by_gone = 0
        self.reconnects_by_gone = 0
        self.next_abort_check = 0.0
        self.run_token = uuid.uuid4().hex[:12]

    # --- lifecycle ---------------------------------------------------------------------

    def run(self):
        telemetry.bind_worker(self.options.name)
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.record = self._register()
            if self.record is None:  # stopped before the database let it start
                return 0
            return self._run()
        finally:
            if self.watcher is not None:
                self.watcher.stop()
            for s, handler in previous.items():
                signal.signal(s, handler)
            connections.close_all()

    def _register(self):
        """Register this worker, waiting out a database that refuses it (down, out of
        connections, locked, disk full): a process manager restarting a worker that exits
        at once gives up after a few tries and leaves it down. A name in use is a real
        refusal and is raised. Return None if a signal asked it to stop meanwhile."""
        o = self.options
        delay, refused_since = REGISTER_RETRY_MIN, None
        while not self.signals:
            try:
                record = workers.register(
                    o.name,
                    pid=os.getpid(),
                    queues=o.queues,
                    kinds=o.kinds,
                    concurrency=o.concurrency,
                    threads=o.threads,
                )
            except DatabaseError as exc:
                connections.close_all()
                if refused_since is None:  # once per episode, not once per try
                    refused_since = time.monotonic()
                    log.warning(
                        "worker %s: the database refused the start (%s); retrying",
                        o.name,
                        " ".join(str(exc).split()),
                    )
                time.sleep(delay)
                delay = min(2 * delay, REGISTER_RETRY_MAX)
                continue
            if refused_since is not None:
                log.warning(
                    "worker %s: the database answered after %.1fs", o.name, time.monotonic() - refused_since
                )
            return record
        return None

    def _run(self):
        o = self.options
        log.info(
            "worker %s started: queues=%s kinds=%s concurrency=%s threads=%s batch=%s lease=%ss",
            o.name,
            ",".join(o.queues),
            ",".join(o.kinds) or "*",
            o.concurrency,
            o.threads,
            o.batch,
            o.lease,
        )
        started = time.monotonic()
        self._recover()
        # Flow control and cron (flow.py, scheduling.py): settings into their tables,
        # then every worker ticks the schedules; the tick's unique keys make that safe.
        self._guard(flow.sync_limits)
        self._guard(scheduling.sync_schedules)
        next_schedule = time.monotonic()
        self.watcher = self._guard(wakeup.Watcher.for_connection, o, self.wakeups)
        with self._forking():
            for slot in range(o.concurrency):
                self._spawn(slot)
        next_beat = time.monotonic() + o.heartbeat
        next_recovery = time.monotonic() + o.recovery_interval
        next_stop_check = time.monotonic() + STOP_CHECK
        while True:
            now = time.monotonic()
            if o is not self.options:  # runtime settings changed (_heartbeat)
                o = self.options
                next_beat = min(next_beat, now + o.heartbeat)
                next_recovery = min(next_recovery, now + o.recovery_interval)
            if self.signals >= 2:
                return self._stop_now()
            if self.signals and not self.stopping:
                self._begin_stop("signal")
            if o.max_runtime and not self.stopping and now - started >= o.max_runtime:
                self._begin_stop("max runtime reached")
            self._reap()
            self._enforce_timeouts()
            self._enforce_aborts(now)
            if now >= next_beat:
                next_beat = now + o.heartbeat
                self._heartbeat()
            if now >= next_stop_check and not self.stopping:
                next_stop_check = now + STOP_CHECK
                asked = self._guard(workers.requested, self.record.id, default=None)
                if asked == workers.STOP:
                    self._begin_stop("stop requested")
                elif asked == workers.QUIET and not self.quiet:
                    self._begin_quiet()
            if o.recovery_interval and now >= next_recovery:
                next_recovery = now + o.recovery_interval
                self._recover()
            if settings.SCHEDULE_INTERVAL and not self.stopping and now >= next_schedule:
                next_schedule = now + float(settings.SCHEDULE_INTERVAL)
                self._guard(scheduling.tick)
            if self.stopping and self.children and now >= self.stop_deadline:
                self._kill_all("grace period over", settle=f"the {o.grace:g}s grace period ended")
            if not self.children and (self.stopping or not self.quiet):
                break
            time.sleep(TICK)
        self._finish()
        return 0

    def _on_signal(self, signum, frame):
        self.signals += 1

    def _begin_stop(self, why):
        self.stopping = True
        self.stop_deadline = time.monotonic() + self.options.grace
        log.info(
            "worker %s stopping (%s): finishing claimed jobs within %ss",
            self.options.name,
            why,
            self.options.grace,
        )
        self._guard(workers.mark_stopping, self.record.id)
        for child in self.children.values():
            self._signal(child, signal.SIGTERM)

    def _begin_quiet(self):
        self.quiet = True
        log.info(
            "worker %s quiet (quiet requested): leasing no more, running what it holds", self.options.name
        )
        self._guard(workers.mark_quiet, self.record.id)
        # A child told to stop claims no more, runs what it started, hands back its
        # unstarted claims and exits; _reap spawns none in its place while quiet.
        for child in self.children.values():
            self._signal(child, signal.SIGTERM)

    def _stop_now(self):
        log.warning(
            "worker %s stopping at once: its running jobs fail, the rest are released", self.options.name
        )
        self._kill_all("second signal", settle="a second stop signal came")
        self._guard(
            workers.deregister, self.record.id, jobs_done=self._jobs_done(), db_reconnects=self._reconnects()
        )
        return 1

    def _finish(self):
        # The children released what they never started, and the killed ones were settled.
        # Still leased here: jobs a child gave up on (their outcome could not be recorded).
        # Their handlers may have run, so they are not released (that would refund the
        # attempt): their leases lapse and recovery spends it.
        for owner, held in self._guard(workers.leased_by, self._owner_prefix(), default={}).items():
            for job_id, attempt in held:
                log.warning(
                    "left leased id=%s attempt=%s worker=%s: its lease lapses and recovery takes it",
                    job_id,
                    attempt,
                    owner,
                )
        self._guard(
            workers.deregister, self.record.id, jobs_done=self._jobs_done(), db_reconnects=self._reconnects()
        )
        log.info("worker %s stopped after %s jobs", self.options.name, self._jobs_done())

    # --- children ------------------------------------------------------------------------

    def _spawn(self, slot, inherit=None):
        """Fork the child for ``slot``; ``inherit`` (the child it replaces, killed for a
        timeout, and that child's unstarted claims) hands those claims to the new one."""
        self.generations[slot] += 1
        gen = self.generations[slot]
        owner = f"{self._owner_prefix()}{slot}.{gen}"
        inherited, asked = [], time.monotonic()
        if inherit:
            dead, pairs = inherit
            inherited = (
                self._guard(
                    transitions.hand_over,
                    pairs,
                    from_owner=dead.owner,
                    to_owner=owner,
                    lease_seconds=self.options.lease,
                )
                or []
            )
            moved = {job.id for job in inherited}
            for job_id, attempt in pairs:
                if job_id not in moved:  # abort requested, or no longer the dead child's
                    self._guard(transitions.release, job_id, worker_id=dead.owner, attempt=attempt)
            if inherited:
                log.info("handed %s claimed jobs from %s to %s", len(inherited), dead.owner, owner)
        # Batched acks flush at `batch` pending, so at most batch + threads - 1 fill while
        # as many wait for the one flush in flight to commit (worker.Loop.flush_lock).
        acks = 2 * (self.options.batch + self.options.threads)
        # A child claims at most `batch` at a time, and only into an empty buffer; each
        # thread may hold one chunk more, claimed to fill it (Loop._fill). A chunk runs at
        # most the larger of `batch` and the largest chunk registered by now: a chunked
        # Task first imported in the child gets that much room, not its own size.
        room = max(registry.largest_chunk(), self.options.batch)
        wakeups = self.wakeups if self.watcher is not None else None
        slots = Slots(
            self.options.threads,
            acks,
            buffered=self.options.batch + self.options.threads * room,
            wakeups=wakeups,
            chunk=room - 1,
        )
        if inherited:  # their leases were just extended (hand_over)
            slots.leases_hold_until(asked + self.options.lease)
        with self._forking():
            # No socket or SQLite handle may be shared across the fork.
            connections.close_all()
            parent = os.getpid()
            pid = os.fork()
            if pid == 0:
                child_main(self.options, owner, slots, self.budget, parent, inherited)
        self.children[pid] = Child(slot, gen, owner, slots, pid)
        log.debug("spawned child pid=%s owner=%s", pid, owner)

    def _forking(self):
        """The watch paused (wakeup.Watcher.paused) around forks, if there is one."""
        return self.watcher.paused() if self.watcher is not None else contextlib.nullcontext()

    def _owner_prefix(self):
        return workers.owner_prefix(self.options.name, self.run_token)

    def _signal(self, child, sig):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, sig)

    def _kill_all(self, why, settle=None):
        """Kill every child; with ``settle`` (why, for the running jobs' error), record what
        each had in hand as for a child that died (else only the jobs it finished: the
        rest's leases lapse)."""
        for child in list(self.children.values()):
            log.warning("killing child pid=%s (%s)", child.pid, why)
            self._signal(child, signal.SIGKILL)
        for pid, child in list(self.children.items()):
            _, status = os.waitpid(pid, 0)
            self.done_by_gone += child.slots.done
            self.reconnects_by_gone += child.slots.reconnects
            del self.children[pid]
            if settle:
                self._settle_dead_child(child, status, shutdown=settle)
            else:
                self._settle_unacked(child, _describe(status))

    def _settle_unacked(self, child, how):
        # Their handlers ran; only the record was lost. Failing them (not releasing)
        # keeps the attempt counted and the history true: at-least-once, recorded.
        for job_id, attempt in child.slots.unacked():
            log.warning(
                "unacknowledged id=%s attempt=%s worker=%s: child %s", job_id, attempt, child.owner, how
            )
            if self._guard(
                transitions.fail,
                job_id,
                worker_id=child.owner,
                attempt=attempt,
                error=_crash_error(how, finished=True),
            ):
                # A django.tasks job rides the batched acks too: its task_finished is sent here.
                self._guard(task_running.finished_elsewhere, job_id)

    def _reap(self):
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.children.pop(pid, None)
            if child is None:
                continue
            self.done_by_gone += child.slots.done
            self.reconnects_by_gone += child.slots.reconnects
            clean = child.slots.clean and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
            if not clean:
                # Killed for a timeout: its replacement takes over its unstarted claims
                # rather than releasing them for a new claim each (a timeout storm's churn).
                leasing = not (self.stopping or self.quiet)
                inherit = child.timed_out is not None and leasing
                unstarted = self._settle_dead_child(child, status, release=not inherit)
                if leasing:
                    self._spawn(child.slot, inherit=(child, unstarted) if inherit and unstarted else None)

    def _settle_dead_child(self, child, status, shutdown=None, release=True):
        """Record what a dead child had in hand; ``shutdown``: why it was killed at shutdown.
        Return [(job_id, attempt)] of its unstarted claims, released unless ``release`` is
        False (then the caller hands them over)."""
        how = _describe(status)
        running = child.slots.running()
        for job_id, attempt, _, _ in running:
            if job_id in child.aborts:
                # Killed for ignoring its abort (or died meanwhile): what was asked for.
                why = "was killed after the abort grace" if child.killed_for_abort else f"process {how}"
                log.warning("aborted id=%s attempt=%s worker=%s: %s", job_id, attempt, child.owner, why)
                self._guard(
                    transitions.abort,
                    job_id,
                    worker_id=child.owner,
                    attempt=attempt,
                    how=f"its handler {why}" if child.killed_for_abort else f"its worker {why}",
                )
                continue
            # A crash or a timeout kill counts toward the job's MAX_CRASHES (poison); a
            # kill at shutdown, or for another job's timeout or abort, is not this job's doing.
            crashed = True
            if child.timed_out and (child.timed_out[0] == job_id or job_id in child.timed_out_with):
                error = _timeout_error(job_id, child.timed_out[2])
                log.warning("timed out id=%s attempt=%s worker=%s", job_id, attempt, child.owner)
            elif shutdown:
                crashed = False
                error = _shutdown_error(shutdown)
                log.warning("killed at shutdown id=%s attempt=%s worker=%s", job_id, attempt, child.owner)
            else:
                crashed = child.timed_out is None and not child.killed_for_abort
                error = _crash_error(how)
                log.warning("crashed id=%s attempt=%s worker=%s: child %s", job_id, attempt, child.owner, how)
            if self._guard(
                transitions.fail,
                job_id,
                worker_id=child.owner,
                attempt=attempt,
                error=error,
                crashed=crashed,
            ):
                # A django.tasks job's child sent task_started and died: task_finished is sent here.
                self._guard(task_running.finished_elsewhere, job_id)
        self._settle_unacked(child, how)
        # Claimed but never started: give them back without spending an attempt. Only
        # what the child reported buffered: a job it gave up on may have run.
        started = {job_id for job_id, _, _, _ in running}
        # (A job moving to its thread shows in both for an instant.)
        unstarted = [
            (job_id, attempt) for job_id, attempt, _ in child.slots.buffered() if job_id not in started
        ]
        for job_id, attempt in unstarted if release else ():
            self._guard(transitions.release, job_id, worker_id=child.owner, attempt=attempt)
        # Still leased to the dead child: claims it committed but had not yet recorded in
        # shared memory (it died in between). Nobody will run, renew or settle them: take
        # them back now rather than after their lease (their attempt counts: it may have run).
        keep = {job_id for job_id, _ in unstarted} if not release else set()
        for job_id, to in self._guard(transitions.recover, owner=child.owner, exclude=keep, default=()) or ():
            log.warning("took back id=%s from dead child %s: %s", job_id, child.owner, to)
        return unstarted

    def _enforce_timeouts(self):
        now = time.monotonic()
        for child in list(self.children.values()):
            if child.timed_out:
                continue
            for job_id, attempt, started, timeout in child.slots.running():
                if timeout and now > started + timeout:
                    child.timed_out = (job_id, attempt, timeout)
                    # A chunk has one deadline: its other jobs overran it too.
                    child.timed_out_with = {other for other, _ in child.slots.companions(job_id)}
                    log.warning("id=%s overran its timeout; killing child pid=%s", job_id, child.pid)
                    self._signal(child, signal.SIGKILL)
                    break

    def _enforce_aborts(self, now):
        if now >= self.next_abort_check:
            self.next_abort_check = now + float(settings.ABORT_CHECK_INTERVAL)
            running = {
                job_id: (child, attempt)
                for child in self.children.values()
                for job_id, attempt, _, _ in child.slots.running()
                if job_id not in child.aborts
            }
            # Claimed but not started: flagged, the child cancels it instead of starting it.
            waiting = {
                job_id: child
                for child in self.children.values()
                for job_id, _, flagged in child.slots.buffered()
                if not flagged and job_id not in running
            }
            grace = float(settings.ABORT_GRACE_SECONDS)
            for job_id in self._guard(aborting.requested, [*running, *waiting], default=()):
                if job_id in waiting:
                    # Started meanwhile: flagged as running on the next check.
                    waiting[job_id].slots.request_buffered_abort(job_id)
                    continue
                child, attempt = running[job_id]
                # A job sharing its handler call (a chunk) is cancelled when the call
                # returns, never by a kill that would fail the chunk's other jobs.
                alone = len(child.slots.companions(job_id)) <= 1
                if child.slots.request_abort(job_id):
                    child.aborts[job_id] = (attempt, now + grace if alone else float("inf"))
                    log.info(
                        "abort requested id=%s: told child pid=%s, killed in %ss if still running",
                        job_id,
                        child.pid,
                        grace,
                    )
        for child in list(self.children.values()):
            if not child.aborts or child.killed_for_abort:
                continue
            live = {(job_id, attempt) for job_id, attempt, _, _ in child.slots.running()}
            for job_id, (attempt, deadline) in list(child.aborts.items()):
                if (job_id, attempt) not in live:
                    del child.aborts[job_id]  # its handler stopped; the child settled it
                elif now > deadline:
                    # Nothing gentler reaches a handler that does not look (C code, a busy loop).
                    child.killed_for_abort = True
                    log.warning(
                        "id=%s still running after its abort grace; killing child pid=%s", job_id, child.pid
                    )
                    self._signal(child, signal.SIGKILL)
                    break

    # --- database chores -----------------------------------------------------------------

    def _heartbeat(self):
        self.options = self.options.current()  # runtime settings (core/runtime.py)
        in_hand, threads = 0, {}
        for child in list(self.children.values()):
            self._take_back_waiting(child)
            held = child.slots.held()
            in_hand += len(held)
            threads.update(child.slots.threads_running())
            if held:
                # What has reached its handler (running, or done and awaiting its
                # acknowledgement), for recovery to tell from what never started.
                started = dict(child.slots.unacked())
                started.update((job_id, attempt) for job_id, attempt, _, _ in child.slots.running())
                asked = time.monotonic()
                renewed = self._guard(
                    transitions.renew,
                    list(held),
                    worker_id=child.owner,
                    lease_seconds=self.options.lease,
                    started=started,
                )
                if renewed is not None:
                    child.slots.leases_hold_until(asked + self.options.lease)
                    # Lost meanwhile (the child stalled past its lease, say): running them
                    # now would run them twice for nothing.
                    for job_id in set(held) - renewed:
                        child.slots.take_back(job_id)
        self._guard(
            workers.heartbeat,
            self.record.id,
            jobs_in_hand=in_hand,
            jobs_done=self._jobs_done(),
            db_reconnects=self._reconnects(),
            running_threads=threads,
        )

    def _take_back_waiting(self, child):
        """Give back the jobs a child has held unstarted for a third of the lease: it is
        stalled, hung, or busy with a long job, and they can run elsewhere at once instead
        of when their lease lapses (with their attempt returned, as they never ran)."""
        now = time.monotonic()
        buffered = {(job_id, attempt) for job_id, attempt, _ in child.slots.buffered()}
        since = child.buffered_since = {key: child.buffered_since.get(key, now) for key in buffered}
        for (job_id, attempt), first in since.items():
            if now - first < self.options.lease / 3:
                continue
            if self._take_back(child, job_id) and self._guard(
                transitions.release, job_id, worker_id=child.owner, attempt=attempt
            ):
                log.warning(
                    "took back id=%s from %s: claimed %.0fs ago and not started",
                    job_id,
                    child.owner,
                    now - first,
                )

    def _take_back(self, child, job_id, patience=0.05):
        """Flag buffered ``job_id`` taken back; return True once the child cannot start it.

        The child marks a job running, then reads its flag: one that marked it just before
        the flag landed either sees the flag (and clears its running cell at once) or had
        read it already and runs the job. So wait ``patience`` for the running cell to
        clear; a job still running, or finished and awaiting its acknowledgement, started:
        it stays the child's. (One that finished and was acknowledged, or failed, is no
        longer leased, and the release's fence refuses it.)"""
        if not child.slots.take_back(job_id):
            return False
        deadline = time.monotonic() + patience
        while child.slots.is_running(job_id):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        return job_id not in dict(child.slots.unacked())

    def _recover(self):
        self._guard(transitions.recover)

    def _jobs_done(self):
        return self.done_by_gone + sum(c.slots.done for c in self.children.values())

    def _reconnects(self):
        """Database outages this worker waited out: its own and its children's."""
        return (
            outages.episodes.count
            + self.reconnects_by_gone
            + sum(c.slots.reconnects for c in self.children.values())
        )

    def _guard(self, func, *args, default=None, **kwargs):
        """Call a database chore; a failure is logged and retried on the next tick, never
        allowed to take the supervisor (and its children's work) down."""
        try:
            value = func(*args, **kwargs)
        except Exception as exc:
            if outages.is_outage(exc):
                # Expected now and then: one line when it starts, one when it ends.
                outages.episodes.began(self.options.name, exc)
            else:
                log.exception("worker %s: %s failed", self.options.name, getattr(func, "__name__", func))
            connections.close_all()
            return default
        outages.answered(self.options.name)
        return value


def run(options=None):
    """Run a worker until it is stopped (or drained, in burst mode); return the exit code."""
    return Supervisor((options or Options()).resolved()).run()
