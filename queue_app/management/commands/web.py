"""manage.py web: serve the admin, dashboard, API and static files with gunicorn."""

import os
import sys

from django.conf import settings as django_settings
from django.core.management import call_command

from queue_app import conf
from queue_app.conf import settings
from queue_app.core import addresses
from queue_app.ops import cli


def parse_addr(addr):
    """':8080' -> '0.0.0.0:8080'; 'host:port' as given. Raise a bad-input CommandError when malformed."""
    try:
        return addresses.bind(addr)
    except ValueError as exc:
        raise cli.bad_input(f"--addr {exc}") from None


def _wsgi_app():
    """The site's WSGI application as gunicorn names it (``module:attribute``)."""
    module, _, attribute = django_settings.WSGI_APPLICATION.rpartition(".")
    return f"{module}:{attribute}"


def default_workers():
    """One process per CPU, at least two (one busy process must not stop the site)."""
    return max(2, os.cpu_count() or 1)


def gunicorn_argv(addr, *, workers=None, threads=None, timeout=None):
    """The gunicorn command line that serves the admin, dashboard and static files."""
    return [
        sys.executable,
        "-m",
        "gunicorn",
        _wsgi_app(),
        "--bind",
        parse_addr(addr),
        "--workers",
        str(workers or settings.WEB_WORKERS or default_workers()),
        # Threads, not sync workers: with sync workers two slow or unfinished requests
        # (a client that never sends its last header) stopped the whole site.
        "--worker-class",
        "gthread",
        "--threads",
        str(threads or settings.WEB_THREADS),
        "--timeout",
        str(timeout or settings.WEB_TIMEOUT),
        "--access-logfile",
        "-",
        # Several servers may run on one host; none needs the shared control socket.
        "--no-control-socket",
    ]


class Command(cli.ServingCommand):
    help = "Serve the admin, dashboard, JSON API and static files with gunicorn."
    epilog = """examples:
  manage.py web                                      # on WEB_ADDR (default 127.0.0.1:8000)
  manage.py web --addr :8080                         # every interface, port 8080
  manage.py web --addr 127.0.0.1:8000 --workers 4 --threads 16 --timeout 120
  manage.py web --no-collectstatic                   # STATIC_ROOT is already collected
  manage.py createsuperuser                          # then log in at /admin/ and /dashboard/

Exit status 2 on a malformed --addr or a number below 1; gunicorn's own status otherwise
(e.g. 1 when the port is taken)."""

    def add_arguments(self, parser):
        parser.add_argument(
            "--addr",
            default=settings.WEB_ADDR,
            help=f"HOST:PORT, or :PORT for all interfaces (default {settings.WEB_ADDR}).",
        )
        parser.add_argument(
            "--workers",
            type=cli.positive_int,
            default=None,
            metavar="N",
            help=f"gunicorn worker processes (default {settings.WEB_WORKERS or 'one per CPU, at least 2'}).",
        )
        parser.add_argument(
            "--threads",
            type=cli.positive_int,
            default=None,
            metavar="N",
            help=f"Threads per worker process, each serving one request (default {settings.WEB_THREADS}).",
        )
        parser.add_argument(
            "--timeout",
            type=cli.positive_int,
            default=None,
            metavar="SECONDS",
            help=f"Seconds before a request is killed (default {settings.WEB_TIMEOUT}).",
        )
        parser.add_argument(
            "--no-collectstatic",
            action="store_true",
            help="Serve STATIC_ROOT as it is, without collecting first.",
        )

    def handle(self, *args, addr, workers, threads, timeout, no_collectstatic, **options):
        if problem := conf.missing_secret_key():
            raise cli.CommandError(problem)
        argv = gunicorn_argv(addr, workers=workers, threads=threads, timeout=timeout)
        if not no_collectstatic:
            # whitenoise serves what collectstatic gathered; gathering is quick and idempotent.
            call_command("collectstatic", interactive=False, verbosity=0)
        self.stdout.write(f"serving on http://{argv[argv.index('--bind') + 1]}/ (dashboard at /dashboard/)")
        self.stdout.flush()
        os.execv(sys.executable, argv)
