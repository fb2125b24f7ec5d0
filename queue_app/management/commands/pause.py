"""manage.py pause: hold back a queue's or a kind's pending jobs on every worker."""

from queue_app.core import flow
from queue_app.exceptions import InvalidJob
from queue_app.ops import cli, reads


class Command(cli.QueueCommand):
    help = "Pause a queue or a kind on every worker: its pending jobs stay pending until `resume`."
    epilog = """examples:
  manage.py pause --queue mail --reason "smtp down"
  manage.py pause --kind report
  manage.py pause --list                             # what is paused, and the jobs held back
  manage.py resume --queue mail

Running jobs finish; nothing new of that queue or kind is leased. Exit status 2 on a bad
name (nothing is written)."""

    def add_arguments(self, parser):
        target = parser.add_mutually_exclusive_group()
        target.add_argument("--queue", help="Queue to pause.")
        target.add_argument("--kind", help="Kind to pause.")
        parser.add_argument("--reason", default="", help="Why; shown in the admin and dashboard.")
        parser.add_argument(
            "--list", action="store_true", help="List what is paused and the jobs held back (the default)."
        )

    def handle(self, *args, queue=None, kind=None, reason="", list=False, **options):
        if list or (queue is None and kind is None):
            rows = reads.pauses()
            if not rows:
                self.stdout.write("nothing is paused")
            for p, held in rows:
                self.stdout.write(
                    f"{p.scope:<6} {p.name:<30} {held:>8} pending  since {p.created_at:%Y-%m-%d %H:%M:%S}  {p.reason}"
                )
            return
        try:
            _, created = flow.pause(queue=queue, kind=kind, actor="manage.py", reason=reason)
        except InvalidJob as exc:
            raise cli.bad_input(str(exc)) from None
        what = f"queue {queue}" if queue else f"kind {kind}"
        self.stdout.write(f"paused {what}" if created else f"{what} was already paused")
