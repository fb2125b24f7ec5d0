"""manage.py stopworkers: ask workers on any host to shut down gracefully, or to go quiet."""

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
  manage.py stopworkers --quiet --wait 10m           # lease no more; wait until nothing is in hand

Exit status 2 if a named worker is not running (nobody is asked), 1 if --wait runs out
before every worker asked has stopped (with --quiet: is quiet with nothing in hand)."""

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
        parser.add_argument(
            "--quiet",
            action="store_true",
            help="Quiet instead of stop: they lease no more, run what they hold and stay up until "
            "stopped (drain a host before a deploy).",
        )

    def handle(self, *args, **o):
        quiet = o["quiet"]
        try:
            asked = (workers.request_quiet if quiet else workers.request_stop)(o["names"])
        except LookupError as exc:
            raise cli.bad_input(f"{exc}; `manage.py workers` lists the running ones") from None
        if not asked:
            self.stdout.write("no workers running" if not quiet else "no workers running and not stopping")
            return
        for name in asked:
            self.stdout.write(f"{'quiet' if quiet else 'stop'} requested: {name}")
        if o["wait"]:
            asked_rows = Worker.objects.filter(name__in=asked)
            if quiet:  # quiet, and its last heartbeat counted nothing in hand
                busy = asked_rows.exclude(state=WorkerState.STOPPED).exclude(
                    state=WorkerState.QUIET, jobs_in_hand=0
                )
            else:
                busy = asked_rows.exclude(state=WorkerState.STOPPED)
            end = time.monotonic() + o["wait"]
            while time.monotonic() < end:
                if not busy.exists():
                    self.stdout.write(f"{len(asked)} worker(s) {'quiet' if quiet else 'stopped'}")
                    return
                time.sleep(0.1)
            raise cli.CommandError(
                f"some workers had not {'gone quiet' if quiet else 'stopped'} when --wait ran out"
            )
