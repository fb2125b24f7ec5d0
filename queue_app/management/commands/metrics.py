from django.core.management.base import BaseCommand, CommandError

from queue_app import metrics, metrics_http


class Command(BaseCommand):
    help = "Print the queue's Prometheus metrics once, or serve them over HTTP."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="Print one scrape to stdout and exit.")
        parser.add_argument(
            "--addr", default=":9090", help="Where to serve /metrics, e.g. :9090 or 127.0.0.1:9090 (default :9090)."
        )

    def handle(self, *args, once=False, addr=":9090", **options):
        if once:
            self.stdout.write(metrics.render().decode(), ending="")
            return
        try:
            httpd = metrics_http.server(addr)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"cannot listen on {addr}: {exc}") from None
        host, port = httpd.server_address[:2]
        self.stdout.write(f"serving metrics on http://{host}:{port}/metrics (Ctrl-C to stop)")
        try:
            httpd.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            httpd.server_close()
