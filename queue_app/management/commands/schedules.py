"""manage.py schedules: the cron schedules and when each runs next."""

from django.db import transaction

from queue_app.exceptions import InvalidJob
from queue_app.ops import cli
from queue_app.worker import schedules as scheduling


class Command(cli.QueueCommand):
    help = "List cron schedules with their next run (--sync first writes the SCHEDULES setting)."
    epilog = """examples:
  manage.py schedules
  manage.py schedules --sync                         # load JOBQUEUE["SCHEDULES"] first

  JOBQUEUE = {"SCHEDULES": {"nightly-report": {"cron": "0 2 * * *", "kind": "report",
                                               "timezone": "Europe/Paris"}}}

Workers tick the schedules (SCHEDULE_INTERVAL) and sync them when they start. Exit status 2
when --sync finds a bad schedule in the setting (nothing is written)."""

    def add_arguments(self, parser):
        parser.add_argument("--sync", action="store_true", help="Load SCHEDULES from settings first.")

    def handle(self, *args, sync=False, **options):
        if sync:
            try:
                # One bad entry leaves every schedule as it was.
                with transaction.atomic():
                    names = scheduling.sync_schedules()
            except InvalidJob as exc:
                raise cli.bad_input(str(exc)) from None
            self.stdout.write(f"synced {len(names)} schedule(s) from settings")
        rows = scheduling.overview()
        if not rows:
            self.stdout.write("no schedules")
            return
        self.stdout.write(
            f"{'name':<24} {'cron':<20} {'kind':<24} {'queue':<12} {'tz':<16} {'last tick':<26} next run"
        )
        for s, upcoming in rows:
            nxt = upcoming.isoformat() if upcoming else "disabled" if not s.enabled else "invalid"
            last = s.last_tick.isoformat() if s.last_tick else "-"
            self.stdout.write(
                f"{s.name:<24} {s.cron:<20} {s.kind:<24} {s.queue_name:<12} {s.timezone:<16} {last:<26} {nxt}"
            )
