"""The django.tasks path (`@task` ... `.enqueue()`) beside the native one (`enqueue(kind)`),
in one run, through the public APIs only; one JSON line per figure, each with the load
average (this machine is noisy: the ratios are the figures that count).

    .venv/bin/python benchmarks/task_vs_native.py                        # sqlite and postgres
    .venv/bin/python benchmarks/task_vs_native.py --db sqlite --jobs 2000 --batch 10
    .venv/bin/python benchmarks/task_vs_native.py --db sqlite --jobs 2000 --enqueue-only --rounds 5 \
        --against /tmp/base      # only single enqueue (and the bare baseline); beside another checkout

For each database and path:
- ``enqueue``: N single calls from one process, each its own transaction (a view's), from
  just before the call to its return; on SQLite beside a bare baseline: Python's sqlite3
  inserting the same job row and enqueued event per transaction, on the same file with
  the same PRAGMAs (the floor for this schema).
- ``drain``: (the median of --rounds runs of each path, in turns) those N jobs drained by `runworker --burst --concurrency 4 --batch B`, from the
  first start to the last finish (database timestamps: process start-up left out).
- ``latency``: 4 idle children (the default poll, 1 s: the wake-ups are what is
  measured); 200 jobs 20 ms apart; from just before the enqueue call to the first line
  of the function (it returns time.time(), read back from its result). With
  ``claims_per_job``: the engine claim statements the workers ran from the first enqueue
  until the last job completed, per job (each claim appends a byte to a file: the
  worker runs with Engine.claim wrapped, see COUNTED; ``empty_claims`` leased nothing).
  ``p50_segments_ms``: where the time goes, the medians of the enqueue call itself, of its
  return to the claim's start (the job's started_at) and of the claim statement and the
  dispatch up to the function's first line; ``bare_commit_p50_ms``: the driver's own
  connection committing a one-row INSERT at the same spacing, the floor for each of a
  pickup's two commits.
The functions are jobqueue_project.tasks.stamp (@task) and the "bench.stamp" handler.

``--enqueue-only``: the ``enqueue`` figures alone, ``--rounds`` times in turns (native,
task, bare; then the other way round), each on a fresh database, with the CPU per call
of the enqueuing process (process_time: steadier than the wall clock on a shared
machine) beside the calls per second; the medians and their ratios. ``--against TREE``
runs the same snippets in another checkout of this repository in the same turns (its
code, its migrations), e.g. the commit before a change: ``git worktree add /tmp/base
HEAD~3``, with a ``.venv`` link, and prints both and new/old.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import worker_throughput
from worker_throughput import PY, ROOT, URLS, django_snippet, fresh_database

IMPORT = ("--import", "jobqueue_project.tasks")

ENQUEUE = """
import time
from queue_app import enqueue
from jobqueue_project.tasks import stamp
call = stamp.enqueue if {task!r} else (lambda: enqueue("bench.stamp"))
call()  # warm: first connection, first statement
began, cpu = time.perf_counter(), time.process_time()
for _ in range({n} - 1):
    call()
took = time.perf_counter() - began
print(json.dumps({{"per_s": ({n} - 1) / took, "cpu_us": (time.process_time() - cpu) / ({n} - 1) * 1e6}}))
"""

BARE_SQLITE = """
import sqlite3, time
from django.db import connection
from django.utils import timezone
from queue_app.models import Event, Job
now = timezone.now().isoformat(sep=" ")
job_cols, job_vals = [], []
for f in Job._meta.concrete_fields:
    if f.primary_key:
        continue
    value = {{"kind": "bench.stamp", "queue_name": "default", "state": "pending", "run_at": now,
             "created_at": now, "payload": "{{}}", "max_attempts": 3}}.get(f.attname, f.get_default())
    if isinstance(value, (dict, list)):
        value = json.dumps(value)
    job_cols.append(f.column)
    job_vals.append(value)
