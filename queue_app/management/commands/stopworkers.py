"""manage.py stopworkers: ask workers on any host to shut down gracefully."""

import time

from queue_app.models import Worker, WorkerState
from queue_app.ops import cli
from queue_app.worker import registry as workers


class Command(cli.QueueCommand):
    help = (
        "Ask running workers (all, or those named) to stop: they stop leasing, finish claimed jobs "
        "within their grace period and release the rest. The request is stored in the database."
    )
    epilog = """examples:
  manage.py stopworkers                              # every running worker, on every host
  manage.py stopworkers --worker web1:4242:a1b2      # one (names as `manage.py workers` lists them)
  manage.py stopworkers --wait 1m                    # and wait until they have stopped

Exit status 2 if a named worker is not running (nobody is asked), 1 if --wait runs out
before every worker asked has stopped."""

    def add_arguments(self, parser):
        parser.add_argument(
            "--worker",
            action="append",
            dest="names",
            metavar="NAME",
            help="Stop only this worker (repeatable). Default: all running workers.",
        )
        parser.add_argument(
            "--wait",
            type=cli.duration,
            metavar="DURATION",
            help="Wait up to this long for them to stop; exit 1 if some have not.",
        )

    def handle(self, *args, **o):
        try:
            asked = workers.request_stop(o["names"])
        except LookupError as exc:
            raise cli.bad_input(f"{exc}; `manage.py workers` lists the running ones") from None
        if not asked:
            self.stdout.write("no workers running")
            return
        for name in asked:
            self.stdout.write(f"stop requested: {name}")
        if o["wait"]:
            end = time.monotonic() + o["wait"]
            while time.monotonic() < end:
                left = Worker.objects.filter(name__in=asked).exclude(state=WorkerState.STOPPED).count()
                if not left:
                    self.stdout.write(f"{len(asked)} worker(s) stopped")
                    return
                time.sleep(0.1)
            raise cli.CommandError("some workers had not stopped when --wait ran out")
