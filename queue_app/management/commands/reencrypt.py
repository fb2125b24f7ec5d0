"""manage.py reencrypt: rotate stored encrypted payloads to the first key."""

from django.core.management.base import CommandError

from queue_app.core import transitions
from queue_app.exceptions import InvalidJob, UndecryptablePayload
from queue_app.ops import cli


class Command(cli.QueueCommand):
    help = (
        'Re-encrypt every stored encrypted value under the first key of JOBQUEUE["ENCRYPTION_KEYS"] '
        "(jobs' payloads, dead letters' copies, the previous payloads kept on requeued and "
        "payload_changed events). Rotation: put the new key first, run this, then drop the old key."
    )
    epilog = """examples:
  manage.py reencrypt
  manage.py reencrypt --batch-size 200

Exit status 1 if a stored value opens with no key (what was rotated stays rotated)."""

    def add_arguments(self, parser):
        parser.add_argument(
            "--batch-size", type=cli.positive_int, default=500, help="Rows read and written per transaction."
        )

    def handle(self, *args, **o):
        try:
            counts = transitions.reencrypt(batch_size=o["batch_size"])
        except (UndecryptablePayload, InvalidJob) as exc:
            raise CommandError(str(exc), returncode=1) from None
        self.stdout.write(
            f"re-encrypted {counts['tokens']} value(s): {counts['jobs']} job(s), "
            f"{counts['dead_letters']} dead letter(s), {counts['events']} event(s)"
        )
