"""manage.py runworker: run jobs until stopped (SIGTERM/SIGINT or `stopworkers`)."""
import importlib

from django.core.management.base import BaseCommand, CommandError

from queue_app import sidecars, worker, workers
from queue_app.cli import duration, positive_int


class Command(BaseCommand):
    help = (
        "Run queued jobs: a supervisor with --concurrency child processes, each on --threads threads. "
        "Durations accept 500ms, 30s, 5m, 1h. Defaults come from the JOBQUEUE setting."
    )

    def add_arguments(self, parser):
        parser.add_argument("--queue", action="append", dest="queues", metavar="NAME",
                            help="Queue to serve (repeatable); '*' serves all. Default: all.")
        parser.add_argument("--kind", action="append", dest="kinds", metavar="KIND",
                            help="Only run jobs of this kind (repeatable).")
        parser.add_argument("--concurrency", "-c", type=positive_int, help="Child processes.")
        parser.add_argument("--threads", type=positive_int, help="Threads per child process.")
        parser.add_argument("--batch", type=positive_int, help="Jobs leased per claim.")
        parser.add_argument("--lease", type=duration, help="Lease period of a claim.")
        parser.add_argument("--poll", type=duration, help="How long an idle worker waits before looking again.")
        parser.add_argument("--aging", type=duration, help="Priority aging interval; 0 disables.")
        parser.add_argument("--heartbeat", type=duration, help="Lease renewal interval (default: lease/3).")
        parser.add_argument("--recovery-interval", type=duration, help="How often to recover expired leases.")
        parser.add_argument("--grace", type=duration, help="On shutdown, how long claimed jobs may finish.")
        parser.add_argument("--timeout", type=duration, help="Timeout for jobs that set none.")
        parser.add_argument("--max-jobs", type=positive_int, help="Exit after this many jobs.")
        parser.add_argument("--max-runtime", type=duration, help="Exit (gracefully) after this long.")
        parser.add_argument("--burst", action="store_true", help="Run the ready jobs, then exit.")
        parser.add_argument("--name", help="Worker name in the registry (default: host:pid:random).")
        parser.add_argument("--import", action="append", dest="imports", metavar="MODULE",
                            help="Import this module first, e.g. one that registers handlers (repeatable).")
        parser.add_argument("--metrics-addr", metavar="HOST:PORT",
                            help="Also serve /metrics here (as `manage.py metrics --addr`), e.g. :9100.")
        parser.add_argument("--web-addr", metavar="HOST:PORT",
                            help="Also serve the admin, dashboard and API here (as `manage.py web --addr`).")

    def handle(self, *args, **o):
        try:
            sidecars.check_addresses(o["metrics_addr"], o["web_addr"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if o["lease"] is not None and o["lease"] <= 0:
            raise CommandError("--lease must be longer than 0")
        if o["heartbeat"] is not None and o["lease"] is not None and o["heartbeat"] >= o["lease"]:
            raise CommandError("--heartbeat must be shorter than --lease, or leases lapse between renewals")
        for module in o["imports"] or []:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise CommandError(f"--import {module}: {exc}") from None
        options = worker.Options(
            queues=tuple(o["queues"] or ()),
            kinds=tuple(o["kinds"] or ()),
            concurrency=o["concurrency"],
            threads=o["threads"],
            batch=o["batch"],
            lease=o["lease"],
            poll=o["poll"],
            aging=o["aging"],
            heartbeat=o["heartbeat"] or None,
            recovery_interval=o["recovery_interval"],
            grace=o["grace"],
            timeout=o["timeout"] or None,
            max_jobs=o["max_jobs"],
            max_runtime=o["max_runtime"] or None,
            burst=o["burst"],
            name=o["name"],
        )
        try:
            with sidecars.serving(o["metrics_addr"], o["web_addr"]):
                code = worker.run(options)
        except (workers.NameInUse, sidecars.SidecarFailed) as exc:
            raise CommandError(str(exc)) from None
        if code:
            raise SystemExit(code)
