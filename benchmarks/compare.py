"""Run `make bench`'s figures for this tree and another commit, alternating, in one run;
print each pair and its ratio (this tree / the other) with the load average.

    .venv/bin/python benchmarks/compare.py HEAD~3                  # sqlite
    .venv/bin/python benchmarks/compare.py 734a715 --db sqlite --db postgres --rounds 2

The other commit is checked out in a temporary git worktree and run with this tree's
.venv (the requirements must be compatible), against the same databases, one benchmark
at a time, in turns (A B, then B A on the next round), so that the machine's load drifts
over both alike. The figures compared are those `make bench` prints: the drain at
--batch 100, 10 (the default) and 1, single and bulk enqueues, and the enqueue-to-start latency.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

# (name, script and arguments, the JSON fields to compare; higher is better unless "_ms")
BENCHES = [
    ("drain batch 100", ["benchmarks/worker_throughput.py", "--batch", "100"], ["jobs_per_s"]),
    # The default batch: what a site that sets nothing gets.
    (
        "drain batch 10",
        ["benchmarks/worker_throughput.py", "--batch", "10", "--jobs", "10000"],
        ["jobs_per_s"],
    ),
    ("drain batch 1", ["benchmarks/worker_throughput.py", "--batch", "1", "--jobs", "5000"], ["jobs_per_s"]),
    ("enqueue", ["benchmarks/enqueue_throughput.py", "--clients", "1", "--bulk", "100000"], ["jobs_per_s"]),
    ("latency", ["benchmarks/worker_throughput.py", "--latency"], ["p50_ms", "p99_ms"]),
]


def run(tree, args, db):
    out = subprocess.run([PY, *args, "--db", db], cwd=tree, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("rev", help="the commit to compare with (e.g. HEAD~1, a hash)")
    parser.add_argument("--db", action="append", choices=["sqlite", "postgres", "mysql"])
    parser.add_argument("--rounds", type=int, default=1, help="runs of each benchmark per tree (default 1)")
    parser.add_argument("--only", action="append", help="benchmark names to run (default all)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="jq-compare-") as tmp:
        other = Path(tmp) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(other), args.rev], cwd=ROOT, check=True
        )
        try:
            compare(args, other)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=ROOT, check=True)


def compare(args, other):
    trees = {"this": ROOT, args.rev: other}
    for db in args.db or ["sqlite"]:
        for name, script, fields in BENCHES:
            if args.only and name not in args.only:
                continue
            got = {label: [] for label in trees}
            for r in range(args.rounds):
                order = list(trees.items()) if r % 2 == 0 else list(trees.items())[::-1]
                for label, tree in order:
                    got[label].append(run(tree, script, db))
            for i in range(len(got["this"][0])):
                for field in fields:
                    mine = statistics.median(run_[i][field] for run_ in got["this"])
                    theirs = statistics.median(run_[i][field] for run_ in got[args.rev])
                    line = got["this"][0][i]
                    print(
                        json.dumps(
                            {
                                "bench": name,
                                "db": db,
                                "mode": line.get("mode"),
                                "field": field,
                                "this": mine,
                                args.rev: theirs,
                                "this_over_other": round(mine / theirs, 3) if theirs else None,
                                "load_1m": round(os.getloadavg()[0], 2),
                            }
                        ),
                        flush=True,
                    )


if __name__ == "__main__":
    main()
