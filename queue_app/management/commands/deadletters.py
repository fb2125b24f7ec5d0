"""manage.py deadletters: jobs that ran out of attempts, and why."""

from queue_app.ops import cli
from queue_app.ops import reads as inspection


class Command(cli.QueueCommand):
    help = "List dead letters (newest first): jobs that spent their attempts, with the last error."
    epilog = """examples:
  manage.py deadletters
  manage.py deadletters --kind email --since 1h
  manage.py deadletters --all --json
  manage.py requeue 42 --payload '{"to": "fixed@example.com"}'     # then bring one back

--json prints a list of {id, job_id, kind, payload, attempts, reason, error, created_at,
resolved_at, resolution}."""

    def add_arguments(self, parser):
        parser.add_argument("--kind", help="Only this kind.")
        parser.add_argument(
            "--since",
            type=cli.duration,
            metavar="DURATION",
            help="Only those dead-lettered within this long, e.g. 1h or 7d.",
        )
        parser.add_argument("--all", action="store_true", help="Include resolved (requeued) ones.")
        parser.add_argument(
            "--limit", type=cli.positive_int, default=50, help="At most this many (default 50)."
        )
        parser.add_argument("--json", action="store_true", help="Print JSON.")
        cli.add_unredacted(parser)

    def handle(self, *args, **o):
        rows = inspection.dead_letters(
            kind=o["kind"],
            since=o["since"],
            include_resolved=o["all"],
            limit=o["limit"],
            unredacted=o["unredacted"],
        )
        if o["json"]:
            self.stdout.write(cli.dumps(rows))
            return
        console = self.console()
        if not rows:
            console.print("no dead letters")
            return
        t = cli.table("JOB", "KIND", "TRIES", "REASON", "AT", "RESOLVED", "ERROR", title="Dead letters")
        for d in rows:
            error = d["error"] or {}
            t.add_row(
                str(d["job_id"]),
                d["kind"],
                str(d["attempts"]),
                d["reason"],
                cli.when(d["created_at"]),
                d["resolution"] or "-",
                f"{error.get('type', '')}: {error.get('message', '')}"[:70],
            )
        console.print(t)
