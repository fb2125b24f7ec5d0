"""manage.py enqueue: put one job on the queue from the command line."""

import argparse

from queue_app.conf import settings
from queue_app.core import enqueueing, validation
from queue_app.exceptions import InvalidJob
from queue_app.ops import cli
from queue_app.ops import reads as inspection

# Keys the JSON-document form accepts, as the Python API names them.
DOCUMENT_KEYS = {
    "kind",
    "payload",
    "queue",
    "queue_name",
    "priority",
    "idempotency_key",
    "concurrency_key",
    "max_attempts",
    "run_at",
    "run_after",
    "timeout",
    "unique_for",
    "on_success",
    "on_failure",
    "webhook_url",
    "backoff_base",
    "backoff_max",
    "backoff_jitter",
    *validation.ADMISSION_FIELDS,
    "depends_on",
    "on_dependency_failure",
    *validation.ORDERING_FIELDS,
}
# Flags whose value is JSON: a follow-up job template.
TEMPLATE_FLAGS = ("on_success", "on_failure")
BACKOFF_FLAGS = ("backoff_base", "backoff_max", "backoff_jitter")
# Debounce and uniqueness by state, all plain strings here (durations parsed by the core).
ADMISSION_FLAGS = validation.ADMISSION_FIELDS


def number(text):
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None


def job_ids(text):
    """``41,42``: the ids of --depends-on."""
    return [cli.job_id(part.strip()) for part in text.split(",") if part.strip()]


