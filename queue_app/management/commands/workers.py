"""manage.py workers: list registered workers with the age of their heartbeat."""

from queue_app.core import durations
from queue_app.ops import cli, reads


class Command(cli.QueueCommand):
    help = "List registered workers; one whose heartbeat is stale shows as lost."
    epilog = """examples:
  manage.py workers
  manage.py workers --all                            # stopped ones too
  manage.py workers --json | jq '.[] | select(.status == "lost") | .name'
  manage.py stopworkers --worker NAME                # then stop one
  manage.py stopworkers --quiet --worker NAME        # or have it lease no more

A worker is lost when it has not stopped but its heartbeat is older than LEASE_SECONDS:
its leases have lapsed (the dashboard, the admin, /health and /metrics use the same rule).
--json prints a list (newest first) of {name, host (str), pid (int), status (running,
quiet, stopping, lost or stopped), queues [str], kinds [str] ([] means every kind), concurrency,
threads, jobs_in_hand, jobs_done (int), started_at (ISO 8601), heartbeat_age (seconds,
float), stop_requested, quiet_requested (bool)}."""

    def add_arguments(self, parser):
        parser.add_argument("--all", action="store_true", help="Include workers that have stopped.")
        parser.add_argument("--json", action="store_true", help="Print JSON (shape below).")

    def handle(self, *args, **o):
        rows = reads.workers(include_stopped=o["all"])
        if o["json"]:
            self.stdout.write(cli.dumps(rows))
            return
        if not rows:
            self.stdout.write("no workers running")
            return
        header = ("NAME", "HOST", "PID", "STATUS", "QUEUES", "PROCS", "IN HAND", "DONE", "HEARTBEAT")
        table = [header] + [
            (
                r["name"],
                r["host"],
                str(r["pid"]),
                r["status"]
                + (" (stop requested)" if r["stop_requested"] and r["status"] != "stopped" else ""),
                ",".join(r["queues"]) + (f" kinds={','.join(r['kinds'])}" if r["kinds"] else ""),
                f"{r['concurrency']}x{r['threads']}",
                str(r["jobs_in_hand"]),
                str(r["jobs_done"]),
                durations.format(r["heartbeat_age"]) + " ago",
            )
            for r in rows
        ]
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        for row in table:
            self.stdout.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
