"""manage.py cancel: cancel a pending or running job."""
from queue_app import cli, transitions
from queue_app.exceptions import InvalidTransition, JobNotFound


class Command(cli.QueueCommand):
    help = ("Cancel a pending job, or a leased one (its worker's result is then refused). "
            "The job's idempotency key is released.")
    epilog = """examples:
  manage.py cancel 42
  manage.py cancel 42 --reason "sent by mistake"

Exit status 2 if the job does not exist or has already finished (nothing is written)."""

    def add_arguments(self, parser):
        parser.add_argument("job_id", type=cli.job_id, metavar="ID", help="The job's id.")
        parser.add_argument("--reason", default="", help="Stored on the cancelled event.")

    def handle(self, *args, **o):
        try:
            job = transitions.cancel(o["job_id"], actor="cli", reason=o["reason"])
        except (JobNotFound, InvalidTransition) as exc:
            raise cli.bad_input(str(exc)) from None
        self.stdout.write(f"cancelled job {job.id} ({job.kind})")
