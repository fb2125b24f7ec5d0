"""What a chaos scenario counts, and the faults it injects.

Each scenario enqueues jobs through the public API, each execution appends a line to a
marker file (tests.sample_tasks.mark_once), and at the end the marker file and the
event table are read back: executed, never executed, duplicates (and how many of them
the events explain: a second execution needs a `recovered` or `failed` event before it),
stuck (not finished when the scenario ends), lost (finished without ever running, or
gone). It prints one JSON line and fails on lost > 0, stuck > 0 or an unexplained
duplicate.

Sizes: JOBQUEUE_CHAOS_JOBS (small by default, for CI; `make chaos` sets the full ones).
"""

import contextlib
import json
import os
import threading
import time
from collections import Counter

from django.db import connection, connections

from queue_app.models import Event, EventType, Job, State

JOBS = int(os.environ.get("JOBQUEUE_CHAOS_JOBS", "300"))
# For manage() workers: the tests' @task functions may be run.
TASKS_ENV = {"JOBQUEUE_TASK_MODULES": "queue_app,jobqueue_project,tests"}
FINISHED = (State.COMPLETED, State.DEAD_LETTER, State.CANCELLED)


def runs(marker):
    """{n: executions} from the marker file."""
    if not marker.exists():
        return Counter()
    return Counter(int(line) for line in marker.read_text().split())


def wait_for_runs(marker, at_least, timeout=120):
    end = time.monotonic() + timeout
    while sum(runs(marker).values()) < at_least:
        if time.monotonic() > end:
            raise AssertionError(f"fewer than {at_least} executions after {timeout}s")
        time.sleep(0.02)


def wait_finished(ids, timeout=120):
    """Wait until every job of ``ids`` has finished (or ``timeout``); return the seconds taken."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        connections.close_all()  # a fault may have killed this connection too
        if not Job.objects.filter(id__in=ids).exclude(state__in=FINISHED).exists():
            break
        time.sleep(0.2)
    return time.monotonic() - start


def tally(scenario, ids, marker, **extra):
    """``ids`` is {n: job id}. Return the scenario's counts (and print them as one JSON line)."""
    connections.close_all()
    executed = runs(marker)
    jobs = {j.id: j for j in Job.objects.filter(id__in=ids.values())}
    second_chances = Counter(
        Event.objects.filter(
            job_id__in=ids.values(), type__in=[EventType.RECOVERED, EventType.FAILED]
        ).values_list("job_id", flat=True)
    )
    out = Counter()
    for n, job_id in ids.items():
        times = executed.get(n, 0)
        job = jobs.get(job_id)
        out["executed"] += times > 0
        out["never_executed"] += times == 0
        if times > 1:
            out["duplicates"] += times - 1
            out["duplicates_explained"] += min(times - 1, second_chances[job_id])
        if job is None or (job.state in FINISHED and times == 0 and job.state != State.CANCELLED):
            out["lost"] += 1
        elif job.state not in FINISHED:
            out["stuck"] += 1
        out[job.state if job else "missing"] += 1
    result = {
        "scenario": scenario,
        "db": connection.vendor,
        "jobs": len(ids),
        **{
            k: out[k]
            for k in ("executed", "never_executed", "duplicates", "duplicates_explained", "stuck", "lost")
        },
        "states": {k: v for k, v in out.items() if k in State.values or k == "missing"},
        **extra,
    }
    return report(result)


def report(result):
    """Print a scenario's result as one JSON line (and keep it for make chaos's table)."""
    line = json.dumps(result)
    print(line)
    if os.environ.get("JOBQUEUE_CHAOS_OUT"):
        with open(os.environ["JOBQUEUE_CHAOS_OUT"], "a") as f:
            f.write(line + "\n")
    return result


def check(result):
    """The scenario's verdict: nothing lost, nothing stuck, every duplicate explained."""
    assert result["lost"] == 0, result
    assert result["stuck"] == 0, result
    assert result["duplicates"] == result["duplicates_explained"], result


def worker(name, *extra, database_url=None):
    """Start `manage.py runworker` (two children, the default batch) named ``name`` on the
    test database, or on ``database_url``; return the Popen."""
    from tests.worker_support import manage

    env = {**TASKS_ENV, **({"DATABASE_URL": database_url} if database_url else {})}
    return _drained(
        manage(
            "runworker",
            "--import",
            "tests.sample_tasks",
            "--poll",
            "50ms",
            "--concurrency",
            "2",
            "--name",
            name,
            *extra,
            extra_env=env,
        )
    )


def stop_all(procs):
    """SIGTERM the worker() processes ``procs`` and wait for them; return their outputs."""
    import signal

    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    return [proc.communicate(timeout=60)[0] for proc in procs]


