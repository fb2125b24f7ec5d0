"""Time a /metrics scrape on PostgreSQL with 1,000,000 jobs and 5,000,000 events.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/jq_bench_metrics \
        .venv/bin/python benchmarks/metrics_scrape.py [--jobs N] [--events-per-job K]

Creates and migrates the database named in DATABASE_URL (it is emptied first), seeds
it with INSERT ... SELECT generate_series (--reuse: keep a database seeded before and
only migrate it), then prints the time of the first scrape
(which counts the existing event history once), of steady-state scrapes, and of a
scrape after 10,000 new events.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobqueue_project.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/jq_bench_metrics")

STATES = ["pending", "leased", "completed", "dead_letter", "cancelled"]
TYPES = ["enqueued", "claimed", "completed", "failed", "dead_lettered"]


def recreate_database():
    import psycopg
    from django.conf import settings

    db = settings.DATABASES["default"]
    assert db["ENGINE"].endswith("postgresql"), "this benchmark runs on PostgreSQL"
    with psycopg.connect(
        host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], dbname="postgres", autocommit=True
    ) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db["NAME"]}"')
        conn.execute(f'CREATE DATABASE "{db["NAME"]}"')


def seed(cursor, jobs, per_job):
    # States cycle so that most jobs are completed, as in a long-running queue.
    cursor.execute(
        """
        INSERT INTO queue_app_job (kind, queue_name, payload, priority, run_at, state, attempts,
            max_attempts, lease_owner, lease_expires_at, created_at, started_at, finished_at)
        SELECT 'kind' || (g %% 20), 'queue' || (g %% 5), '{}'::jsonb, (g %% 7) - 3,
            now() - make_interval(secs => g %% 86400),
            CASE WHEN g %% 100 < 80 THEN 'completed' WHEN g %% 100 < 90 THEN 'pending'
                 WHEN g %% 100 < 93 THEN 'leased' WHEN g %% 100 < 97 THEN 'dead_letter' ELSE 'cancelled' END,
            1, 3,
            CASE WHEN g %% 100 BETWEEN 90 AND 92 THEN 'bench-worker' END,
            CASE WHEN g %% 100 BETWEEN 90 AND 92 THEN now() + interval '30 seconds' END,
            now() - make_interval(secs => g %% 86400), now(), now()
        FROM generate_series(1, %s) AS g
        """,
        [jobs],
    )
    cursor.execute(
        """
        INSERT INTO queue_app_event (job_id, type, at, attempt, worker, from_state, to_state, message, metadata)
        SELECT j.id, (ARRAY['enqueued','claimed','completed','failed','dead_lettered'])[1 + (k - 1) %% 5],
            now() - make_interval(secs => j.id %% 86400), 1, '', '', '', '', '{}'::jsonb
        FROM queue_app_job j CROSS JOIN generate_series(1, %s) AS k
        """,
        [per_job],
    )
    cursor.execute(
        """
        INSERT INTO queue_app_deadletter (job_id, kind, payload, attempts, reason, created_at, resolution)
        SELECT id, kind, payload, attempts, 'failed', now(), '' FROM queue_app_job WHERE state = 'dead_letter'
        """
    )
    cursor.execute("ANALYZE")


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--events-per-job", type=int, default=5)
    parser.add_argument("--reuse", action="store_true", help="keep the seeded database; only migrate it")
    args = parser.parse_args()

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from queue_app.ops import metrics

    if not args.reuse:
        recreate_database()
    call_command("migrate", verbosity=0)
    start = time.perf_counter()
    with connection.cursor() as cursor:
        if args.reuse:
            cursor.execute("ANALYZE")
        else:
            seed(cursor, args.jobs, args.events_per_job)
        cursor.execute("SELECT count(*) FROM queue_app_job")
        jobs = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM queue_app_event")
        events = cursor.fetchone()[0]
    print(
        f"{'found' if args.reuse else 'seeded'} {jobs:,} jobs and {events:,} events in {time.perf_counter() - start:.1f}s"
    )

    first = timed(metrics.render)
    print(f"first scrape (folds the {events:,}-event history once): {first * 1000:.0f} ms")
    steady = [timed(metrics.render) for _ in range(5)]
    print(
        f"steady-state scrape: median {statistics.median(steady) * 1000:.0f} ms, max {max(steady) * 1000:.0f} ms"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO queue_app_event (job_id, type, at, attempt, worker, from_state, to_state, message, metadata)
               SELECT id, 'enqueued', now(), 0, '', '', '', '', '{}'::jsonb FROM queue_app_job ORDER BY id LIMIT 10000"""
        )
    after = timed(metrics.render)
    print(f"scrape after 10,000 new events: {after * 1000:.0f} ms")
    snap = metrics.snapshot()
    print(f"check: jobs={sum(snap.jobs.values()):,} events_total={sum(snap.events.values()):,}")
    with connection.cursor() as cursor:
        for label, sql in [
            (
                "GROUP BY state, kind, queue_name",
                "SELECT state, kind, queue_name, count(*) FROM queue_app_job GROUP BY 1, 2, 3",
            ),
            (
                "oldest ready job",
                "SELECT min(run_at) FROM queue_app_job WHERE state = 'pending' AND run_at <= now()",
            ),
            (
                "unresolved dead letters",
                "SELECT count(*) FROM queue_app_deadletter WHERE resolved_at IS NULL",
            ),
        ]:
            t = time.perf_counter()
            cursor.execute(sql)
            cursor.fetchall()
            print(f"  {label}: {(time.perf_counter() - t) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
