"""manage.py seed: sample jobs for each bundled workload; running it twice adds nothing."""

from queue_app.ops import cli, fixtures


class Command(cli.QueueCommand):
    help = (
        "Enqueue three sample jobs for each bundled workload (email, report, webhook, flaky, slow), "
        "each with an idempotency key, so running it again adds nothing."
    )
    epilog = f"""examples:
  manage.py seed
  manage.py seed --kind email --kind webhook
  manage.py seed --count 100          # more of each
  manage.py runworker --burst         # then run them

workloads: {", ".join(fixtures.PAYLOADS)}"""

    def add_arguments(self, parser):
        parser.add_argument(
            "--kind", action="append", dest="kinds", metavar="KIND", help="Only this workload (repeatable)."
        )
        parser.add_argument(
            "--count", type=cli.positive_int, default=3, help="Jobs per workload (default 3)."
        )

    def handle(self, *args, **o):
        try:
            specs = fixtures.specs(o["kinds"], o["count"])
        except ValueError as exc:
            raise cli.bad_input(str(exc)) from None
        with cli.progress(self.console(), "seeding", len(specs)) as bar:
            created, existing = fixtures.seed(
                o["kinds"], o["count"], progress=lambda n: bar.advance(bar.task, n)
            )
        self.stdout.write(f"seeded {len(created)} new jobs; {len(existing)} were already there")
