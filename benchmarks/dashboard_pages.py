"""Time each dashboard and admin page with 1,000,000 jobs in PostgreSQL.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/jq_bench .venv/bin/python benchmarks/dashboard_pages.py [--jobs N] [--hours H] [--attempts K] [--keep]

Creates the database if needed, migrates it, seeds N jobs (default 1,000,000) with
INSERT ... SELECT generate_series: 70% completed, 20% pending (ready, scheduled and
retrying), and the rest leased, dead-lettered and cancelled, with enqueued and
claimed and completed events spread over the last H hours (default 2; 168 puts a week
of history under the 7-day window), each completed job with K - 1 failed attempts
before its last (default 1 attempt; 6 makes about 10,000,000 events per 1,000,000
jobs). Then folds the seeded history into the queues page's flow rollup once
(metrics.rebuild_flow, timed; --keep reuses a rollup already built), asks each page through Django's test client (the whole
stack but the socket) and prints the median of 5 requests, with the load average.
"""

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobqueue_project.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/jq_bench")
# Sessions are signed: the test client logs in, so a throwaway key (never a site's).
os.environ.setdefault("SECRET_KEY", "dashboard-pages-benchmark-only")

SEED = """
INSERT INTO queue_app_job (kind, queue_name, payload, priority, run_at, state, attempts, max_attempts,
                           lease_owner, lease_expires_at, created_at, started_at, finished_at, last_error)
SELECT
    (ARRAY['email', 'report', 'thumbnail', 'webhook', 'billing.invoice'])[1 + i %% 5],
    (ARRAY['default', 'mail', 'media'])[1 + i %% 3],
    jsonb_build_object('n', i, 'to', 'user' || i || '@example.com'),
    (i %% 7) - 3,
    CASE WHEN s = 'scheduled' THEN now() + interval '1 hour' ELSE now() - (i %% %(spread)s) * interval '1 second' END,
    CASE WHEN s IN ('ready', 'scheduled', 'retrying') THEN 'pending' ELSE s END,
    CASE WHEN s IN ('retrying', 'leased') THEN 1 WHEN s = 'dead_letter' THEN 3 ELSE 0 END,
    3,
    CASE WHEN s = 'leased' THEN 'bench-worker' END,
    CASE WHEN s = 'leased' THEN now() + interval '30 seconds' END,
    now() - (i %% %(spread)s) * interval '1 second',
    CASE WHEN s IN ('completed', 'leased', 'dead_letter') THEN now() - (i %% %(spread)s) * interval '1 second' END,
    CASE WHEN s IN ('completed', 'dead_letter', 'cancelled') THEN now() - (i %% %(spread)s) * interval '1 second' END,
    CASE WHEN s IN ('dead_letter', 'retrying') THEN '{"type": "Boom", "message": "boom", "traceback": ""}'::jsonb END
FROM (
    SELECT i, CASE
        WHEN i %% 100 < 70 THEN 'completed'
        WHEN i %% 100 < 85 THEN 'ready'
        WHEN i %% 100 < 88 THEN 'scheduled'
        WHEN i %% 100 < 90 THEN 'retrying'
        WHEN i %% 100 < 92 THEN 'leased'
        WHEN i %% 100 < 96 THEN 'dead_letter'
        ELSE 'cancelled' END AS s
    FROM generate_series(1, %(n)s) AS i
) AS g
"""

# Attempt k of K (k < K) of a completed job: claimed, then failed a second later, k
# seconds into the job's life; attempt K is claimed and completed at its end.
EVENTS = """
INSERT INTO queue_app_event (job_id, type, at, attempt, worker, from_state, to_state, message, metadata)
SELECT id, 'enqueued', created_at, 0, '', '', 'pending', '', '{}'::jsonb FROM queue_app_job
UNION ALL
SELECT id, 'claimed', created_at + k * interval '1 second', k, 'bench-worker', 'pending', 'leased', '', '{}'::jsonb
FROM queue_app_job, generate_series(1, %(attempts)s - 1) AS k WHERE state = 'completed'
UNION ALL
SELECT id, 'failed', created_at + k * interval '1 second' + interval '0.5 second', k, 'bench-worker', 'leased',
       'pending', 'boom', '{}'::jsonb
FROM queue_app_job, generate_series(1, %(attempts)s - 1) AS k WHERE state = 'completed'
UNION ALL
SELECT id, 'claimed', finished_at - (id %% 10) * interval '1 second', %(attempts)s, 'bench-worker', 'pending',
       'leased', '', '{}'::jsonb
FROM queue_app_job WHERE state = 'completed'
UNION ALL
SELECT id, 'completed', finished_at, %(attempts)s, 'bench-worker', 'leased', 'completed', '', '{}'::jsonb
FROM queue_app_job WHERE state = 'completed'
UNION ALL
SELECT id, 'dead_lettered', finished_at, 3, 'bench-worker', 'leased', 'dead_letter', 'boom', '{}'::jsonb
FROM queue_app_job WHERE state = 'dead_letter'
"""

LETTERS = """
INSERT INTO queue_app_deadletter (job_id, kind, payload, attempts, error, reason, created_at, resolution)
SELECT id, kind, payload, attempts, last_error, 'failed', finished_at, '' FROM queue_app_job WHERE state = 'dead_letter'
"""


