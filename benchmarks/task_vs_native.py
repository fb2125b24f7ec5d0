"""The django.tasks path (`@task` ... `.enqueue()`) beside the native one (`enqueue(kind)`),
in one run, through the public APIs only; one JSON line per figure, each with the load
average (this machine is noisy: the ratios are the figures that count).

    .venv/bin/python benchmarks/task_vs_native.py                        # sqlite and postgres
    .venv/bin/python benchmarks/task_vs_native.py --db sqlite --jobs 2000 --batch 10

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
The functions are jobqueue_project.tasks.stamp (@task) and the "bench.stamp" handler.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from worker_throughput import PY, ROOT, URLS, django_snippet, fresh_database

IMPORT = ("--import", "jobqueue_project.tasks")

ENQUEUE = """
import time
from queue_app import enqueue
from jobqueue_project.tasks import stamp
call = stamp.enqueue if {task!r} else (lambda: enqueue("bench.stamp"))
call()  # warm: first connection, first statement
began = time.perf_counter()
for _ in range({n} - 1):
    call()
took = time.perf_counter() - began
print(json.dumps({{"per_s": ({n} - 1) / took}}))
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
began = time.perf_counter()
for _ in range({n}):
    db.execute("BEGIN IMMEDIATE")
    job_id = db.execute(insert_job, job_vals).lastrowid
    db.execute(insert_event, [job_id, "enqueued", now, 0, "", "", "pending", "", meta])
    db.execute("COMMIT")
took = time.perf_counter() - began
print(json.dumps({{"per_s": {n} / took}}))
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
for _ in range({n}):
    before = time.time()
    job_id = int(stamp.enqueue().id) if {task!r} else enqueue("bench.stamp").id
    sent[job_id] = before
    time.sleep(0.02)
while Job.objects.filter(id__in=list(sent)).exclude(state="completed").exists():
    time.sleep(0.05)
claims = counted.read_bytes()[start:]
lat = sorted((j.result - sent[j.id]) * 1000 for j in Job.objects.filter(id__in=list(sent)))
pick = lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))], 2)
print(json.dumps({{"p50_ms": pick(0.5), "p99_ms": pick(0.99), "claims_per_job": round(len(claims) / {n}, 3),
                  "empty_claims": claims.count(b"0")}}))
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
    claims = Path(f"/tmp/jq_bench_claims_{db}")
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
    args = parser.parse_args()
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
        emit(
            bench="task_vs_native_latency",
            db=db,
            jobs=args.latency_jobs,
            native=lat["native"],
            task=lat["task"],
        )


if __name__ == "__main__":
    main()
