"""manage.py history: a job and its whole event timeline."""

from queue_app.exceptions import JobNotFound
from queue_app.ops import cli
from queue_app.ops import reads as inspection
from queue_app.worker import capture


class Command(cli.QueueCommand):
    help = "Show one job, its event timeline, and each attempt's outcome with its result or error."
    epilog = """examples:
  manage.py history 42
  manage.py history 42 --json | jq '.attempts[].error.message'

--json prints one object: job {...}, why {code, text, link} (why a pending or waiting
job is not running now; null for others), events [...] (oldest first), attempts [{attempt,
worker, started_at, finished_at, seconds, outcome, result, error {type, message,
traceback}, output {stdout, stderr, log, truncated {stream: bytes dropped}} or null}],
dead_letters [...]. Output is what the handler printed and logged in that attempt (the
last OUTPUT_MAX_BYTES of each stream). Exit status 2 if the job does not exist."""

    def add_arguments(self, parser):
        parser.add_argument("job_id", type=cli.job_id, metavar="ID", help="The job's id.")
        parser.add_argument("--json", action="store_true", help="Print JSON.")
        cli.add_unredacted(parser)

    def handle(self, *args, **o):
        try:
            data = inspection.history(o["job_id"], unredacted=o["unredacted"])
        except JobNotFound as exc:
            raise cli.bad_input(str(exc)) from None
        if o["json"]:
            self.stdout.write(cli.dumps(data))
            return
        console = self.console()
        j = data["job"]
        console.print(
            f"[bold]job {j['id']}[/bold]: {j['kind']} on queue {j['queue']}, {j['status']}, "
            f"priority {j['priority']}, attempts {j['attempts']}/{j['max_attempts']}"
        )
        console.print(f"payload: {cli.compact(j['payload'])}", markup=False)
        if data.get("why"):
            console.print(f"why not running: {data['why']['text']}", markup=False)
        if j["idempotency_key"]:
            console.print(f"idempotency key: {j['idempotency_key']}", markup=False)
        if j["concurrency_key"]:
            console.print(f"concurrency key: {j['concurrency_key']}", markup=False)
        console.print(
            f"created {cli.when(j['created_at'])}, run at {cli.when(j['run_at'])}, "
            f"finished {cli.when(j['finished_at'])}"
        )
        if j["state"] == "completed":
            console.print(f"result: {cli.compact(j['result'])}", markup=False)
        if j["progress"] is not None:
            note = f" ({j['progress_message']})" if j["progress_message"] else ""
            console.print(f"progress: {j['progress']:g}%{note}", markup=False)
        if j["metadata"]:
            console.print(f"metadata: {cli.compact(j['metadata'])}", markup=False)
        if j["cancel_requested_at"]:
            console.print(f"abort requested {cli.when(j['cancel_requested_at'])}", markup=False)
        t = cli.table("AT", "EVENT", "TRY", "FROM", "TO", "WORKER", "MESSAGE", title="Timeline")
        for e in data["events"]:
            t.add_row(
                cli.when(e["at"]),
                e["type"],
                str(e["attempt"]),
                e["from_state"],
                e["to_state"],
                e["worker"],
                e["message"][:80],
            )
        console.print(t)
        for a in data["attempts"]:
            took = f" after {a['seconds']:.3f}s" if a["seconds"] is not None else ""
            console.print(f"attempt {a['attempt']} on {a['worker']}: {a['outcome']}{took}", markup=False)
            if a["error"]:
                console.print(f"  {a['error'].get('type')}: {a['error'].get('message')}", markup=False)
                trace = (a["error"].get("traceback") or "").rstrip()
                if trace:
                    console.print("    " + trace.replace("\n", "\n    "), markup=False, highlight=False)
            elif a["result"] is not None:
                console.print(f"  result: {cli.compact(a['result'])}", markup=False)
            for stream, text, dropped in capture.streams(a["output"]):
                cut = f" (the last part; {dropped} earlier bytes dropped)" if dropped else ""
                console.print(f"  {stream}{cut}:", markup=False)
                indented = "    " + text.rstrip("\n").replace("\n", "\n    ")
                console.print(indented, markup=False, highlight=False)
