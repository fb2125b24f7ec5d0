"""manage.py inspect: state counts, the latest jobs and the latest events."""

from queue_app.exceptions import InvalidJob
from queue_app.models import STATUSES
from queue_app.ops import cli
from queue_app.ops import reads as inspection

STATES_HELP = "\n".join(f"  {name:<12} {meaning}" for name, meaning in STATUSES.items())


class Command(cli.QueueCommand):
    help = "Show jobs per state, the newest jobs (with filters) and the latest events."
    epilog = f"""examples:
  manage.py inspect
  manage.py inspect --state dead_letter --kind email
  manage.py inspect --state retrying --queue mail --limit 50
  manage.py inspect --json | jq '.states'

states and statuses (--state takes any of them):
{STATES_HELP}

--json prints one object: at, filters, states {{state: count}}, pending {{ready, late,
scheduled, retrying, paused, oldest_ready_seconds}}, jobs [job...] (each with its state
and its status), events [event...]; times are ISO 8601."""

    def add_arguments(self, parser):
        parser.add_argument("--state", metavar="STATE", help="Only jobs in this state or status (below).")
        parser.add_argument("--kind", help="Only jobs of this kind.")
        parser.add_argument("--queue", help="Only jobs in this queue.")
        parser.add_argument("--limit", type=cli.positive_int, default=20, help="Jobs to list (default 20).")
        parser.add_argument(
            "--events",
            type=cli.integer,
            default=10,
            metavar="N",
            help="Recent events to list (default 10; 0 for none).",
        )
        parser.add_argument("--json", action="store_true", help="Print JSON.")
        cli.add_unredacted(parser)

    def handle(self, *args, **o):
        if o["events"] < 0:
            raise cli.bad_input("--events must be 0 or more")
        try:
            filters = inspection.Filters(state=o["state"], kind=o["kind"], queue=o["queue"])
        except InvalidJob as exc:
            raise cli.bad_input(str(exc)) from None
        data = inspection.snapshot(filters, limit=o["limit"], events=o["events"], unredacted=o["unredacted"])
        if o["json"]:
            self.stdout.write(cli.dumps(data))
            return
        console = self.console()
        counts = cli.states_table(data["states"])
        counts.caption = cli.pending_summary(data["pending"])
        counts.caption_justify = "left"
        console.print(counts)
        render_jobs(console, data["jobs"])
        if data["events"]:
            render_events(console, data["events"])


def render_jobs(console, jobs, title="Jobs (newest first)"):
    if not jobs:
        console.print("no jobs match")
        return
    t = cli.table("ID", "KIND", "QUEUE", "STATUS", "PRIO", "TRIES", "RUN AT", "ERROR", title=title)
    for j in jobs:
        error = (j["last_error"] or {}).get("message", "") if j["state"] != "completed" else ""
        t.add_row(
            str(j["id"]),
            j["kind"],
            j["queue"],
            j["status"],
            str(j["priority"]),
            f"{j['attempts']}/{j['max_attempts']}",
            cli.when(j["run_at"]),
            error[:60],
        )
    console.print(t)


def render_events(console, events, title="Recent events (newest first)"):
    t = cli.table("AT", "JOB", "KIND", "EVENT", "TRY", "WORKER", "MESSAGE", title=title)
    for e in events:
        t.add_row(
            cli.when(e["at"]),
            str(e["job_id"]),
            e.get("kind", ""),
            e["type"],
            str(e["attempt"]),
            e["worker"],
            e["message"][:60],
        )
    console.print(t)
