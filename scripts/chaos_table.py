"""Print the chaos scenarios' JSON lines (scripts/chaos.sh) as a Markdown table."""

import json
import os
import sys

COLUMNS = (
    "scenario",
    "db",
    "jobs",
    "kills",
    "restarts",
    "released",
    "failed",
    "quick_pickup_p99_ms",
    "lost",
    "stuck",
    "duplicates",
    "duplicates_explained",
    "after_faults_s",
)


def main(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    load = os.getloadavg()[0]
    print(f"\n{len(rows)} scenario runs; load average now {load:.1f}\n")
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for r in rows:
        print("| " + " | ".join(str(r.get(c, "")) for c in COLUMNS) + " |")
    bad = [r for r in rows if r["lost"] or r["stuck"] or r["duplicates"] != r["duplicates_explained"]]
    if bad:
        print(f"\n{len(bad)} runs lost, stuck or ran a job twice unexplained", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
