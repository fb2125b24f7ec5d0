from django.core.management.base import BaseCommand, CommandError

from queue_app import flow
from queue_app.exceptions import InvalidJob


class Command(BaseCommand):
    help = "Resume a paused queue or kind."

    def add_arguments(self, parser):
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--queue", help="Queue to resume.")
        target.add_argument("--kind", help="Kind to resume.")

    def handle(self, *args, queue=None, kind=None, **options):
        try:
            resumed = flow.resume(queue=queue, kind=kind)
        except InvalidJob as exc:
            raise CommandError(str(exc)) from None
        what = f"queue {queue}" if queue else f"kind {kind}"
        if not resumed:
            raise CommandError(f"{what} is not paused")
        self.stdout.write(f"resumed {what}")
