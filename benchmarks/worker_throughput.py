"""Drain throughput of runworker on no-op jobs, one JSON line per database and setting.

    .venv/bin/python benchmarks/worker_throughput.py                       # sqlite, postgres, mysql
    .venv/bin/python benchmarks/worker_throughput.py --db sqlite --jobs 20000 --batch 1,100
    .venv/bin/python benchmarks/worker_throughput.py --latency --poll 1s   # enqueue-to-start
    .venv/bin/python benchmarks/worker_throughput.py --db sqlite --batch 10 --tracing   # OTel on vs off
    .venv/bin/python benchmarks/worker_throughput.py --db postgres --batch 10 --tracing --rounds 5 \
        --url postgres://postgres@127.0.0.1:5432/jq_mine      # your own database, off/on in turns

For each database: a fresh database, N no-op jobs bulk-enqueued with the workers
stopped, then `manage.py runworker --burst` with --concurrency processes. ``jobs_per_s``
counts from the first claim to the last completion (timestamps in the database), so
process start-up is left out; ``wall_s`` is the whole command, start-up included, and
``worker_cpu_s`` the CPU time of its processes (supervisor and children, start-up included:
steadier than the wall clock on a loaded machine, but the database server's is not in it).
With --latency: idle workers (2 processes), 200 single enqueues 20 ms apart, and the
p50/p95/p99 of started_at - created_at. The supervisor's one watch (LISTEN/NOTIFY on
PostgreSQL, the WAL file or PRAGMA data_version on SQLite, the newest event id on
MariaDB: MARIADB_WAKE_INTERVAL) wakes one idle child, so the poll interval should not
show. Each drain line also carries the peak resident memory
per process.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
# runworker refuses to start without one (the benchmarks' throwaway databases sign nothing).
os.environ.setdefault("SECRET_KEY", "benchmarks-only-not-a-secret")
# JOBQUEUE_BENCH_TAG=x gives these databases a suffix, so benchmarks run from two
# checkouts at once do not drop each other's.
_TAG = os.environ.get("JOBQUEUE_BENCH_TAG", "")
URLS = {
    "sqlite": f"sqlite:////tmp/jq_bench_worker{_TAG}.db",
    "postgres": f"postgres://postgres@127.0.0.1:5432/jq_bench_worker{_TAG}",
    "mysql": f"mysql://root@127.0.0.1:3306/jq_bench_worker{_TAG}",
}


def fresh_database(db):
    name = urlsplit(URLS[db]).path.lstrip("/")
    if db == "sqlite":
        for suffix in ("", "-wal", "-shm"):
            Path("/" + name + suffix).unlink(missing_ok=True)
    elif db == "postgres":
        import psycopg

        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            c.execute(f'CREATE DATABASE "{name}"')
    elif db == "mysql":
        import MySQLdb

        c = MySQLdb.connect(host="127.0.0.1", user="root", port=3306)
        c.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
        c.cursor().execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        c.close()
    run(db, [PY, "manage.py", "migrate", "-v0"])


def run(db, argv, extra_env=None, **kw):
    env = dict(os.environ, DATABASE_URL=URLS[db], JOBQUEUE_LOG_LEVEL="WARNING", **(extra_env or {}))
    return subprocess.run(argv, cwd=ROOT, env=env, check=True, capture_output=True, text=True, **kw)


def django_snippet(db, code, extra_env=None):
    prelude = (
        "import os, django, json; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'jobqueue_project.settings');"
        " django.setup()\n"
    )
    return run(db, [PY, "-c", prelude + code], extra_env).stdout


# --tracing: OpenTelemetry's SDK in the enqueuing and the worker processes as a site sets
# it up (a BatchSpanProcessor), every span built and handed to an exporter that drops it
# (tests/otel_setup.py).
TRACING = {"OTEL_SETUP": "tests.otel_setup.configure"}


def one(db, jobs, concurrency, batch, threads, extra_env=None):
    fresh_database(db)
    django_snippet(
        db,
        (
            f"from queue_app import bulk_enqueue\nbulk_enqueue([{{'kind': 'noop'}}] * {jobs})\n"
            # Fresh statistics, as autovacuum would soon provide: without them PostgreSQL
            # plans the claim's final step as a scan of every pending row (see README).
            "from django.db import connection\n"
            "if connection.vendor != 'sqlite':\n"
            "    connection.cursor().execute('ANALYZE ' + ('TABLE ' if connection.vendor == 'mysql' else '')"
            " + 'queue_app_job')\n"
        ),
        extra_env,
    )
    began = time.perf_counter()
    cpu_before = _children_cpu()
    env = dict(os.environ, DATABASE_URL=URLS[db], JOBQUEUE_LOG_LEVEL="WARNING", **(extra_env or {}))
    proc = subprocess.Popen(
        [
            PY,
            "manage.py",
            "runworker",
            "--burst",
            "--import",
            "tests.worker_support",
            "--concurrency",
            str(concurrency),
            "--threads",
            str(threads),
            "--batch",
            str(batch),
            "--poll",
            "50ms",
        ],
        cwd=ROOT,
        env=env,
    )
    peak = {}
    while proc.poll() is None:
        for pid, mb in rss_tree(proc.pid).items():
            peak[pid] = max(peak.get(pid, 0), mb)
        time.sleep(0.1)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, "runworker")
    wall = time.perf_counter() - began
    # The supervisor and its children (it waits for them), start-up included: the
    # enqueue and report snippets run before and after, outside this window.
    cpu = _children_cpu() - cpu_before
    children = [mb for pid, mb in peak.items() if pid != proc.pid]
    report = json.loads(
        django_snippet(
            db,
            (
                "from django.db.models import Min, Max\nfrom queue_app.models import Job\n"
                "a = Job.objects.aggregate(first=Min('started_at'), last=Max('finished_at'))\n"
                "print(json.dumps({'done': Job.objects.completed().count(),"
                " 'span': (a['last'] - a['first']).total_seconds()}))"
            ),
        )
    )
    return {
        "bench": "worker_drain",
        "db": db,
        "jobs": jobs,
        "completed": report["done"],
        "concurrency": concurrency,
        "threads": threads,
        "batch": batch,
        "tracing": bool(extra_env),
        "drain_s": round(report["span"], 3),
        "jobs_per_s": round(report["done"] / report["span"]),
        "wall_s": round(wall, 3),
        "worker_cpu_s": round(cpu, 3),
        # Peak resident set per process, sampled every 100 ms: supervisor and children.
        "rss_mb_supervisor": round(peak.get(proc.pid, 0), 1),
        "rss_mb_child_max": round(max(children), 1) if children else None,
        "load_1m": round(os.getloadavg()[0], 2),
    }


def _children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def rss_tree(root):
    """{pid: resident MB} of ``root`` and its direct children (Linux /proc)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            pid = int(entry.name)
            if pid != root and ppid != root:
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    out[pid] = int(line.split()[1]) / 1024
        except (OSError, ValueError, IndexError):
            continue
    return out


