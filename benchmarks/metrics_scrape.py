"""Time a /metrics scrape before (job gauges counted over the job table) and after
(the maintained JobCount rows), in one run, with the load average.

    .venv/bin/python benchmarks/metrics_scrape.py                                   # PostgreSQL, 10M jobs, 50M events
    .venv/bin/python benchmarks/metrics_scrape.py --jobs 1000000 --events 5000000   # scaled down
    .venv/bin/python benchmarks/metrics_scrape.py --db sqlite --jobs 1000000 --events 2000000

The database (DATABASE_URL, else jq_bench_metrics on the local PostgreSQL or
/tmp/jq_bench_metrics.db) is emptied, migrated and seeded in the database itself
(PostgreSQL: INSERT ... SELECT generate_series; SQLite: a recursive CTE), --reuse keeps
one seeded before. Then: the first scrape (it folds the event history and recounts
the job table once), the median of --scrapes scrapes counting the job table as every
scrape did before JobCount, the median of as many reading JobCount, and a scrape
after 10,000 new events. Most jobs are completed, 10% pending, 3% leased.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobqueue_project.settings")
URLS = {
    "postgres": "postgres://postgres@127.0.0.1:5432/jq_bench_metrics",
    "sqlite": "sqlite:////tmp/jq_bench_metrics.db",
}

STATE = """CASE WHEN g % 100 < 80 THEN 'completed' WHEN g % 100 < 90 THEN 'pending'
    WHEN g % 100 < 93 THEN 'leased' WHEN g % 100 < 97 THEN 'dead_letter' ELSE 'cancelled' END"""
LEASED = "g % 100 BETWEEN 90 AND 92"
TYPES = ["enqueued", "claimed", "completed", "failed", "dead_lettered"]

PG_JOBS = f"""
INSERT INTO queue_app_job (kind, queue_name, payload, priority, run_at, state, attempts, max_attempts,
    lease_owner, lease_expires_at, created_at, started_at, finished_at)
SELECT 'kind' || (g % 20), 'queue' || (g % 5), '{{}}'::jsonb, (g % 7) - 3,
    now() - make_interval(secs => g % 86400), {STATE}, 1, 3,
    CASE WHEN {LEASED} THEN 'bench-worker' END,
    CASE WHEN {LEASED} THEN now() + interval '30 seconds' END,
    now() - make_interval(secs => g % 86400), now(), now()
FROM generate_series(1, %s) AS g"""
# Events spread over the jobs in id order (event k belongs to job k % jobs + 1).
PG_EVENTS = f"""
INSERT INTO queue_app_event (job_id, type, at, attempt, worker, from_state, to_state, message, metadata)
SELECT 1 + (k - 1) % %s, (ARRAY{TYPES!r})[1 + (k - 1) % 5], now() - make_interval(secs => k % 86400),
    1, '', '', '', '', '{{}}'::jsonb
FROM generate_series(1, %s) AS k"""

SQLITE_JOBS = f"""
WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < {{jobs}})
INSERT INTO queue_app_job (kind, queue_name, payload, priority, run_at, state, attempts, max_attempts,
    lease_owner, lease_expires_at, created_at, started_at, finished_at)
SELECT 'kind' || (g % 20), 'queue' || (g % 5), '{{}}', (g % 7) - 3,
    datetime('now', '-' || (g % 86400) || ' seconds'), {STATE}, 1, 3,
    CASE WHEN {LEASED} THEN 'bench-worker' END,
    CASE WHEN {LEASED} THEN datetime('now', '+30 seconds') END,
    datetime('now', '-' || (g % 86400) || ' seconds'), datetime('now'), datetime('now')
FROM s"""
SQLITE_EVENTS = """
WITH RECURSIVE s(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM s WHERE k < {events})
INSERT INTO queue_app_event (job_id, type, at, attempt, worker, from_state, to_state, message, metadata)
SELECT 1 + (k - 1) % {jobs},
    CASE (k - 1) % 5 WHEN 0 THEN 'enqueued' WHEN 1 THEN 'claimed' WHEN 2 THEN 'completed'
        WHEN 3 THEN 'failed' ELSE 'dead_lettered' END,
    datetime('now', '-' || (k % 86400) || ' seconds'), 1, '', '', '', '', '{}'
