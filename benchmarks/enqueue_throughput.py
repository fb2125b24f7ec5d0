"""W2: enqueue throughput, one JSON line per database and mode.

    .venv/bin/python benchmarks/enqueue_throughput.py                  # sqlite, postgres, mysql
    .venv/bin/python benchmarks/enqueue_throughput.py --db sqlite --single 5000 --bulk 100000

``single``: N calls of ``enqueue("noop")``, each its own transaction as a view's would
be (autocommit, no outer atomic), one after another from one process; with
``--clients K`` (K > 1) also a line for K processes enqueueing N/K each at the same
time, as K web workers would (each enqueue still its own transaction). ``bulk``: one
``bulk_enqueue()`` of M jobs (one transaction). Each on a fresh database, timed inside
the process (Django start-up left out); jobs_per_s is jobs / seconds.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from worker_throughput import URLS, django_snippet, fresh_database

SINGLE = """
import multiprocessing, time
from django.db import connections
from queue_app import enqueue
clients, n = {clients}, {n}
if clients == 1:
    enqueue("noop")  # warm: first connection, first statement
    began = time.perf_counter()
    for _ in range(n):
        enqueue("noop")
    took = time.perf_counter() - began
else:
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(clients + 1)

    def client():
        enqueue("noop")  # warm: this process's own connection
        start.wait()
        for _ in range(n // clients):
            enqueue("noop")

    connections.close_all()
    procs = [ctx.Process(target=client) for _ in range(clients)]
    for p in procs:
        p.start()
    start.wait()
    began = time.perf_counter()
    for p in procs:
        p.join()
    took = time.perf_counter() - began
    assert all(p.exitcode == 0 for p in procs)
print(json.dumps({{"seconds": took}}))
"""

BULK = """
import time
from queue_app import bulk_enqueue
specs = [{{"kind": "noop"}} for _ in range({n})]
began = time.perf_counter()
jobs = bulk_enqueue(specs)
took = time.perf_counter() - began
assert len(jobs) == {n} and all(j.id for j in jobs)
print(json.dumps({{"seconds": took}}))
"""


def measure(db, mode, n, clients=1):
    fresh_database(db)
    if mode == "single":
        n -= n % clients
        code = SINGLE.format(n=n, clients=clients)
    else:
        code = BULK.format(n=n)
    seconds = json.loads(django_snippet(db, code).strip().splitlines()[-1])["seconds"]
    line = {
        "bench": "enqueue",
        "mode": mode,
        "db": db,
        "jobs": n,
        "seconds": round(seconds, 3),
        "jobs_per_s": round(n / seconds),
    }
    if mode == "single":
        line["clients"] = clients
    return line


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", action="append", choices=sorted(URLS))
    parser.add_argument("--single", type=int, default=5000, help="single enqueues (0 skips)")
    parser.add_argument("--bulk", type=int, default=100000, help="jobs in the bulk enqueue (0 skips)")
    parser.add_argument(
        "--clients",
        type=int,
        default=4,
        help="also time the single enqueues from this many processes at once (1 skips)",
    )
    args = parser.parse_args()
    for db in args.db or ["sqlite", "postgres", "mysql"]:
        runs = [("single", args.single, 1)]
        if args.clients > 1:
            runs.append(("single", args.single, args.clients))
        runs.append(("bulk", args.bulk, 1))
        for mode, n, clients in runs:
            if n:
                print(json.dumps(measure(db, mode, n, clients)), flush=True)


if __name__ == "__main__":
    main()
