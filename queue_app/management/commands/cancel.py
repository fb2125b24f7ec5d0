"""manage.py cancel: cancel a pending or running job."""

from queue_app.core import aborting
from queue_app.exceptions import InvalidTransition, JobNotFound
from queue_app.ops import cli


class Command(cli.QueueCommand):
    help = (
        "Cancel a pending job at once, or ask the worker running a leased one to abort it: "
        "the handler sees current_job().cancelled(), and a handler still running after "
        "ABORT_GRACE_SECONDS has its worker process killed. Either way the job ends cancelled "
        "and its idempotency key is released."
    )
    epilog = """examples:
  manage.py cancel 42
  manage.py cancel 42 --reason "sent by mistake"

Exit status 2 if the job does not exist or has already finished (nothing is written)."""

    def add_arguments(self, parser):
        parser.add_argument("job_id", type=cli.job_id, metavar="ID", help="The job's id.")
        parser.add_argument(
            "--reason", default="", help="Stored on the cancelled (or abort_requested) event."
        )

    def handle(self, *args, **o):
        try:
            job = aborting.cancel(o["job_id"], actor="cli", reason=o["reason"])
        except (JobNotFound, InvalidTransition) as exc:
            raise cli.bad_input(str(exc)) from None
        self.stdout.write(aborting.describe(job))
