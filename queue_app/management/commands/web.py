import os
import re
import sys

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from queue_app.conf import settings

ADDR_RE = re.compile(r"^(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9.\-]*):(?P<port>\d{1,5})$")


def parse_addr(addr):
    """':8080' -> '0.0.0.0:8080'; 'host:port' as given. Raise CommandError when malformed."""
    m = ADDR_RE.match(addr or "")
    if not m or not 0 < int(m["port"]) < 65536:
        raise CommandError(f"--addr {addr!r} is not HOST:PORT or :PORT (e.g. 127.0.0.1:8000 or :8080)")
    return f"{m['host'] or '0.0.0.0'}:{int(m['port'])}"


def gunicorn_argv(addr, *, workers=None, timeout=None):
    """The gunicorn command line that serves the admin, dashboard and static files."""
    return [
        sys.executable, "-m", "gunicorn", "jobqueue_project.wsgi:application",
        "--bind", parse_addr(addr),
        "--workers", str(workers or settings.WEB_WORKERS),
        "--timeout", str(timeout or settings.WEB_TIMEOUT),
        "--access-logfile", "-",
        # Several servers may run on one host; none needs the shared control socket.
        "--no-control-socket",
    ]


class Command(BaseCommand):
    help = "Serve the admin, dashboard and static files with gunicorn."

    def add_arguments(self, parser):
        parser.add_argument("--addr", default=settings.WEB_ADDR, help="HOST:PORT or :PORT (all interfaces)")
        parser.add_argument("--workers", type=int, default=None, help="gunicorn worker processes")
        parser.add_argument("--timeout", type=int, default=None, help="seconds before a request is killed")
        parser.add_argument(
            "--no-collectstatic", action="store_true", help="serve STATIC_ROOT as it is, without collecting first"
        )

    def handle(self, *args, addr, workers, timeout, no_collectstatic, **options):
        if workers is not None and workers < 1:
            raise CommandError("--workers must be at least 1")
        argv = gunicorn_argv(addr, workers=workers, timeout=timeout)
        if not no_collectstatic:
            # whitenoise serves what collectstatic gathered; gathering is quick and idempotent.
            call_command("collectstatic", interactive=False, verbosity=0)
        self.stdout.write(f"serving on http://{argv[argv.index('--bind') + 1]}/ (dashboard at /dashboard/)")
        self.stdout.flush()
        os.execv(sys.executable, argv)
