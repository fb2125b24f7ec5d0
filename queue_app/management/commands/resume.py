"""manage.py resume: let a paused queue's or kind's jobs be leased again."""

from queue_app.core import flow
from queue_app.exceptions import InvalidJob
from queue_app.ops import cli


class Command(cli.QueueCommand):
    help = "Resume a paused queue or kind."
    epilog = """examples:
  manage.py resume --queue mail
  manage.py resume --kind report
  manage.py pause --list                             # what is paused now

Exit status 2 on a bad name or one that is not paused (nothing is written)."""

    def add_arguments(self, parser):
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--queue", help="Queue to resume.")
        target.add_argument("--kind", help="Kind to resume.")

    def handle(self, *args, queue=None, kind=None, **options):
        try:
            resumed = flow.resume(queue=queue, kind=kind)
        except InvalidJob as exc:
            raise cli.bad_input(str(exc)) from None
        what = f"queue {queue}" if queue else f"kind {kind}"
        if not resumed:
            raise cli.bad_input(f"{what} is not paused; `manage.py pause --list` shows what is")
        self.stdout.write(f"resumed {what}")
