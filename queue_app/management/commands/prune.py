"""manage.py prune: delete old finished jobs with their events."""

from queue_app.exceptions import InvalidJob
from queue_app.ops import cli, maintenance


class Command(cli.QueueCommand):
    help = (
        "Delete jobs that finished longer ago than --older-than, with their events, in batches. "
        "Completed and cancelled jobs by default; dead-lettered jobs (and their dead letters) "
        "only when --state dead_letter is given. Pending and leased jobs are never pruned."
    )
    epilog = """examples:
  manage.py prune --older-than 7d --dry-run         # how many would go
  manage.py prune --older-than 7d                   # completed and cancelled jobs
  manage.py prune --older-than 30d --state completed
  manage.py prune --older-than 90d --state dead_letter --state cancelled

The metrics' event counters are brought up to date first, so jobqueue_events_total never
goes down. Exit status 2 on a bad duration or state (nothing is deleted)."""

    def add_arguments(self, parser):
        parser.add_argument(
            "--older-than",
            type=cli.duration,
            required=True,
            metavar="DURATION",
            help="Finished more than this long ago, e.g. 7d, 12h.",
        )
        parser.add_argument(
            "--state",
            action="append",
            dest="states",
            metavar="STATE",
            help="completed, cancelled or dead_letter (repeatable; default completed and cancelled).",
        )
        parser.add_argument(
            "--batch-size",
            type=cli.positive_int,
            metavar="N",
            help="Jobs per transaction (default PRUNE_BATCH_SIZE).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be deleted; delete nothing."
        )

    def handle(self, *args, **o):
        states = o["states"] or maintenance.PRUNE_DEFAULT
        try:
            total = maintenance.prunable(o["older_than"], states).count()
        except InvalidJob as exc:
            raise cli.bad_input(str(exc)) from None
        what = ", ".join(states)
        if o["dry_run"]:
            out = maintenance.prune(o["older_than"], states, dry_run=True)
            self.stdout.write(
                f"would delete {out.jobs} jobs ({what}), {out.events} events "
                f"and {out.dead_letters} dead letters"
            )
            return
        with cli.progress(self.console(), "pruning", total) as bar:
            out = maintenance.prune(
                o["older_than"],
                states,
                batch_size=o["batch_size"],
                progress=lambda n: bar.advance(bar.task, n),
            )
        self.stdout.write(
            f"deleted {out.jobs} jobs ({what}), {out.events} events and {out.dead_letters} dead letters"
        )