event_cols = ["job_id", "type", "at", "attempt", "worker", "from_state", "to_state", "message", "metadata"]
path = connection.settings_dict["NAME"]
connection.close()
db = sqlite3.connect(path, isolation_level=None)
db.execute("PRAGMA journal_mode=WAL")
db.execute("PRAGMA synchronous=NORMAL")
insert_job = f"INSERT INTO queue_app_job ({{', '.join(job_cols)}}) VALUES ({{', '.join('?' * len(job_cols))}})"
insert_event = f"INSERT INTO queue_app_event ({{', '.join(event_cols)}}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
meta = json.dumps({{"queue": "default", "priority": 0, "run_at": now}})
began, cpu = time.perf_counter(), time.process_time()
for _ in range({n}):
    db.execute("BEGIN IMMEDIATE")
    job_id = db.execute(insert_job, job_vals).lastrowid
    db.execute(insert_event, [job_id, "enqueued", now, 0, "", "", "pending", "", meta])
    db.execute("COMMIT")
took = time.perf_counter() - began
print(json.dumps({{"per_s": {n} / took, "cpu_us": (time.process_time() - cpu) / {n} * 1e6}}))
"""

SPAN = """
from django.db.models import Max, Min
from queue_app.models import Job
a = Job.objects.aggregate(first=Min("started_at"), last=Max("finished_at"))
print(json.dumps({"done": Job.objects.completed().count(), "span": (a["last"] - a["first"]).total_seconds()}))
"""

LATENCY = """
import time
from pathlib import Path
from queue_app import enqueue
from queue_app.models import Job, Worker
from jobqueue_project.tasks import stamp
while not Worker.objects.filter(state="running").exists():
    time.sleep(0.05)
time.sleep(1.0)  # let the children reach their idle wait
counted = Path({claims!r})
start = len(counted.read_bytes())
sent = {{}}
returned = {{}}
for _ in range({n}):
    before = time.time()
    job_id = int(stamp.enqueue().id) if {task!r} else enqueue("bench.stamp").id
    returned[job_id] = time.time()
    sent[job_id] = before
    time.sleep(0.02)
while Job.objects.filter(id__in=list(sent)).exclude(state="completed").exists():
    time.sleep(0.05)
claims = counted.read_bytes()[start:]
done = list(Job.objects.filter(id__in=list(sent)))
def pick(values, q):
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 2)
lat = [(j.result - sent[j.id]) * 1000 for j in done]
# Where the p50 goes: the enqueue call itself, its return to the claim's start (started_at
# is the claim's clock reading, taken before its statement), and the claim statement and
# the dispatch to the function's first line.
segments = {{
    "enqueue_call": [(returned[j.id] - sent[j.id]) * 1000 for j in done],
    "to_claim": [(j.started_at.timestamp() - returned[j.id]) * 1000 for j in done],
    "claim_to_first_line": [(j.result - j.started_at.timestamp()) * 1000 for j in done],
}}
print(json.dumps({{"p50_ms": pick(lat, 0.5), "p99_ms": pick(lat, 0.99), "claims_per_job": round(len(claims) / {n}, 3),
                  "empty_claims": claims.count(b"0"),
                  "p50_segments_ms": {{k: pick(v, 0.5) for k, v in segments.items()}}}}))
"""

# The floor for a pickup's two commits (the enqueue's, the claim's): the driver's own
# connection committing a one-row INSERT into a table of its own, with the latency run's
# spacing (a quiet machine answers a lone commit 20 ms after the last more slowly than
# one of a back-to-back stream, and the pickup pays that twice).
BARE_COMMIT = """
import time
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute("DROP TABLE IF EXISTS jq_bench_bare")
    cursor.execute("CREATE TABLE jq_bench_bare (a integer)")
# The driver's own cursor (sqlite3, psycopg and MySQLdb alike), in Django's autocommit:
# each INSERT is its own durable transaction.
raw = connection.connection.cursor()
spent = []
for _ in range({n}):
    began = time.perf_counter()
    raw.execute("INSERT INTO jq_bench_bare VALUES (1)")
    spent.append((time.perf_counter() - began) * 1000)
    time.sleep(0.02)
with connection.cursor() as cursor:
    cursor.execute("DROP TABLE jq_bench_bare")
