"""How an idle worker child learns that work may have arrived: one watch per runworker,
in the supervisor, and one wake-up per piece of news, to one idle child.

The engine says how its database tells (Engine.wake_up): on PostgreSQL a NOTIFY that an
enqueue sends in its transaction (so it arrives only on commit); on SQLite and MariaDB
a value that moves when another connection commits (wake_version), looked at every few
milliseconds, and then the events written since, to tell an enqueue (or a requeue,
retry now, a recovered or released lease) from the workers' own claims and
acknowledgements, which move it too. The engines' modules say why each works and what
it misses; the poll interval stays the worst case everywhere.

Why in the supervisor, and not in every child: when every idle child listened, one
enqueue woke them all and they raced for one job (on a two-core host, four processes
for one row). The supervisor's Watcher thread turns each piece of news into one
wake-up on a semaphore its children share (slots.WakeUps); the kernel hands it to one
waiting child. That child claims; a full batch passes a wake-up on to the next idle
child (there may be more), a short one tells it the queue was empty a moment ago, so
after running those jobs it waits for news instead of claiming again at once.
"""

import contextlib
import logging
import threading
import time

from asgiref.sync import sync_to_async
from django.db import connection, connections, router

from queue_app import engines
from queue_app.conf import settings
from queue_app.engines.base import ENDED_MANY, ended_channel
from queue_app.exceptions import JobNotFound, WaitTimeout
from queue_app.models import Job

log = logging.getLogger("queue_app")

# Longest an idle child or the watch thread goes without looking at its stop flag: the
# bound on how long a stop (or a fork, which pauses the watch) waits for them.
SLICE = 0.05
# Between looks at data_version after a write woke the watch (VersionWatcher).
COMMIT_LOOK = 0.0005


class Waiter:
    """How an idle child waits without a watch (--burst, or no wake-up on this
    database): sleep for the poll interval."""

    # Whether the child should wait for news before its next claim (SharedWaiter).
    wait_first = False

    @staticmethod
    def for_connection(options, wakeups=None):
        """Return the waiter for a child: on its supervisor's wake-ups, or a plain sleep."""
        if options.burst or wakeups is None:
            return Waiter()
        return SharedWaiter(wakeups)

    def wait(self, seconds, stopping):
        stopping.wait(seconds)

    def claimed(self, got, limit):
        """Note that a claim of up to ``limit`` jobs leased ``got``."""

    def close(self):
        pass


class SharedWaiter(Waiter):
    """Wait for a wake-up from the supervisor's watch, or for the poll interval."""

    def __init__(self, wakeups):
        self.wakeups = wakeups
        self.wait_first = False

    def wait(self, seconds, stopping):
        self.wait_first = False
        end = time.monotonic() + seconds
        # Short slices: a SIGTERM does not cut a semaphore wait short.
        while not stopping.is_set():
            left = end - time.monotonic()
            if left <= 0 or self.wakeups.take(min(left, SLICE)):
                return

    def claimed(self, got, limit):
        if got and got >= limit:
            self.wakeups.post()
        # Fewer than asked for: nothing else was ready when the claim ran, and what
        # arrives after it sends a wake-up, which waits on the semaphore for us.
        self.wait_first = 0 < got < limit


class Watcher:
    """The supervisor's watch for new work: a thread that turns the database's news
    into wake-ups for idle children (slots.WakeUps). A failure is logged and slept out
    as a poll, never allowed to end the thread; the children poll meanwhile."""

    @staticmethod
    def for_connection(options, wakeups):
        """Return the watch for this database, or None (--burst, or nothing to watch)."""
        how = None if options.burst else engines.of(connection).wake_up()
        if how is not None and how.channel:
            return ListenWatcher(wakeups, options.poll, how.channel, options.queues)
        if how is not None and how.interval:
            return VersionWatcher(wakeups, options.poll, how.interval)
        return None

    def __init__(self, wakeups, poll):
        self.wakeups = wakeups
        self.poll = poll
        self.stopping = threading.Event()
        self.thread = None
        self.failing = False
        self.pauses = 0

    def start(self):
        if self.thread is None:
            self.stopping = threading.Event()
            self.thread = threading.Thread(target=self._run, name="jq-wake", daemon=True)
            self.thread.start()

    def stop(self):
        if self.thread is not None:
            self.stopping.set()
            self.thread.join()
            self.thread = None

    @contextlib.contextmanager
    def paused(self):
        """Stop the watch around a fork and start it again after (nested: the outermost).

        A thread running at fork time may hold a lock (a driver's, the allocator's) that
        the child inherits held, and its connection must not be shared with the child:
        a child that closed it would end the supervisor's LISTEN session or SQLite
        handle. Starting again posts one wake-up for what the gap may have hidden."""
        self.pauses += 1
        try:
            if self.pauses == 1:
                self.stop()
            yield
        finally:
            self.pauses -= 1
            if self.pauses == 0:
                self.start()

    def _run(self):
        try:
            while not self.stopping.is_set():
                self.step()
        finally:
            self.reset()
            connections.close_all()  # this thread's own

    def step(self):
        """Watch for one slice of time; a failure sleeps out a poll instead of raising."""
        try:
            self._watch()
            self.failing = False
        except Exception as exc:
            # The database went away (restart, failover): the children poll meanwhile,
            # and the next step connects again.
            if not self.failing:
                log.warning("watching for new work failed (%s); the workers poll until it is back", exc)
            self.failing = True
            self.reset()
            connection.close()
            self.stopping.wait(self.poll)

    def _watch(self):
        raise NotImplementedError

    def reset(self):
        """Forget the connection and what was seen: the next step starts afresh."""


