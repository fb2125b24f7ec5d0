"""Fair-claim latency (flow.py, Fair share) beside the normal claim, at one backlog.

    .venv/bin/python benchmarks/fair_claim.py                 # SQLite file benchmarks/claim.db
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/jq_bench .venv/bin/python benchmarks/fair_claim.py
    ... --size 50000 --tenants 2,1000 --rounds 100

Seeds as claim.py does (5 priority levels, 10% scheduled), then spreads the jobs over
``tenants`` concurrency keys (a few keyless). Times claims that are rolled back (the
backlog and the fair kind's place in its cycle stay as seeded): the normal claim with no
limit row, then the same kind marked fair. Prints the load average with each line: the
machine is shared, and the figures mean little without it.
"""

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# claim.py sets Django up (as when it is run) and has the seed and the timed claim.
import claim
from django.db import connection

from queue_app.core import flow


def spread(tenants):
    """Give every job a tenant key ``t<id mod tenants>``; every 97th job none."""
    concat = "CONCAT('t', id %% %s)" if connection.vendor == "mysql" else "'t' || (id %% %s)"
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE queue_app_job SET concurrency_key = CASE WHEN id %% 97 = 0 THEN NULL ELSE {concat} END",
            [tenants],
        )
        cursor.execute(
            {"postgresql": "ANALYZE queue_app_job", "mysql": "ANALYZE TABLE queue_app_job"}.get(
                connection.vendor, "ANALYZE"
            )
        )
        if connection.vendor == "mysql":
            cursor.fetchall()


def line(label, limit, aging, rounds):
    for _ in range(5):
        claim.timed_claim(limit, aging)  # warm up
    samples = sorted(claim.timed_claim(limit, aging) for _ in range(rounds))
    p95 = samples[int(len(samples) * 0.95) - 1]
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"  {label:<6} batch={limit:<3} aging={'on ' if aging else 'off'}: "
        f"median {statistics.median(samples):6.2f} ms   p95 {p95:6.2f} ms   load {load}"
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=50_000)
    parser.add_argument("--tenants", default="2,1000")
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    claim.call_command("migrate", verbosity=0)
    print(f"database: {connection.vendor}, {args.size:,} pending jobs")
    for tenants in (int(t) for t in args.tenants.split(",")):
        flow.clear_limit("bench")
        claim.seed(args.size)
        spread(tenants)
        print(f"\n{tenants:,} tenants")
        for label in ("normal", "fair"):
            if label == "fair":
                flow.set_limit("bench", fair=True)
            for aging in (0, 30):
                for limit in (1, 10, 100):
                    line(label, limit, aging, args.rounds)
    flow.clear_limit("bench")


if __name__ == "__main__":
    sys.exit(main())