FROM s"""
DEAD_LETTERS = """
INSERT INTO queue_app_deadletter (job_id, kind, payload, attempts, reason, created_at, resolution)
SELECT id, kind, payload, attempts, 'failed', created_at, '' FROM queue_app_job WHERE state = 'dead_letter'"""


def recreate_database(vendor):
    from django.conf import settings

    db = settings.DATABASES["default"]
    if vendor == "sqlite":
        for suffix in ("", "-wal", "-shm"):
            Path(str(db["NAME"]) + suffix).unlink(missing_ok=True)
        return
    import psycopg

    with psycopg.connect(
        host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], dbname="postgres", autocommit=True
    ) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db["NAME"]}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{db["NAME"]}"')


def seed(cursor, vendor, jobs, events):
    if vendor == "sqlite":
        # No parameters: the SQL goes to SQLite as written (its % is modulo).
        cursor.execute(SQLITE_JOBS.replace("{jobs}", str(int(jobs))))
        cursor.execute(SQLITE_EVENTS.replace("{events}", str(int(events))).replace("{jobs}", str(int(jobs))))
    else:
        cursor.execute(PG_JOBS.replace("%", "%%").replace("%%s", "%s"), [jobs])
        cursor.execute(PG_EVENTS.replace("%", "%%").replace("%%s", "%s"), [jobs, events])
    cursor.execute(DEAD_LETTERS)
    cursor.execute("ANALYZE")


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def ms(seconds):
    return f"{seconds * 1000:.1f} ms"


def load():
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", choices=sorted(URLS), default="postgres")
    parser.add_argument("--jobs", type=int, default=10_000_000)
    parser.add_argument("--events", type=int, default=50_000_000)
    parser.add_argument("--scrapes", type=int, default=5, help="scrapes per median (default 5)")
    parser.add_argument("--reuse", action="store_true", help="keep the seeded database; only migrate it")
    args = parser.parse_args()
    os.environ.setdefault("DATABASE_URL", URLS[args.db])

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from queue_app.ops import metrics

    vendor = connection.vendor
    print(f"{vendor} {connection.settings_dict['NAME']}; {load()}")
    if not args.reuse:
        recreate_database(vendor)
        connection.close()
    call_command("migrate", verbosity=0)
    start = time.perf_counter()
    with connection.cursor() as cursor:
        if args.reuse:
            cursor.execute("ANALYZE")
        else:
            seed(cursor, vendor, args.jobs, args.events)
        cursor.execute("SELECT count(*) FROM queue_app_job")
        jobs = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM queue_app_event")
        events = cursor.fetchone()[0]
    verb = "found" if args.reuse else "seeded"
    print(f"{verb} {jobs:,} jobs and {events:,} events in {time.perf_counter() - start:.1f}s; {load()}")

    first = timed(metrics.render)
    print(f"first scrape (folds the {events:,}-event history, recounts the jobs once): {ms(first)}")
    kept = metrics._kept_groups
    # Before: the job gauges as every scrape read them until JobCount, a GROUP BY over
    # the job table; everything else the same.
    metrics._kept_groups = metrics._counted_groups
    try:
        before = [timed(metrics.render) for _ in range(args.scrapes)]
    finally:
        metrics._kept_groups = kept
    after = [timed(metrics.render) for _ in range(args.scrapes)]
    print(f"before, counting the job table: median {ms(statistics.median(before))}, max {ms(max(before))}")
    print(f"after, reading JobCount:        median {ms(statistics.median(after))}, max {ms(max(after))}")
    print(f"  ({load()})")
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO queue_app_event (job_id, type, at, attempt, worker, from_state, to_state, message,"
            " metadata) SELECT id, 'enqueued', created_at, 0, '', '', '', '', '{}' FROM queue_app_job"
            " ORDER BY id LIMIT 10000"
        )
    print(f"scrape after 10,000 new events: {ms(timed(metrics.render))}")
    snap = metrics.snapshot()
    print(f"check: jobs={sum(snap.jobs.values()):,} events_total={sum(snap.events.values()):,}")
    drift = metrics.verify()
    print(f"verify: {len(drift)} drifted count(s)")


if __name__ == "__main__":
    main()
