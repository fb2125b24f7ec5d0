"""manage.py runworker: run jobs until stopped (SIGTERM/SIGINT or `stopworkers`)."""

import argparse
import importlib

from queue_app import conf
from queue_app.conf import settings
from queue_app.ops import cli
from queue_app.ops.cli import duration, positive_duration, positive_int
from queue_app.worker import loop as worker
from queue_app.worker import registry as workers
from queue_app.worker import sidecars, supervisor


def _seconds(value, unset="none"):
    return unset if value is None else f"{value:g}s"


class Command(cli.ServingCommand):
    help = (
        "Run queued jobs: a supervisor with --concurrency child processes, each on --threads threads. "
        "Durations accept 500ms, 30s, 5m, 1h. Defaults come from the JOBQUEUE setting."
    )
    epilog = """examples:
  manage.py runworker                                   # every queue, until SIGTERM/SIGINT or stopworkers
  manage.py runworker --kind email                      # only email jobs
  manage.py runworker --concurrency 4 --batch 50 --queue default --queue mail
  manage.py runworker --burst --max-runtime 10m         # run what is ready, then exit
  manage.py runworker --max-jobs 1000 --grace 1m
  manage.py runworker --import myapp.handlers --lease 1m --poll 500ms
  manage.py runworker --metrics-addr :9100 --web-addr 127.0.0.1:8000
  manage.py work --kind email                           # the same command under the seed's name

Every flag's default is a JOBQUEUE setting (WORKER_CONCURRENCY, WORKER_THREADS,
WORKER_BATCH, WORKER_QUEUES, WORKER_KINDS, LEASE_SECONDS, POLL_INTERVAL, AGING_INTERVAL,
HEARTBEAT_INTERVAL, RECOVERY_INTERVAL, GRACE_SECONDS, DEFAULT_TIMEOUT, WORKER_MAX_JOBS,
WORKER_MAX_RUNTIME, WORKER_BURST). Exit status 0 after a graceful stop, 1 when the worker
cannot start (a server port taken, a worker of that name running), 2 on a bad flag."""

    def add_arguments(self, parser):
        s = settings
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="NAME",
            help=f"Queue to serve (repeatable); '*' serves all (default {', '.join(s.WORKER_QUEUES)}).",
        )
        parser.add_argument(
            "--kind",
            action="append",
            dest="kinds",
            metavar="KIND",
            help=f"Only run jobs of this kind (repeatable; default {s.WORKER_KINDS or 'every kind'}).",
        )
        parser.add_argument(
            "--concurrency",
            "-c",
            type=positive_int,
            metavar="N",
            help=f"Child processes (default {s.WORKER_CONCURRENCY}).",
        )
        parser.add_argument(
            "--threads",
            type=positive_int,
            metavar="N",
            help=f"Threads per child process (default {s.WORKER_THREADS}).",
        )
        parser.add_argument(
            "--batch",
            type=positive_int,
            metavar="N",
            help=f"Jobs leased per claim (default {s.WORKER_BATCH}).",
        )
        parser.add_argument(
            "--lease",
            type=positive_duration,
            metavar="DURATION",
            help=f"Lease period of a claim (default {_seconds(s.LEASE_SECONDS)}).",
        )
        parser.add_argument(
            "--poll",
            type=positive_duration,
            metavar="DURATION",
            help=f"How long an idle worker waits before looking again (default {_seconds(s.POLL_INTERVAL)}).",
        )
        parser.add_argument(
            "--aging",
            type=duration,
            metavar="DURATION",
            help=f"Priority aging interval; 0 disables (default {_seconds(s.AGING_INTERVAL)}).",
        )
        parser.add_argument(
            "--heartbeat",
            type=positive_duration,
            metavar="DURATION",
            help="Lease renewal interval, shorter than the lease "
            f"(default {_seconds(s.HEARTBEAT_INTERVAL, 'lease/3')}).",
        )
        parser.add_argument(
            "--recovery-interval",
            type=duration,
            metavar="DURATION",
            help="How often to recover expired leases; 0: only at start "
            f"(default {_seconds(s.RECOVERY_INTERVAL)}).",
        )
        parser.add_argument(
            "--grace",
            type=duration,
            metavar="DURATION",
            help=f"On shutdown, how long claimed jobs may finish (default {_seconds(s.GRACE_SECONDS)}).",
        )
        parser.add_argument(
            "--timeout",
            type=positive_duration,
            metavar="DURATION",
            help=f"Timeout for jobs that set none (default {_seconds(s.DEFAULT_TIMEOUT, 'no limit')}).",
        )
        parser.add_argument(
            "--max-jobs",
            type=positive_int,
            metavar="N",
            help=f"Exit after this many jobs (default {s.WORKER_MAX_JOBS or 'no limit'}).",
        )
        parser.add_argument(
            "--max-runtime",
            type=positive_duration,
            metavar="DURATION",
            help=f"Exit (gracefully) after this long (default {_seconds(s.WORKER_MAX_RUNTIME, 'no limit')}).",
        )
        parser.add_argument(
            "--burst",
            action=argparse.BooleanOptionalAction,
            default=None,
            help=f"Run the ready jobs, then exit (default {'on' if s.WORKER_BURST else 'off'}).",
        )
        parser.add_argument("--name", help="Worker name in the registry (default: host:pid:random).")
        parser.add_argument(
            "--import",
            action="append",
            dest="imports",
            metavar="MODULE",
            help="Import this module first, e.g. one that registers handlers (repeatable).",
        )
        parser.add_argument(
            "--metrics-addr",
            metavar="HOST:PORT",
            help="Also serve /metrics here (as `manage.py metrics --addr`), e.g. :9100.",
        )
        parser.add_argument(
            "--web-addr",
            metavar="HOST:PORT",
            help="Also serve the admin, dashboard and API here (as `manage.py web --addr`).",
        )

    def handle(self, *args, **o):
        if problem := conf.missing_secret_key():
            raise cli.CommandError(problem)
        try:
            sidecars.check_addresses(o["metrics_addr"], o["web_addr"])
        except ValueError as exc:
            raise cli.bad_input(str(exc)) from None
        if o["heartbeat"] is not None:
            lease = o["lease"] if o["lease"] is not None else settings.LEASE_SECONDS
            if o["heartbeat"] >= lease:
                raise cli.bad_input(
                    f"--heartbeat must be shorter than the lease ({lease:g}s), "
                    "or leases lapse between renewals"
                )
        for module in o["imports"] or []:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise cli.bad_input(f"--import {module}: {exc}") from None
        options = worker.Options(
            queues=tuple(o["queues"] or ()),
            kinds=tuple(o["kinds"] or ()),
            concurrency=o["concurrency"],
            threads=o["threads"],
            batch=o["batch"],
            lease=o["lease"],
            poll=o["poll"],
            aging=o["aging"],
            heartbeat=o["heartbeat"],
            recovery_interval=o["recovery_interval"],
            grace=o["grace"],
            timeout=o["timeout"],
            max_jobs=o["max_jobs"],
            max_runtime=o["max_runtime"],
            burst=o["burst"],
            name=o["name"],
        )
        try:
            with sidecars.serving(o["metrics_addr"], o["web_addr"]):
                code = supervisor.run(options)
        except (workers.NameInUse, sidecars.SidecarFailed) as exc:
            # Not the operator's typing: another process holds the name or the port.
            raise cli.CommandError(str(exc)) from None
        if code:
            raise SystemExit(code)
