"""Memory a runworker supervisor shares with its forked children (created before the
fork): what each child is running, which finished jobs await their batched
acknowledgement, the --max-jobs budget, and the wake-ups handed to idle children."""

import ctypes
import time
from multiprocessing.sharedctypes import RawArray


class Slots:
    """Shared memory between the supervisor and one child, created before the fork.

    Per thread: job id, attempt, start (time.monotonic(), which every process on the
    host shares), timeout in seconds (0: none) and the id of the job the supervisor
    asks it to abort (aborting.py; an id, so a flag meant for a finished job is inert).
    Then four cells for the whole child: a clean-exit flag, the count of jobs it
    finished, the count of database outages it waited out (outages.py), and until when
    (time.monotonic()) its leases are known to hold: set by its claims and by the
    supervisor's renewals, so a child resuming from a stall does not start a job whose
    lease may have lapsed meanwhile before the supervisor has looked. Then (id, attempt) pairs of jobs that finished but whose batched
    acknowledgement is not yet committed: if the child dies, the supervisor records
    those as run-and-lost rather than unstarted. Then (id, attempt, abort id) of jobs
    claimed but not started yet (the child's buffer), so the supervisor renews exactly
    what the child still holds, releases exactly what it never started, and can flag an
    abort before the job starts. Doubles hold ids exactly up to 2**53.

    The third cell of a buffered job is its flag: the job's id to have it cancelled (an
    abort), minus its id when the supervisor took it back (it sat unstarted for too
    long, or its lease was lost): the child must then not start it. Without a lock
    (one costs 5% of the drain): the child marks a job running, then reads the flag; the
    supervisor sets the flag, then waits until the job is not running (Supervisor._take_back).

    Last, per thread, ``chunk`` cells of (id, attempt, abort id): the other jobs of the
    chunk (registry.chunking) the thread runs in one handler call, its first job in the
    thread's own cell. They share that cell's start and timeout: the chunk has one
    deadline. Written after the first job's cell and cleared before it, so a reader that
    sees a member sees the start and timeout of its chunk.
    """

    WIDTH = 5

    def __init__(self, threads, acks=0, buffered=0, wakeups=None, chunk=0):
        self.threads = threads
        # The supervisor's WakeUps, shared by all its children (None: each child polls).
        self.wakeups = wakeups
        self.ack_base = threads * self.WIDTH + 4
        self.buffer_base = self.ack_base + 2 * acks
        self.chunk = chunk
        self.chunk_base = self.buffer_base + 3 * buffered
        self.cells = RawArray(ctypes.c_double, self.chunk_base + 3 * threads * chunk)
        self.free_acks = list(range(acks))  # used only by the child, after the fork
        self.free_buffered = list(range(buffered))  # likewise

    def hold_ack(self, job_id, attempt):
        """Note a finished, unacknowledged job; return its cell for drop_acks()."""
        i = self.free_acks.pop()
        self.cells[self.ack_base + 2 * i + 1] = attempt
        self.cells[self.ack_base + 2 * i] = job_id
        return i

    def drop_acks(self, cells):
        for i in cells:
            self.cells[self.ack_base + 2 * i] = 0
            self.free_acks.append(i)

    def unacked(self):
        """Return [(job_id, attempt)] of finished jobs whose acknowledgement was pending."""
        out = []
        for i in range(self.ack_base, self.buffer_base, 2):
            if self.cells[i]:
                out.append((int(self.cells[i]), int(self.cells[i + 1])))
        return out

    def hold_buffered(self, job_id, attempt):
        """Note a claimed job waiting in the child's buffer; return its cell."""
        i = self.free_buffered.pop()
        base = self.buffer_base + 3 * i
        self.cells[base + 2] = 0
        self.cells[base + 1] = attempt
        self.cells[base] = job_id
        return i

    def buffered_abort_requested(self, i, job_id):
        return int(self.cells[self.buffer_base + 3 * i + 2]) == job_id

    def taken_back(self, i, job_id):
        """Whether the supervisor took buffered ``job_id`` (in cell ``i``) back."""
        return int(self.cells[self.buffer_base + 3 * i + 2]) == -job_id

    def take_back(self, job_id):
        """Flag buffered ``job_id`` so the child never starts it; return whether it was
        still buffered. The child may have marked it running just before: see
        Supervisor._take_back."""
        for base in range(self.buffer_base, self.chunk_base, 3):
            if int(self.cells[base]) == job_id:
                self.cells[base + 2] = -job_id
                return True
        return False

    def drop_buffered(self, i):
        """Forget a buffered job: started (its running cell is set first), or given back."""
        self.cells[self.buffer_base + 3 * i] = 0
        self.free_buffered.append(i)

    def buffered(self):
        """Return [(job_id, attempt, abort flagged)] of the jobs waiting in the buffer
        (not those taken back: they are no longer the child's)."""
        out = []
        for base in range(self.buffer_base, self.chunk_base, 3):
            job_id = int(self.cells[base])
            if job_id and int(self.cells[base + 2]) != -job_id:
                out.append((job_id, int(self.cells[base + 1]), int(self.cells[base + 2]) == job_id))
        return out

    def request_buffered_abort(self, job_id):
        """Flag buffered ``job_id`` so the child cancels it instead of starting it; return
        whether it was still buffered. An id, not a bit: a flag that lands on a cell
        reused meanwhile names another job and is inert."""
        for base in range(self.buffer_base, self.chunk_base, 3):
            if int(self.cells[base]) == job_id:
                self.cells[base + 2] = job_id
                return True
        return False

    def held(self):
        """Return {job_id: attempt} of every job the child holds a lease on: running,
        finished awaiting its acknowledgement, or buffered. What it gave up on (its
        outcome could not be recorded) is absent, so its lease lapses."""
        out = {job_id: attempt for job_id, attempt, _ in self.buffered()}
        out.update(self.unacked())
        out.update((job_id, attempt) for job_id, attempt, _, _ in self.running())
        return out

    def start(self, i, job_id, attempt, timeout):
        base = i * self.WIDTH
        # The id last: a reader that sees the id sees the rest.
        self.cells[base + 1] = attempt
        self.cells[base + 2] = time.monotonic()
        self.cells[base + 3] = timeout or 0.0
        self.cells[base + 4] = 0
        self.cells[base] = job_id

    def request_abort(self, job_id):
        """Flag the thread running ``job_id`` to stop; return whether one runs it."""
        for i in range(self.threads):
            base = i * self.WIDTH
            if int(self.cells[base]) == job_id:
                self.cells[base + 4] = job_id
                return True
        for base in range(self.chunk_base, len(self.cells), 3):
            if int(self.cells[base]) == job_id:
                self.cells[base + 2] = job_id
                return True
        return False

    def abort_requested(self, i, job_id):
        return int(self.cells[i * self.WIDTH + 4]) == job_id

    def clear(self, i):
        self.cells[i * self.WIDTH] = 0

    def start_chunk(self, i, jobs, timeout):
        """Mark thread ``i`` running the chunk ``jobs`` [(job_id, attempt)], at most
        ``chunk + 1`` of them, under one ``timeout``."""
        (first_id, first_attempt), *rest = jobs
        self.start(i, first_id, first_attempt, timeout)
        base = self.chunk_base + 3 * self.chunk * i
        for k, (job_id, attempt) in enumerate(rest):
            self.cells[base + 3 * k + 1] = attempt
            self.cells[base + 3 * k + 2] = 0
            self.cells[base + 3 * k] = job_id

    def clear_chunk(self, i):
        """Mark thread ``i`` idle after a chunk (its members first, see the class docstring)."""
        base = self.chunk_base + 3 * self.chunk * i
        for k in range(self.chunk):
            self.cells[base + 3 * k] = 0
        self.clear(i)

    def chunk_abort_requested(self, i, k, job_id):
        """Whether the abort of ``job_id``, member ``k`` (from 1) of thread ``i``'s chunk, was asked."""
        if k == 0:
            return self.abort_requested(i, job_id)
        return int(self.cells[self.chunk_base + 3 * (self.chunk * i + k - 1) + 2]) == job_id

    def _thread_of(self, job_id):
        for i in range(self.threads):
            if int(self.cells[i * self.WIDTH]) == job_id:
                return i
        for base in range(self.chunk_base, len(self.cells), 3):
            if int(self.cells[base]) == job_id:
                return (base - self.chunk_base) // (3 * self.chunk)
        return None

    def companions(self, job_id):
        """Return [(job_id, attempt)] of the jobs running in one call with ``job_id``
        (itself included; just itself if it is no chunk's): they share its deadline."""
        i = self._thread_of(job_id)
        if i is None:
            return []
        out = []
        first = int(self.cells[i * self.WIDTH])
        if first:
            out.append((first, int(self.cells[i * self.WIDTH + 1])))
        base = self.chunk_base + 3 * self.chunk * i
        for k in range(self.chunk):
            member = int(self.cells[base + 3 * k])
            if member:
                out.append((member, int(self.cells[base + 3 * k + 1])))
        return out

    def is_running(self, job_id):
        return any(int(self.cells[i * self.WIDTH]) == job_id for i in range(self.threads)) or any(
            int(self.cells[base]) == job_id for base in range(self.chunk_base, len(self.cells), 3)
        )

    def running(self):
        """Return [(job_id, attempt, started, timeout)] for the jobs the threads run (a
        chunk's members with the start and timeout of its first job's cell)."""
        out = []
        for i in range(self.threads):
            base = i * self.WIDTH
            job_id = int(self.cells[base])
            if job_id:
                out.append((job_id, int(self.cells[base + 1]), self.cells[base + 2], self.cells[base + 3]))
        if self.chunk:
            for base in range(self.chunk_base, len(self.cells), 3):
                job_id = int(self.cells[base])
                if job_id:
                    head = (base - self.chunk_base) // (3 * self.chunk) * self.WIDTH
                    out.append(
                        (job_id, int(self.cells[base + 1]), self.cells[head + 2], self.cells[head + 3])
                    )
        return out

    @property
    def clean(self):
        return self.cells[self.threads * self.WIDTH] == 1

    def mark_clean(self):
        self.cells[self.threads * self.WIDTH] = 1

    @property
    def done(self):
        return int(self.cells[self.threads * self.WIDTH + 1])

    def add_done(self, n=1):
        self.cells[self.threads * self.WIDTH + 1] += n

    @property
    def reconnects(self):
        return int(self.cells[self.threads * self.WIDTH + 2])

    def add_reconnect(self):
        self.cells[self.threads * self.WIDTH + 2] += 1

    @property
    def leases_until(self):
        return self.cells[self.threads * self.WIDTH + 3]

    def leases_hold_until(self, until):
        """Note that every lease the child holds lasts until ``until`` at least."""
        if until > self.cells[self.threads * self.WIDTH + 3]:
            self.cells[self.threads * self.WIDTH + 3] = until

    def threads_running(self):
        """Return {job_id: thread number} of the jobs the threads run now (a chunk's
        members too: its thread's)."""
        out = {}
        for i in range(self.threads):
            job_id = int(self.cells[i * self.WIDTH])
            if job_id:
                out[job_id] = i
        for base in range(self.chunk_base, len(self.cells), 3):
            job_id = int(self.cells[base])
            if job_id:
                out[job_id] = (base - self.chunk_base) // (3 * self.chunk)
        return out