def _drained(proc):
    """Read ``proc``'s output as it comes, into ``proc.lines``: a worker logs a line per
    failed attempt, and with nobody reading, a full pipe (64 KiB, some thousand lines)
    would block it mid-write and stall the scenario. ``communicate()`` then returns the
    whole output."""
    proc.lines = []
    reader = threading.Thread(target=lambda: proc.lines.extend(proc.stdout), daemon=True)
    reader.start()
    wait = proc.wait

    def communicate(timeout=None):
        wait(timeout)
        reader.join(timeout)
        return "".join(proc.lines), None

    proc.communicate = communicate
    return proc


def output_until(proc, text, timeout=30):
    """Wait until a line of a worker()'s output contains ``text``; return the output so far."""
    end = time.monotonic() + timeout
    while not any(text in line for line in list(proc.lines)):
        if time.monotonic() > end or proc.poll() is not None:
            raise AssertionError(f"no line with {text!r} within {timeout}s; read: {''.join(proc.lines)!r}")
        time.sleep(0.02)
    return "".join(proc.lines)


def enqueue_marks(task, marker, n, **kwargs):
    """Enqueue ``n`` marker tasks through django.tasks; return {n: job id}."""
    return {i: int(task.enqueue(str(marker), i, **kwargs).id) for i in range(n)}


def children(pid):
    """The pids of a process's children (a runworker supervisor's worker children)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


def registered(*names, timeout=60):
    """Wait until the workers ``names`` have all registered (are up and claiming)."""
    from queue_app.models import Worker, WorkerState

    end = time.monotonic() + timeout
    while Worker.objects.filter(name__in=names, state=WorkerState.RUNNING).count() < len(names):
        if time.monotonic() > end:
            raise AssertionError(f"workers {names} did not all register in {timeout}s")
        time.sleep(0.02)


def holding(victim, other, timeout=60):
    """Wait until workers ``victim`` and ``other`` have registered and ``victim`` holds
    leases: a fault aimed at it then strands work (and a drain that ended first, or a
    worker still booting, would make the scenario prove nothing)."""
    from queue_app.models import Worker, WorkerState

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        up = Worker.objects.filter(name__in=[victim, other], state=WorkerState.RUNNING).count() == 2
        if up and Job.objects.filter(state=State.LEASED, lease_owner__startswith=f"{victim}/").exists():
            return
        time.sleep(0.005)
    raise AssertionError(f"{victim} never held a lease while {other} was up")


def freeze(pids, tries=100):
    """SIGSTOP ``pids`` (a worker and its children). On SQLite, at a moment when none of
    them holds the database's write lock: a process stopped inside a write transaction
    locks every other worker out until it resumes, so nothing would lapse and nobody could
    take anything back, and the stall would test SQLite's lock instead of the leases."""
    import signal

    for _ in range(tries):
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        if not _write_locked():
            return
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError(f"the database stayed write-locked across {tries} tries")


def thaw(pids):
    import signal

    for pid in pids:
        os.kill(pid, signal.SIGCONT)


def _write_locked():
    if connection.vendor != "sqlite":
        return False
    import sqlite3

    probe = sqlite3.connect(connection.settings_dict["NAME"], timeout=0.05, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError:
        return True
    finally:
        probe.close()


def expired_recoveries(ids):
    """Recoveries of a lease that lapsed (nobody took the job back sooner)."""
    return Event.objects.filter(
        job_id__in=ids, type=EventType.RECOVERED, message__contains=" expired at "
    ).count()


# --- faults -------------------------------------------------------------------------------


def admin_connection():
    """A connection to the server outside the test database, to inject faults from."""
    s = connection.settings_dict
    if connection.vendor == "postgresql":
        import psycopg

        return psycopg.connect(
            host=s["HOST"] or "127.0.0.1",
            port=s["PORT"] or 5432,
            user=s["USER"],
            dbname="postgres",
            autocommit=True,
        )
    import MySQLdb

    return MySQLdb.connect(
        host=s["HOST"] or "127.0.0.1", port=int(s["PORT"] or 3306), user=s["USER"], passwd=s["PASSWORD"] or ""
    )


def cut(admin):
    """Cut every connection to the test database but ``admin``'s (pg_terminate_backend;
    KILL on MariaDB): what a failover, a proxy restart or an operator does to a worker."""
    name = connection.settings_dict["NAME"]
    if connection.vendor == "postgresql":
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [name],
        )
        return
    cur = admin.cursor()
    cur.execute(
        "SELECT id FROM information_schema.processlist WHERE db = %s AND id <> CONNECTION_ID()", [name]
    )
    for (pid,) in cur.fetchall():
        with contextlib.suppress(Exception):  # it ended on its own meanwhile
            cur.execute(f"KILL {int(pid)}")


def restart(admin, seconds):
    """The test database goes away as in a restart: every connection to it is cut, and
    (PostgreSQL) new ones are refused for ``seconds``. MariaDB cannot refuse one
    database's connections to root, so there it is the cut alone, then the pause."""
    name = connection.settings_dict["NAME"]
    if connection.vendor != "postgresql":
        cut(admin)
        time.sleep(seconds)
        return
    admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
    try:
        cut(admin)
        time.sleep(seconds)
    finally:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