LATENCY = """
import time
from queue_app import enqueue
from queue_app.models import Job, Worker
while not Worker.objects.filter(state="running").exists():
    time.sleep(0.05)
time.sleep(1.0)  # let the children reach their idle wait (LISTEN on PostgreSQL)
ids = []
for _ in range({n}):
    ids.append(enqueue("noop").id)
    time.sleep(0.02)
while Job.objects.filter(id__in=ids).exclude(state="completed").exists():
    time.sleep(0.05)
lat = sorted((j.started_at - j.created_at).total_seconds() * 1000 for j in Job.objects.filter(id__in=ids))
pick = lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))], 2)
print(json.dumps({{"p50_ms": pick(0.5), "p95_ms": pick(0.95), "p99_ms": pick(0.99)}}))
"""


def latency(db, n, poll):
    """Enqueue ``n`` jobs 20 ms apart into idle workers; enqueue-to-start percentiles."""
    fresh_database(db)
    env = dict(os.environ, DATABASE_URL=URLS[db], JOBQUEUE_LOG_LEVEL="WARNING")
    proc = subprocess.Popen(
        [
            PY,
            "manage.py",
            "runworker",
            "--import",
            "tests.worker_support",
            "--concurrency",
            "2",
            "--poll",
            poll,
        ],
        cwd=ROOT,
        env=env,
    )
    try:
        report = json.loads(django_snippet(db, LATENCY.format(n=n)))
    finally:
        proc.terminate()
        proc.wait(30)
    return {"bench": "worker_latency", "db": db, "jobs": n, "poll": poll, **report}


