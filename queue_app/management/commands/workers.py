"""manage.py workers: list registered workers with the age of their heartbeat."""
import json

from django.core.management.base import BaseCommand

from queue_app import durations, workers


class Command(BaseCommand):
    help = "List registered workers; one whose heartbeat is stale shows as lost."

    def add_arguments(self, parser):
        parser.add_argument("--all", action="store_true", help="Include workers that have stopped.")
        parser.add_argument("--json", action="store_true", help="Print JSON.")

    def handle(self, *args, **o):
        rows = workers.listing(include_stopped=o["all"])
        if o["json"]:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        if not rows:
            self.stdout.write("no workers running")
            return
        header = ("NAME", "HOST", "PID", "STATUS", "QUEUES", "PROCS", "IN HAND", "DONE", "HEARTBEAT")
        table = [header] + [
            (
                r["name"], r["host"], str(r["pid"]),
                r["status"] + (" (stop requested)" if r["stop_requested"] and r["status"] != "stopped" else ""),
                ",".join(r["queues"]) + (f" kinds={','.join(r['kinds'])}" if r["kinds"] else ""),
                f"{r['concurrency']}x{r['threads']}", str(r["jobs_in_hand"]), str(r["jobs_done"]),
                durations.format(r["heartbeat_age"]) + " ago",
            )
            for r in rows
        ]
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        for row in table:
            self.stdout.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