class ListenWatcher(Watcher):
    """Wait for a NOTIFY on ``channel`` for one of the worker's queues."""

    def __init__(self, wakeups, poll, channel, queues=()):
        super().__init__(wakeups, poll)
        self.channel = channel
        # The payload is the queue's name: news for a queue this worker does not serve
        # wakes nobody.
        self.queues = None if not queues or "*" in queues else frozenset(queues)
        self.conn = None

    def _connect(self):
        self.conn = engines.of(connection).listen(self.channel)

    def _watch(self):
        if self.conn is None:
            self._connect()
            self.wakeups.post()
        for note in self.conn.notifies(timeout=SLICE):
            if self.queues is None or note.payload in self.queues:
                self.wakeups.post()

    def reset(self):
        try:
            if self.conn is not None:
                self.conn.close()
        except Exception:
            pass
        self.conn = None


class VersionWatcher(Watcher):
    """Look at a value that moves when another connection commits (every ``interval``,
    or when the engine's commit_watch says something was written) and, when it moved,
    at the events since: wake a child only for one that made a job claimable (the
    workers' own claims and acknowledgements move it too)."""

    def __init__(self, wakeups, poll, interval):
        super().__init__(wakeups, poll)
        self.interval = interval
        self.version = None
        self.last_event = None
        self.commits = None

    def _watch(self):
        engine = engines.of(connection)
        if self.last_event is None:
            self.version = engine.wake_version()
            self.last_event, _ = engine.ready_events_since(None)
            self.commits = engine.commit_watch()
            self.wakeups.post()
        # Woken by a write, look a few times over the next interval: the first write of a
        # transaction wakes the watch before its commit is visible.
        looks = 1
        if self.commits is not None:
            if self.commits.wait(SLICE):
                looks = max(1, round(self.interval / COMMIT_LOOK))
        else:
            self.stopping.wait(self.interval)
        for look in range(looks):
            # A wake-up already waits for the next idle child (while all are busy, those
            # that claim full batches pass them on): one more would add nothing, so this
            # costs no query while the workers drain a backlog.
            if self.stopping.is_set() or self.wakeups.pending():
                return
            if look:
                time.sleep(COMMIT_LOOK)
            version = engine.wake_version()
            if version != self.version:
                self.version = version
                self.last_event, woke = engine.ready_events_since(self.last_event)
                if woke:
                    self.wakeups.post()
                return

    def reset(self):
        if self.commits is not None:
            self.commits.close()
        self.version = self.last_event = self.commits = None


# --- waiting for a job to end (queue_app.wait) ------------------------------------------------

ENDED = ("completed", "dead_letter", "cancelled")


def until_ended(job_id, timeout, *, using=None):
    """Block until job ``job_id`` has ended (completed, dead letter, cancelled) and return
    it; raise WaitTimeout after ``timeout`` seconds, JobNotFound if there is no such job.

    Woken, not polling the job: on PostgreSQL by the NOTIFY each terminal transition
    sends on commit (engines notify_ended), on SQLite and MariaDB by the engine's
    wake_version moving (another connection committed), looked at every wake interval;
    the job's row is read only then. Call it outside a transaction: inside one, a
    snapshot (MariaDB) or the held lock (SQLite) would hide the end."""
    db = using or router.db_for_read(Job)
    deadline = time.monotonic() + timeout
    jobs = Job.objects.using(db)

    def ended():
        job = jobs.filter(id=job_id).first()
        if job is None:
            raise JobNotFound(job_id)
        return job if job.state in ENDED else None

    engine = engines.of(connections[db])
    how = engine.wake_up()
    channel = ended_channel() if how is not None and how.channel else None
    if channel is None:
        interval = how.interval if how is not None else settings.POLL_INTERVAL
        version = None
        while True:
            now_version = engine.wake_version() if how is not None else None
            if (version is None or now_version != version) and (job := ended()) is not None:
                return job
            version = now_version if how is not None else None
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(
                    job_id, timeout, jobs.filter(id=job_id).values_list("state", flat=True).first()
                )
            time.sleep(min(interval, left))
    listening = engine.listen(channel)
    try:
        wanted = str(job_id)
        while True:
            # Read after LISTEN: an end that committed before it is in the row.
            if (job := ended()) is not None:
                return job
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WaitTimeout(
                        job_id, timeout, jobs.filter(id=job_id).values_list("state", flat=True).first()
                    )
                heard = [n.payload for n in listening.notifies(timeout=min(left, 1.0), stop_after=1)]
                if any(p == ENDED_MANY or wanted in p.split(",") for p in heard):
                    break
    finally:
        listening.close()


def wait(target, timeout=30.0, *, using=None):
    """Block until ``target`` (a Job, a django.tasks TaskResult or a job id) has ended;
    return it brought up to date (a job id gives the Job). WaitTimeout after ``timeout``."""
    job = until_ended(int(getattr(target, "id", target)), float(timeout), using=using)
    if hasattr(target, "refresh") and not isinstance(target, Job):
        target.refresh()  # a TaskResult: its status, return value and errors
        return target
    return job


async def await_job(target, timeout=30.0, *, using=None):
    """wait() for async code: the wait runs on a thread of its own, the loop goes on."""
    return await sync_to_async(wait, thread_sensitive=False)(target, timeout, using=using)
