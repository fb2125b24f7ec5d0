"""manage.py requeue: bring a dead-lettered (or cancelled) job back, or many at once."""

import math
import sys
from datetime import timedelta

from django.utils import timezone

from queue_app.core import transitions, validation
from queue_app.exceptions import InvalidJob, InvalidTransition, JobNotFound
from queue_app.models import Job, State
from queue_app.ops import actions, cli
from queue_app.ops.reads import Filters

_UNSET = object()


class Command(cli.QueueCommand):
    help = (
        "Send a dead-lettered or cancelled job back to pending with a fresh attempt budget, "
        "optionally with a corrected payload. --all-matching does it for every dead-lettered job "
        "the filters match, after a confirmation (or --yes)."
    )
    epilog = """examples:
  manage.py requeue 42
  manage.py requeue 42 --payload '{"to": "fixed@example.com"}' --max-attempts 5
  manage.py requeue --all-matching --kind email --since 1h          # asks before it starts
  manage.py requeue --all-matching --kind email --yes               # no question (scripts)
  manage.py requeue --all-matching --state cancelled --queue mail --yes

Exit status 2 on bad input, an unknown id, or a job that is not dead-lettered or cancelled;
nothing is written then."""

    def add_arguments(self, parser):
        parser.add_argument("job_id", nargs="?", type=cli.job_id, metavar="ID", help="The job to requeue.")
        parser.add_argument("--payload", metavar="JSON", help="Replace the payload (one job only).")
        parser.add_argument("--max-attempts", type=cli.integer, metavar="N", help="New attempt budget.")
        parser.add_argument(
            "--all-matching",
            action="store_true",
            help="Requeue every job matching --state/--kind/--queue/--since.",
        )
        parser.add_argument(
            "--state",
            choices=[State.DEAD_LETTER, State.CANCELLED],
            default=State.DEAD_LETTER,
            help="With --all-matching: which jobs (default dead_letter).",
        )
        parser.add_argument("--kind", help="With --all-matching: only this kind.")
        parser.add_argument("--queue", help="With --all-matching: only this queue.")
        parser.add_argument(
            "--since",
            type=cli.duration,
            metavar="DURATION",
            help="With --all-matching: only jobs that finished within this long.",
        )
        parser.add_argument("--yes", "-y", action="store_true", help="Do not ask for confirmation.")

    def handle(self, *args, **o):
        if o["max_attempts"] is not None:
            try:
                validation.max_attempts(o["max_attempts"])
            except InvalidJob as exc:
                raise cli.bad_input(str(exc)) from None
        if o["all_matching"]:
            return self.requeue_matching(o)
        if o["job_id"] is None:
            raise cli.bad_input("give a job id, or --all-matching with filters (see --help)")
        for flag in ("kind", "queue", "since"):
            if o[flag] is not None:
                raise cli.bad_input(f"--{flag} filters --all-matching; it makes no sense with a job id")
        payload = cli.json_value(o["payload"]) if o["payload"] is not None else _UNSET
        kwargs = {"max_attempts": o["max_attempts"], "actor": "cli"}
        if payload is not _UNSET:
            kwargs["payload"] = payload
        try:
            job = transitions.requeue(o["job_id"], **kwargs)
        except (InvalidJob, JobNotFound, InvalidTransition) as exc:
            raise cli.bad_input(str(exc)) from None
        self.stdout.write(
            f"requeued job {job.id} ({job.kind}): pending, {job.max_attempts} attempts"
            + (", payload replaced" if payload is not _UNSET else "")
        )

    def requeue_matching(self, o):
        if o["job_id"] is not None:
            raise cli.bad_input("give a job id or --all-matching, not both")
        if o["payload"] is not None:
            raise cli.bad_input("--payload replaces one job's payload; it cannot go with --all-matching")
        try:
            qs = Filters(state=o["state"], kind=o["kind"], queue=o["queue"]).apply(Job.objects.all())
        except InvalidJob as exc:
            raise cli.bad_input(str(exc)) from None
        if o["since"] is not None:
            qs = qs.filter(finished_at__gte=timezone.now() - timedelta(seconds=o["since"]))
        total = qs.count()
        if not total:
            self.stdout.write("no jobs match; nothing requeued")
            return
        if not o["yes"]:
            if not sys.stdin.isatty():
                raise cli.bad_input(f"{total} jobs match; pass --yes to requeue them without a terminal")
            answer = input(f"Requeue {total} {o['state']} jobs? [y/N] ").strip().lower()
            if answer not in ("y", "yes"):
                raise cli.CommandError("nothing requeued", returncode=1)
        console = self.console()
        with cli.progress(console, "requeueing", total) as bar:
            # The admin's bulk path, without its time budget: a terminal waits for it all.
            out = actions.apply_many(
                "requeue",
                qs,
                o["max_attempts"],
                actor="cli",
                seconds=math.inf,
                progress=lambda n: bar.advance(bar.task, n),
            )
        self.stdout.write(
            f"requeued {out.done} jobs"
            + (f"; {out.skipped} skipped (changed meanwhile)" if out.skipped else "")
        )
