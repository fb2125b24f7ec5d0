"""manage.py doctor: check a live installation and say what to fix."""

from queue_app.ops import cli, doctor


class Command(cli.QueueCommand):
    help = (
        "Check a live installation: migrations, expired leases nobody will recover, lost "
        "workers, the database's settings. One line per finding with its fix."
    )
    epilog = """examples:
  manage.py doctor
  manage.py doctor && echo healthy

Exit status 0 if healthy, 1 if anything was found."""

    def handle(self, *args, **options):
        found = doctor.findings()
        for line in found:
            self.stdout.write(line)
        if found:
            raise SystemExit(1)
        self.stdout.write("healthy: nothing to fix")