def ensure_database(url):
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def seed(n, hours, attempts):
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE queue_app_event, queue_app_deadletter, queue_app_job RESTART IDENTITY CASCADE"
        )
        t = time.perf_counter()
        cursor.execute(SEED, {"n": n, "spread": int(hours * 3600)})
        cursor.execute(EVENTS, {"attempts": attempts})
        cursor.execute(
            "UPDATE queue_app_job SET run_at = started_at - (id % 30) * interval '1 second', "
            f"attempts = {attempts}, max_attempts = greatest(max_attempts, {attempts}) "
            "WHERE state = 'completed'"
        )
        cursor.execute(LETTERS)
        # The metrics fold starts afresh (its first fold recounts the seeded jobs).
        for table in ("metricscheckpoint", "eventcount", "jobcount", "jobhistogram"):
            cursor.execute(f"DELETE FROM queue_app_{table}")
        cursor.execute("SELECT count(*) FROM queue_app_event")
        events = cursor.fetchone()[0]
        print(f"seeded {n:,} jobs and {events:,} events over {hours:g} h in {time.perf_counter() - t:.1f}s")
    # Fresh statistics and a visibility map, as autovacuum would give a live table.
    connection.ensure_connection()
    connection.connection.autocommit = True
    with connection.cursor() as cursor:
        t = time.perf_counter()
        cursor.execute("VACUUM ANALYZE queue_app_job")
        cursor.execute("VACUUM ANALYZE queue_app_event")
        cursor.execute("VACUUM ANALYZE queue_app_deadletter")
        print(f"vacuum analyze in {time.perf_counter() - t:.1f}s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--hours", type=float, default=2, help="spread the history over this many hours")
    parser.add_argument("--attempts", type=int, default=1, help="attempts per completed job (K - 1 failed)")
    parser.add_argument("--keep", action="store_true", help="reuse the jobs already seeded")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    url = os.environ["DATABASE_URL"]
    if not url.startswith("postgres"):
        sys.exit("this benchmark seeds with generate_series: point DATABASE_URL at PostgreSQL")
    ensure_database(url)

    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client
    from django.test.utils import setup_test_environment

    from queue_app.models import Job
    from queue_app.ops import metrics

    call_command("migrate", verbosity=0)
    seeded = not args.keep or not Job.objects.exists()
    if seeded:
        seed(args.jobs, args.hours, args.attempts)
    # A tree from before the rollup has none; --keep keeps a rollup already built.
    if hasattr(metrics, "rebuild_flow") and (seeded or not _has_rollup()):
        from django.utils import timezone

        t = time.perf_counter()
        metrics.catch_up()
        print(f"metrics fold caught up in {time.perf_counter() - t:.1f}s")
        t = time.perf_counter()
        read = metrics.rebuild_flow(timezone.now() - timedelta(days=8))
        print(f"flow rollup rebuilt from {read:,} events in {time.perf_counter() - t:.1f}s")
    settings.ALLOWED_HOSTS = ["testserver"]
    setup_test_environment()
    user, _ = get_user_model().objects.get_or_create(
        username="bench", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    some = Job.objects.filter(state="dead_letter").order_by("-id").values_list("id", flat=True).first()

    pages = [
        ("overview", "/dashboard/"),
        ("overview partial", "/dashboard/?partial=1"),
        ("jobs", "/dashboard/jobs/"),
        ("jobs ?status=retrying", "/dashboard/jobs/?status=retrying"),
        ("jobs ?status=dead_letter&kind=email", "/dashboard/jobs/?status=dead_letter&kind=email"),
        (
            "jobs page 100 (cursor)",
            f"/dashboard/jobs/?before={Job.objects.order_by('-id').values_list('id', flat=True)[50 * 100]}",
        ),
        ("job detail", f"/dashboard/jobs/{some}/"),
        ("dead letters", "/dashboard/dead-letters/"),
        ("workers", "/dashboard/workers/"),
        ("queues (window 1h)", "/dashboard/queues/"),
        ("queues ?window=5m", "/dashboard/queues/?window=5m"),
        ("queues ?window=15m", "/dashboard/queues/?window=15m"),
        ("queues ?window=24h", "/dashboard/queues/?window=24h"),
        ("queues ?window=7d", "/dashboard/queues/?window=7d"),
        ("queues partial", "/dashboard/queues/?partial=1"),
        ("running now", "/dashboard/running/"),
        ("schedules", "/dashboard/schedules/"),
        ("admin jobs", "/admin/queue_app/job/"),
        ("admin jobs ?status=late", "/admin/queue_app/job/?status=late"),
        ("admin jobs search", "/admin/queue_app/job/?q=user123@example"),
        ("admin events", "/admin/queue_app/event/"),
        ("admin dead letters", "/admin/queue_app/deadletter/"),
    ]
    total = Job.objects.count()
    print(f"{total:,} jobs; median of {args.repeat} requests per page; load average {_load()}")
    print(f"{'page':40} {'median ms':>10} {'max ms':>8}")
    for name, path in pages:
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            response = client.get(path)
            times.append((time.perf_counter() - t) * 1000)
            if response.status_code != 200:
                sys.exit(f"{path} answered {response.status_code}")
        print(f"{name:40} {statistics.median(times):10.1f} {max(times):8.1f}")
    print(f"load average {_load()}")


def _has_rollup():
    from queue_app.models import FlowBucket

    return FlowBucket.objects.exists()


def _load():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