def tracing_cost(db, batch, args):
    """Drain off then on, ``args.rounds`` times in turns: each line, each ratio, the median."""
    ratios = []
    for _ in range(args.rounds):
        off = one(db, args.jobs, args.concurrency, batch, args.threads)
        on = one(db, args.jobs, args.concurrency, batch, args.threads, TRACING)
        for line in (off, on):
            print(json.dumps(line), flush=True)
        ratios.append(on["jobs_per_s"] / off["jobs_per_s"])
        print(
            json.dumps(
                {
                    "bench": "tracing_cost",
                    "db": db,
                    "batch": batch,
                    "on_vs_off": round(ratios[-1], 3),
                    # CPU of the worker processes per job, start-up included.
                    "cpu_us_per_job_off": round(off["worker_cpu_s"] / off["completed"] * 1e6, 1),
                    "cpu_us_per_job_on": round(on["worker_cpu_s"] / on["completed"] * 1e6, 1),
                    "load_1m": round(os.getloadavg()[0], 2),
                }
            ),
            flush=True,
        )
    if args.rounds > 1:
        print(
            json.dumps(
                {
                    "bench": "tracing_cost_median",
                    "db": db,
                    "batch": batch,
                    "rounds": args.rounds,
                    "on_vs_off": round(statistics.median(ratios), 3),
                    "load_1m": round(os.getloadavg()[0], 2),
                }
            ),
            flush=True,
        )


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", action="append", choices=sorted(URLS))
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", default="1,100", help="comma-separated batch sizes")
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="each drain twice, OpenTelemetry off then on (same run), and the ratio",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="with --tracing: off then on this many times (same run); each ratio and their median",
    )
    parser.add_argument(
        "--url",
        help="database URL to use instead of the built-in one (with one --db), e.g."
        " postgres://postgres@127.0.0.1:5432/jobqueue_mine: it is dropped and made afresh",
    )
    parser.add_argument("--latency", action="store_true", help="measure enqueue-to-start latency instead")
    parser.add_argument(
        "--poll",
        default="1s",
        help="idle poll interval for --latency (PostgreSQL wakes on "
        "NOTIFY, SQLite on PRAGMA data_version, MariaDB only polls)",
    )
    args = parser.parse_args()
    if args.url:
        if not args.db or len(args.db) != 1:
            parser.error("--url goes with exactly one --db")
        URLS[args.db[0]] = args.url
    if args.latency:
        for db in args.db or ["sqlite", "postgres", "mysql"]:
            print(json.dumps(latency(db, 200, args.poll)), flush=True)
        return
    for db in args.db or ["sqlite", "postgres", "mysql"]:
        for batch in [int(b) for b in args.batch.split(",")]:
            try:
                if args.tracing:
                    tracing_cost(db, batch, args)
                    continue
                print(json.dumps(one(db, args.jobs, args.concurrency, batch, args.threads)), flush=True)
            except subprocess.CalledProcessError as exc:
                print(
                    json.dumps(
                        {
                            "bench": "worker_drain",
                            "db": db,
                            "batch": batch,
                            "error": (exc.stderr or "")[-500:],
                        }
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