spent.sort()
print(json.dumps({{"p50_ms": round(spent[len(spent) // 2], 3)}}))
"""

# runworker with every engine's claim wrapped to append one byte per claim statement to
# JQ_CLAIMS (1: it leased something, 0: nothing): the forked children inherit the
# wrapper and the O_APPEND descriptor, so counting costs a write(2), no timing.
COUNTED = """
import os, sys, django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobqueue_project.settings")
django.setup()
from queue_app import engines
fd = os.open(os.environ["JQ_CLAIMS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
def counted(claim):
    def wrapper(self, **kwargs):
        found = claim(self, **kwargs)
        os.write(fd, b"1" if found else b"0")
        return found
    return wrapper
for engine in engines.ENGINES.values():
    engine.claim = counted(engine.claim)
from django.core.management import execute_from_command_line
execute_from_command_line(["manage.py", *sys.argv[1:]])
"""


def loadavg():
    return round(os.getloadavg()[0], 2)


def worker(db, *args):
    env = dict(os.environ, DATABASE_URL=URLS[db], JOBQUEUE_LOG_LEVEL="WARNING")
    return subprocess.Popen(
        [PY, "manage.py", "runworker", *IMPORT, "--poll", "50ms", *args], cwd=ROOT, env=env
    )


def enqueue_and_drain(db, path, jobs, batch):
    fresh_database(db)
    enq = json.loads(django_snippet(db, ENQUEUE.format(task=path == "task", n=jobs)))
    proc = worker(db, "--burst", "--concurrency", "4", "--batch", str(batch))
    if proc.wait():
        raise subprocess.CalledProcessError(proc.returncode, "runworker")
    span = json.loads(django_snippet(db, SPAN))
    assert span["done"] == jobs, span
    return round(enq["per_s"]), round(jobs / span["span"])


def latency(db, path, n, poll):
    fresh_database(db)
    claims = Path(f"/tmp/jq_bench_claims_{db}{os.environ.get('JOBQUEUE_BENCH_TAG', '')}")
    claims.write_bytes(b"")
    env = dict(os.environ, DATABASE_URL=URLS[db], JOBQUEUE_LOG_LEVEL="WARNING", JQ_CLAIMS=str(claims))
    proc = subprocess.Popen(
        [PY, "-c", COUNTED, "runworker", *IMPORT, "--poll", poll, "--concurrency", "4"], cwd=ROOT, env=env
    )
    try:
        return json.loads(django_snippet(db, LATENCY.format(task=path == "task", n=n, claims=str(claims))))
    finally:
        proc.terminate()
        proc.wait(30)


@contextmanager
def checkout(tree):
    """Run worker_throughput's snippets and migrations in ``tree`` (None: this one)."""
    saved = worker_throughput.ROOT
    worker_throughput.ROOT = Path(tree) if tree else ROOT
    try:
        yield
    finally:
        worker_throughput.ROOT = saved


def single_enqueues(db, path, jobs, tree=None):
    """{per_s, cpu_us} of ``jobs`` single enqueues on a fresh database (path: native,
    task or bare, the last SQLite only), with ``tree``'s code."""
    with checkout(tree):
        fresh_database(db)
        code = BARE_SQLITE.format(n=jobs) if path == "bare" else ENQUEUE.format(task=path == "task", n=jobs)
        return json.loads(django_snippet(db, code))


def enqueue_rounds(db, jobs, n, against):
    """--enqueue-only: the medians of ``n`` turns of each path (and each tree)."""
    trees = {"new": None, **({"old": against} if against else {})}
    paths = ["native", "task", *(["bare"] if db == "sqlite" else [])]
    runs = {(tree, path): [] for tree in trees for path in paths}
    for r in range(n):
        order = [(tree, path) for path in paths for tree in trees]
        for tree, path in order if r % 2 == 0 else order[::-1]:
            if path == "bare" and tree != "new":
                continue  # the same sqlite3 loop in either tree
            runs[tree, path].append(single_enqueues(db, path, jobs, trees[tree]))
    med = {
        key: {f: round(statistics.median(run[f] for run in got), 1) for f in ("per_s", "cpu_us")}
        for key, got in runs.items()
        if got
    }
    for tree in trees:
        native, task = med[tree, "native"], med[tree, "task"]
        line = {
            "bench": "single_enqueue",
            "db": db,
            "tree": tree if against else None,
            "jobs": jobs,
            "rounds": n,
            "native": native,
            "task": task,
            "task_over_native": round(task["per_s"] / native["per_s"], 3),
            "task_over_native_cpu": round(native["cpu_us"] / task["cpu_us"], 3),
        }
        if db == "sqlite":
            bare = med["new", "bare"]
            line.update(
                bare=bare,
                native_over_bare=round(native["per_s"] / bare["per_s"], 3),
                native_over_bare_cpu=round(bare["cpu_us"] / native["cpu_us"], 3),
            )
        emit(**line)
    if against:
        emit(
            bench="single_enqueue_new_over_old",
            db=db,
            **{
                path: round(med["new", path]["per_s"] / med["old", path]["per_s"], 3)
                for path in ("native", "task")
            },
            **{
                f"{path}_cpu": round(med["old", path]["cpu_us"] / med["new", path]["cpu_us"], 3)
                for path in ("native", "task")
            },
        )


def rounds(db, jobs, batch, n):
    """{path: (enqueue/s, drain/s)}: the medians of ``n`` runs of each path, taken in turns
    (native, task, then task, native) so that the machine's drifting load falls on both."""
    runs = {"native": [], "task": []}
    for r in range(n):
        for path in ("native", "task") if r % 2 == 0 else ("task", "native"):
            runs[path].append(enqueue_and_drain(db, path, jobs, batch))
    return {
        path: tuple(round(statistics.median(run[i] for run in got)) for i in (0, 1))
        for path, got in runs.items()
    }


def emit(**line):
    print(json.dumps({**line, "load_1m": loadavg()}), flush=True)


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", action="append", choices=sorted(URLS))
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--batch", default="10,100", help="comma-separated batch sizes")
    parser.add_argument("--latency-jobs", type=int, default=200)
    parser.add_argument("--latency-poll", default="1s", help="the idle children's poll in the latency run")
    parser.add_argument("--latency-only", action="store_true", help="only the latency figure")
    parser.add_argument(
        "--rounds", type=int, default=3, help="drains of each path per batch, in turns; medians printed"
    )
    parser.add_argument(
        "--enqueue-only", action="store_true", help="only the single-enqueue figures (and the bare baseline)"
    )
    parser.add_argument(
        "--against", help="with --enqueue-only: another checkout to measure in the same turns"
    )
    parser.add_argument(
        "--url",
        help="database URL to use instead of the built-in one (with one --db): it is dropped and made afresh",
    )
    args = parser.parse_args()
    if args.url:
        if not args.db or len(args.db) != 1:
            parser.error("--url goes with exactly one --db")
        URLS[args.db[0]] = args.url
    if args.enqueue_only:
        for db in args.db or ["sqlite", "postgres"]:
            enqueue_rounds(db, args.jobs, args.rounds, args.against)
        return
    for db in args.db or ["sqlite", "postgres"]:
        for batch in [] if args.latency_only else [int(b) for b in args.batch.split(",")]:
            got = rounds(db, args.jobs, batch, args.rounds)
            for i, what in ((1, "drain"), (0, "enqueue")):
                if what == "enqueue" and batch != int(args.batch.split(",")[0]):
                    continue  # the same calls each time: one line is enough
                native, task = got["native"][i], got["task"][i]
                emit(
                    bench=f"task_vs_native_{what}",
                    db=db,
                    batch=batch if what == "drain" else None,
                    jobs=args.jobs,
                    native_per_s=native,
                    task_per_s=task,
                    task_over_native=round(task / native, 3),
                )
        if db == "sqlite" and not args.latency_only:
            fresh_database(db)
            bare = json.loads(django_snippet(db, BARE_SQLITE.format(n=args.jobs)))["per_s"]
            emit(
                bench="enqueue_bare_sqlite3",
                db=db,
                jobs=args.jobs,
                bare_per_s=round(bare),
                native_per_s=got["native"][0],
                native_over_bare=round(got["native"][0] / bare, 3),
            )
        lat = {path: latency(db, path, args.latency_jobs, args.latency_poll) for path in ("native", "task")}
        bare = json.loads(django_snippet(db, BARE_COMMIT.format(n=args.latency_jobs)))
        emit(
            bench="task_vs_native_latency",
            db=db,
            jobs=args.latency_jobs,
            native=lat["native"],
            task=lat["task"],
            bare_commit_p50_ms=bare["p50_ms"],
        )


if __name__ == "__main__":
    main()