class Command(cli.QueueCommand):
    help = (
        "Enqueue one job and print its id. Give the job as flags, or as one JSON document.\n"
        "With --idempotency-key, a live job with the same key is returned instead of a new one."
    )
    epilog = """examples:
  manage.py enqueue --kind email --payload '{"to": "user@example.com"}' --priority 20
  manage.py enqueue --kind report --payload '{"values": [1, 2, 3]}' --run-after 5m --max-attempts 5
  manage.py enqueue --kind email --payload '{"to": "a@example.com"}' --idempotency-key welcome:42
  manage.py enqueue --kind digest --idempotency-key digest:42 --unique-for 1h   # one per key per hour
  manage.py enqueue --kind report --on-success '{"kind": "email", "payload": {"to": "boss@example.com"}}'
  manage.py enqueue --kind report --on-failure '{"kind": "email", "priority": 50}'
  manage.py enqueue --kind report --webhook-url https://hooks.example.com/jobs   # host in WEBHOOK_ALLOWED_HOSTS
  manage.py enqueue --kind sync --payload '{"customer": 42}' --concurrency-key customer:42
  manage.py enqueue --kind email --run-at 2026-12-01T09:00:00Z --queue mail
  manage.py enqueue --kind reindex --debounce-key reindex:42 --debounce-for 30s --debounce-max-wait 5m
  manage.py enqueue --kind sync --unique-key sync:42 --unique-while pending   # one follow-up while one runs
  manage.py enqueue --kind sync --max-attempts 8 --backoff-base 3 --backoff-max 10m --backoff-jitter
  manage.py enqueue '{"kind": "email", "payload": {"to": "user@example.com"}, "priority": 20}'
  manage.py enqueue --command "echo hi"        # shell job; needs JOBQUEUE["SHELL_JOBS"] = True
  manage.py enqueue --kind email --payload '{"to": "x@example.com"}' --json
  manage.py enqueue --kind report --depends-on 41,42 --on-dependency-failure hold   # waits for 41 and 42
  manage.py enqueue --kind sync --ordering-key account:7 --ordering-blocks   # after account:7's last job

durations: 500ms, 30s, 5m, 1h, 7d or plain seconds (inside --on-success/--on-failure,
seconds only). The job document takes the same options under their Python names
(queue or queue_name, run_after, unique_for, on_success, webhook_url, ...).

--json prints one object: created (bool; false when a key matched a job or a debounce updated one),
job {id (int), kind, queue, state, status (str), priority (int), payload, attempts,
max_attempts (int), crashes (int or null: its attempts whose process died or was killed
for its timeout), idempotency_key, concurrency_key, ordering_key (str or null), run_at, created_at,
started_at, finished_at (ISO 8601 or null), lease_owner, lease_expires_at, timeout (seconds
or null), result, last_error, progress, progress_message, metadata, cancel_requested_at},
the same job object that inspect --json lists.

Exit status 2 on bad input (nothing is written)."""

    def add_arguments(self, parser):
        parser.add_argument(
            "document",
            nargs="?",
            metavar="JSON",
            help="The whole job as a JSON object: kind, payload and any option below "
            "(queue, priority, idempotency_key, concurrency_key, max_attempts, run_at, "
            "run_after, timeout, unique_for, on_success, on_failure, webhook_url, "
            "backoff_base, backoff_max, backoff_jitter).",
        )
        parser.add_argument("--kind", help="Handler that runs the job, e.g. email.")
        parser.add_argument("--payload", metavar="JSON", help="The job's JSON payload (default {}).")
        parser.add_argument(
            "--command",
            metavar="SHELL",
            help='A shell command, run by the "shell" kind (only when SHELL_JOBS is on).',
        )
        parser.add_argument("--queue", help=f"Queue name (default {settings.DEFAULT_QUEUE!r}).")
        parser.add_argument("--priority", type=cli.integer, help="-100..100, higher runs first (default 0).")
        parser.add_argument("--idempotency-key", metavar="KEY", help="Same key, same job: no duplicate.")
        parser.add_argument(
            "--concurrency-key",
            metavar="KEY",
            help="With the kind's per-key limit (limits KIND --per-key N), at most N jobs "
            "with this key run at once.",
        )
        parser.add_argument(
            "--max-attempts",
            type=cli.integer,
            metavar="N",
            help=f"Attempt budget (default {settings.DEFAULT_MAX_ATTEMPTS}).",
        )
        when = parser.add_mutually_exclusive_group()
        when.add_argument("--run-at", metavar="RFC3339", help="Earliest start, e.g. 2026-12-01T09:00:00Z.")
        when.add_argument("--run-after", type=cli.duration, metavar="DURATION", help="Delay, e.g. 30s or 5m.")
        parser.add_argument(
            "--timeout", type=cli.duration, metavar="DURATION", help="Execution limit, e.g. 2m."
        )
        parser.add_argument(
            "--unique-for",
            type=cli.duration,
            metavar="DURATION",
            help="With --idempotency-key: the key dedupes only this long after the first job "
            "was enqueued, e.g. 1h (default: as long as that job is live).",
        )
        parser.add_argument(
            "--on-success",
            metavar="JSON",
            help='Enqueue this follow-up job when this one completes: {"kind": ..., "payload": {...}, '
            'options}; the parent\'s outcome is added to its payload under "parent".',
        )
        parser.add_argument(
            "--on-failure",
            metavar="JSON",
            help="Enqueue this follow-up job when this one is dead-lettered (same shape).",
        )
        parser.add_argument(
            "--webhook-url",
            metavar="URL",
            help="POST the outcome here when the job finishes (http or https; the host must be "
            "in WEBHOOK_ALLOWED_HOSTS).",
        )
        parser.add_argument(
            "--backoff-base",
            type=number,
            metavar="B",
            help=f"Retry after B ** attempt seconds, 1..100 (default {settings.BACKOFF_BASE:g}).",
        )
        parser.add_argument(
            "--backoff-max",
            type=cli.duration,
            metavar="DURATION",
            help=f"Cap on one retry delay, e.g. 10m (default {settings.BACKOFF_MAX_SECONDS:g}s).",
        )
        parser.add_argument(
            "--backoff-jitter",
            action=argparse.BooleanOptionalAction,
            default=None,
            help=f"Spread each retry over 0..delay (default {'on' if settings.BACKOFF_JITTER else 'off'}).",
        )
        parser.add_argument(
            "--debounce-key",
            metavar="KEY",
            help="While KEY's job is pending and never leased, update it (run_at, payload) instead "
            "of enqueueing another; needs --debounce-for.",
        )
        parser.add_argument(
            "--debounce-for", metavar="DURATION", help="Run this long after the last enqueue, e.g. 30s."
        )
        parser.add_argument(
            "--debounce-max-wait", metavar="DURATION", help="But at most this long after the first, e.g. 5m."
        )
        parser.add_argument(
            "--debounce-mode",
            choices=validation.DEBOUNCE_MODES,
            help="replace (default): the newest payload wins; keep: the first stays.",
        )
        parser.add_argument(
            "--unique-key",
            metavar="KEY",
            help="Return KEY's newest job instead while it is in --unique-while's states.",
        )
        parser.add_argument(
            "--unique-while",
            metavar="STATES",
            help="active (default: pending or leased), pending (one follow-up while one runs), "
            "or states separated by commas.",
        )
        parser.add_argument(
            "--depends-on",
            type=job_ids,
            metavar="ID,ID",
            help="Job ids this one waits for: it stays waiting until they have all ended.",
        )
        parser.add_argument(
            "--on-dependency-failure",
            choices=["cancel", "run", "hold"],
            help="When one of --depends-on fails: cancel this job (default), run it anyway, or hold it.",
        )
        parser.add_argument(
            "--ordering-key",
            metavar="KEY",
            help="Jobs sharing KEY run one at a time, in enqueue order (this one waits for the one before).",
        )
        parser.add_argument(
            "--ordering-blocks",
            action="store_true",
            default=None,
            help="With --ordering-key: a dead-lettered job holds the next one until it is requeued and completes.",
        )
        parser.add_argument("--json", action="store_true", help="Print {created, job} as JSON (shape below).")

    def handle(self, *args, **o):
        kind, payload, options = self.request(o)
        try:
            job = enqueueing.enqueue(kind, payload, **options)
        except InvalidJob as exc:
            raise cli.bad_input(f"{exc}") from None
        if o["json"]:
            self.stdout.write(cli.dumps({"created": job.was_created, "job": inspection.job_dict(job)}))
        elif job.was_created:
            self.stdout.write(
                f"enqueued job {job.id} ({job.kind}, queue {job.queue_name}, "
                f"priority {job.priority}, run at {cli.when(job.run_at)})"
            )
        elif "debounce_key" in options:
            self.stdout.write(f"debounced job {job.id} ({job.state}): now runs at {cli.when(job.run_at)}")
        else:
            key = f"unique key {options['unique_key']!r}" if "unique_key" in options else None
            self.stdout.write(
                f"{key or f'idempotency key {job.idempotency_key!r}'} matched existing job {job.id} "
                f"({job.state}); nothing new enqueued"
            )

    def request(self, o):
        """Turn flags or the JSON document into enqueue() arguments; refuse bad input."""
        flags = {
            k: o[k]
            for k in (
                "kind",
                "payload",
                "command",
                "queue",
                "priority",
                "idempotency_key",
                "concurrency_key",
                "max_attempts",
                "run_at",
                "run_after",
                "timeout",
                "unique_for",
                *TEMPLATE_FLAGS,
                "webhook_url",
                *BACKOFF_FLAGS,
                *ADMISSION_FLAGS,
                "depends_on",
                "on_dependency_failure",
                *validation.ORDERING_FIELDS,
            )
            if o[k] is not None
        }
        if o["document"] is not None:
            if flags:
                raise cli.bad_input(
                    f"give the job as a JSON document or as flags, not both "
                    f"(got --{next(iter(flags)).replace('_', '-')})"
                )
            return self.from_document(o["document"])
        if o["command"] is not None:
            if o["kind"] or o["payload"]:
                raise cli.bad_input("--command makes a shell job; leave out --kind and --payload")
            if not settings.SHELL_JOBS:
                raise cli.bad_input(
                    'shell jobs are disabled: set JOBQUEUE["SHELL_JOBS"] = True '
                    "(JOBQUEUE_SHELL_JOBS=1 in the example project) to allow --command"
                )
            if not o["command"].strip():
                raise cli.bad_input("--command is empty")
            kind, payload = "shell", {"command": o["command"]}
        else:
            if not o["kind"]:
                raise cli.bad_input(
                    "say what to run: --kind KIND [--payload JSON], a JSON document, "
                    "or --command (see --help)"
                )
            kind = o["kind"]
            payload = cli.json_value(o["payload"]) if o["payload"] is not None else {}
        options = {
            "queue_name": o["queue"],
            "priority": o["priority"],
            "idempotency_key": o["idempotency_key"],
            "concurrency_key": o["concurrency_key"],
            "max_attempts": o["max_attempts"],
            "run_at": cli.timestamp(o["run_at"]) if o["run_at"] else None,
            "run_after": o["run_after"],
            "timeout": o["timeout"],
            "unique_for": o["unique_for"],
            **{
                k: cli.json_value(o[k], "--" + k.replace("_", "-"), '{"kind": "email", "payload": {}}')
                for k in TEMPLATE_FLAGS
                if o[k] is not None
            },
            "webhook_url": o["webhook_url"],
            **{k: o[k] for k in BACKOFF_FLAGS},
            **{k: o[k] for k in ADMISSION_FLAGS},
            "depends_on": o["depends_on"],
            "on_dependency_failure": o["on_dependency_failure"],
            **{k: o[k] for k in validation.ORDERING_FIELDS},
        }
        if o["unique_while"] is not None and "," in o["unique_while"]:
            options["unique_while"] = [s.strip() for s in o["unique_while"].split(",")]
        return kind, payload, {k: v for k, v in options.items() if v is not None}

    def from_document(self, text):
        doc = cli.json_value(text, "the job document")
        if not isinstance(doc, dict):
            raise cli.bad_input('the job document must be a JSON object with at least "kind"')
        unknown = sorted(set(doc) - DOCUMENT_KEYS)
        if unknown:
            raise cli.bad_input(
                f"unknown key(s) in the job document: {', '.join(unknown)}; "
                f"allowed: {', '.join(sorted(DOCUMENT_KEYS))}"
            )
        doc = dict(doc)
        kind = doc.pop("kind", None)
        if not kind:
            raise cli.bad_input('the job document needs "kind"')
        payload = doc.pop("payload", {})
        if "queue" in doc:
            if "queue_name" in doc:
                raise cli.bad_input('give "queue" or "queue_name", not both')
            doc["queue_name"] = doc.pop("queue")
        if isinstance(doc.get("run_at"), str):
            doc["run_at"] = cli.timestamp(doc["run_at"], '"run_at"')
        for key in ("run_after", "timeout", "unique_for", "backoff_max"):
            if isinstance(doc.get(key), str):
                try:
                    doc[key] = cli.durations.parse(doc[key])
                except ValueError as exc:
                    raise cli.bad_input(f'"{key}": {exc}') from None
        return kind, payload, {k: v for k, v in doc.items() if v is not None}