class Budget:
    """Jobs all children may still claim under --max-jobs (None: no limit)."""

    def __init__(self, ctx, max_jobs):
        self.max_jobs = max_jobs
        self.claimed = ctx.Value(ctypes.c_longlong, 0)

    def take(self, want):
        if self.max_jobs is None:
            return want
        with self.claimed.get_lock():
            n = max(0, min(want, self.max_jobs - self.claimed.value))
            self.claimed.value += n
            return n

    def give_back(self, n):
        if self.max_jobs is not None and n:
            with self.claimed.get_lock():
                self.claimed.value -= n

    @property
    def spent(self):
        return self.max_jobs is not None and self.claimed.value >= self.max_jobs


class WakeUps:
    """Wake-ups the supervisor hands to its idle children (wakeup.py), created before
    the fork: a semaphore each idle child waits on, so one wake-up wakes one child
    (the kernel picks a waiter), not every child at once.

    At most one wake-up is held for a child that is not waiting yet: news of work that
    arrives while every child is busy is not lost (the first child to wait takes it and
    claims), and a flurry of it costs one claim, not one per notification. A child that
    claims a full batch passes a wake-up on (there may be more)."""

    def __init__(self, ctx):
        self.semaphore = ctx.Semaphore(0)

    def post(self):
        # Not atomic with the release: two posters may both see 0 and leave 2, which
        # costs one empty claim at most.
        if self.semaphore.get_value() < 1:
            self.semaphore.release()

    def pending(self):
        """Whether a wake-up waits for a child to take it."""
        return self.semaphore.get_value() > 0

    def take(self, timeout):
        """Wait up to ``timeout`` seconds for a wake-up; return whether one came."""
        return self.semaphore.acquire(timeout=max(0.0, timeout))
