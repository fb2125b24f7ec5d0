"""Claim latency with a big backlog, and the claim's query plan.

    .venv/bin/python benchmarks/claim.py                      # SQLite file benchmarks/claim.db
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/jq_bench .venv/bin/python benchmarks/claim.py
    DATABASE_URL=mysql://root@127.0.0.1:3306/jq_bench .venv/bin/python benchmarks/claim.py
    ... --sizes 10000,1000000 --rounds 200

Seeds N pending jobs with SQL (5 priority levels, ready times spread over the last
hour, 10% scheduled in the future), then times claims that are rolled back, so every
round sees the same backlog. Prints median and p95 per batch size, aging on and off.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobqueue_project.settings")
os.environ.setdefault("DATABASE_URL", f"sqlite:///{Path(__file__).resolve().parent / 'claim.db'}")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from queue_app.core import transitions  # noqa: E402

SEED = {
    "postgresql": """
        INSERT INTO queue_app_job (kind, queue_name, payload, priority, run_at, state, attempts,
                                   max_attempts, created_at)
        SELECT 'bench', CASE WHEN mod(g, 4) = 0 THEN 'mail' ELSE 'default' END, '{}'::jsonb,
               (mod(g, 5)) * 10 - 20,
               now() - (mod(g, 3600)) * interval '1 second' + CASE WHEN mod(g, 10) = 0 THEN interval '1 day' ELSE interval '0' END,
               'pending', 0, 3, now() - (mod(g, 3600)) * interval '1 second'
        FROM generate_series(1, %s) AS g""",
    "mysql": """
        INSERT INTO queue_app_job (kind, queue_name, payload, priority, run_at, state, attempts,
                                   max_attempts, created_at)
        SELECT 'bench', IF(seq % 4 = 0, 'mail', 'default'), '{}', CAST(seq % 5 AS SIGNED) * 10 - 20,
               UTC_TIMESTAMP(6) - INTERVAL (seq % 3600) SECOND + INTERVAL IF(seq % 10 = 0, 86400, 0) SECOND,
               'pending', 0, 3, UTC_TIMESTAMP(6) - INTERVAL (seq % 3600) SECOND
        FROM seq_1_to_{n}""",
    "sqlite": """
        WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < %s)
        INSERT INTO queue_app_job (kind, queue_name, payload, priority, run_at, state, attempts,
                                   max_attempts, created_at)
        SELECT 'bench', CASE WHEN x %% 4 = 0 THEN 'mail' ELSE 'default' END, '{}', (x %% 5) * 10 - 20,
               strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '-' || (x %% 3600) || ' seconds',
                        CASE WHEN x %% 10 = 0 THEN '+1 day' ELSE '+0 seconds' END),
               'pending', 0, 3, strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '-' || (x %% 3600) || ' seconds')
        FROM g""",
}


def seed(n):
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM queue_app_event")
        cursor.execute("DELETE FROM queue_app_deadletter")
        cursor.execute("DELETE FROM queue_app_job")
        if connection.vendor == "mysql":
            cursor.execute(SEED["mysql"].replace("{n}", str(n)))
        else:
            cursor.execute(SEED[connection.vendor], [n])
        if connection.vendor == "postgresql":
            cursor.execute("ANALYZE queue_app_job")
        elif connection.vendor == "sqlite":
            cursor.execute("ANALYZE")
        else:
            cursor.execute("ANALYZE TABLE queue_app_job")


class Rollback(Exception):
    pass


def timed_claim(limit, aging, queues=None):
    start = time.perf_counter()
    try:
        with transaction.atomic():
            jobs = transitions.claim("bench", limit=limit, aging=aging, queues=queues)
            assert len(jobs) == limit, len(jobs)
            raise Rollback
    except Rollback:
        pass
    return (time.perf_counter() - start) * 1000


def plan(limit, aging):
    # The statement and its parameters as the engine ran it: the query log's text of a
    # prepared statement (PostgreSQL's hot_cursor) is not SQL one could run again.
    captured = []

    def capture(execute, sql, params, many, context):
        if "UPDATE" in sql and "levels" in sql:
            captured.append((sql, params))
        return execute(sql, params, many, context)

    try:
        with transaction.atomic(), connection.execute_wrapper(capture):
            transitions.claim("bench", limit=limit, aging=aging)
            raise Rollback
    except Rollback:
        pass
    claim_sql, claim_params = captured[0]
    with connection.cursor() as cursor:
        try:
            with transaction.atomic():
                cursor.execute(
                    "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY ON) " + claim_sql, claim_params
                )
                lines = [row[0] for row in cursor.fetchall()]
                raise Rollback
        except Rollback:
            pass
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10000,1000000")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument(
        "--explain", action="store_true", help="print the PostgreSQL plan at the largest size"
    )
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    print(f"database: {connection.vendor}")
    sizes = [int(s) for s in args.sizes.split(",")]
    for n in sizes:
        t = time.perf_counter()
        seed(n)
        print(f"\n{n:,} pending jobs (seeded in {time.perf_counter() - t:.1f}s)")
        for aging in (0, 30):
            for limit in (1, 10, 100):
                for _ in range(5):
                    timed_claim(limit, aging)  # warm up
                samples = sorted(timed_claim(limit, aging) for _ in range(args.rounds))
                p95 = samples[int(len(samples) * 0.95) - 1]
                print(
                    f"  claim batch={limit:<3} aging={'on ' if aging else 'off'}: "
                    f"median {statistics.median(samples):6.2f} ms   p95 {p95:6.2f} ms"
                )
        samples = sorted(timed_claim(10, 30, queues=["mail"]) for _ in range(args.rounds))
        print(f"  claim batch=10  aging=on  queue=mail: median {statistics.median(samples):6.2f} ms")
    if args.explain and connection.vendor == "postgresql":
        print(f"\nPostgreSQL plan, batch=10, aging on, {sizes[-1]:,} pending:\n")
        print(plan(10, 30))


if __name__ == "__main__":
    main()
