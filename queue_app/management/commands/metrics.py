"""manage.py metrics: the Prometheus exposition, printed once or served."""

from queue_app import conf
from queue_app.core import addresses
from queue_app.ops import cli, metrics
from queue_app.web import metrics_http


class Command(cli.ServingCommand):
    help = "Print the queue's Prometheus metrics once, or serve them over HTTP."
    epilog = """examples:
  manage.py metrics --once                           # one scrape on stdout
  manage.py metrics --once | grep jobqueue_jobs
  manage.py metrics                                  # serve http://0.0.0.0:9090/metrics
  manage.py metrics --addr 127.0.0.1:9100
  curl -s http://127.0.0.1:9100/metrics
  manage.py metrics --verify                         # recount jobs, report drift of the kept counts
  manage.py metrics --repair                         # the same, then rewrite them from the recount

Without METRICS_TOKEN only loopback clients are served (see the README). Exit status 2
on a malformed --addr, 1 when the address cannot be listened on (e.g. the port is taken);
with --verify, 1 when the counts drifted."""

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="Print one scrape to stdout and exit.")
        parser.add_argument(
            "--addr",
            default=":9090",
            help="Where to serve /metrics, e.g. :9090 or 127.0.0.1:9090 (default :9090).",
        )

        parser.add_argument(
            "--verify",
            action="store_true",
            help="Recount the job table against the maintained counts /metrics reads; exit 1 on drift.",
        )
        parser.add_argument(
            "--repair", action="store_true", help="As --verify, then rewrite the counts from the recount."
        )

    def handle(self, *args, once=False, addr=":9090", verify=False, repair=False, **options):
        if verify or repair:
            drift = metrics.verify(repair=repair)
            for row in drift:
                self.stdout.write(f"drift: {row}")
            if not drift:
                self.stdout.write("job counts: no drift")
            elif repair:
                self.stdout.write(f"repaired {len(drift)} count(s) from the recount")
            else:
                self.stdout.write("fix: manage.py metrics --repair (on a quiet queue, then --verify again)")
                raise SystemExit(1)
            return
        if once:
            self.stdout.write(metrics.render().decode(), ending="")
            return
        if problem := conf.missing_secret_key():
            raise cli.CommandError(problem)
        try:
            addresses.parse(addr)
        except ValueError as exc:
            raise cli.bad_input(f"--addr {exc}") from None
        try:
            httpd = metrics_http.server(addr)
        except OSError as exc:
            raise cli.CommandError(f"cannot listen on {addr}: {exc}") from None
        host, port = httpd.server_address[:2]
        self.stdout.write(f"serving metrics on http://{host}:{port}/metrics (Ctrl-C to stop)")
        try:
            httpd.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            httpd.server_close()
