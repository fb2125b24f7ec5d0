"""manage.py status: counts by state, active workers and throughput."""

from queue_app.ops import cli
from queue_app.ops import reads as inspection


class Command(cli.QueueCommand):
    help = "Show jobs per state, active workers and throughput over the last minute and hour."
    epilog = """examples:
  manage.py status
  manage.py stats --json

--json prints one object: at, states {state: count}, pending {ready, late, scheduled,
retrying, paused, oldest_ready_seconds}, workers {running, stopping, lost, stopped,
jobs_in_hand}, dead_letters_open, throughput {last_minute, last_hour: {completed, failed,
per_minute}}. A worker is lost when it has not stopped but its heartbeat is older than
LEASE_SECONDS; a lost worker's jobs are not counted in hand."""

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="Print JSON.")

    def handle(self, *args, **o):
        data = inspection.status()
        if o["json"]:
            self.stdout.write(cli.dumps(data))
            return
        console = self.console()
        console.print(cli.states_table(data["states"]))
        w = data["workers"]
        console.print(cli.pending_summary(data["pending"]))
        console.print(
            f"workers: {w['running']} running, {w['stopping']} stopping, {w['lost']} lost; "
            f"{w['jobs_in_hand']} jobs in hand"
        )
        console.print(f"dead letters open: {data['dead_letters_open']}")
        t = cli.table("WINDOW", "COMPLETED", "FAILED", "PER MINUTE", title="Throughput")
        for window, row in data["throughput"].items():
            t.add_row(
                window.replace("_", " "), str(row["completed"]), str(row["failed"]), f"{row['per_minute']:g}"
            )
        console.print(t)
