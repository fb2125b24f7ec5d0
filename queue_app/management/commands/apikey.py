"""manage.py apikey: create, list or revoke keys for the JSON API."""

from django.utils import timezone

from queue_app.core import durations
from queue_app.models import ApiKey
from queue_app.ops import cli
from queue_app.web import auth as api_auth


class Command(cli.QueueCommand):
    help = "Create, list or revoke API keys for the JSON API (keys are stored hashed)."
    epilog = """examples:
  manage.py apikey create deploy-bot                # prints the key once: keep it
  manage.py apikey create grafana --read-only     # scopes: read
  manage.py apikey create ci --scopes read,write --expires 30d   # enqueue only, for 30 days
  manage.py apikey create ops-runner --shell        # may also enqueue shell jobs
  manage.py apikey create auditor --scopes read,unredacted   # reads secrets too
  manage.py apikey list
  manage.py apikey revoke deploy-bot
  curl -H "X-API-Key: $KEY" http://127.0.0.1:8000/api/jobs

Exit status 2 for a bad or duplicate name, or revoking a key that is not active
(nothing is written)."""

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="Create a key and print it once.")
        create.add_argument("name")
        create.add_argument(
            "--scopes",
            default="read,write,operate",
            help="Comma-separated, of read (always), write (enqueue), operate (cancel, requeue, "
            "replay, pause, resume), shell (shell jobs too), unredacted (payloads, results and "
            "errors as stored, secrets included). Default: read,write,operate.",
        )
        create.add_argument("--read-only", action="store_true", help="Scopes: read only.")
        create.add_argument(
            "--shell",
            action="store_true",
            help="Add the shell scope: enqueue, edit and requeue shell jobs (commands run on the workers).",
        )
        create.add_argument("--expires", help="Refuse the key after this long (30d, 12h ...); default never.")
        sub.add_parser("list", help="List keys (names and prefixes, never the keys).")
        revoke = sub.add_parser("revoke", help="Revoke a key by name.")
        revoke.add_argument("name")

    def handle(self, *args, action, **options):
        try:
            if action == "create":
                scopes = ["read"] if options["read_only"] else options["scopes"].split(",")
                scopes = [s.strip() for s in scopes if s.strip()] + (["shell"] if options["shell"] else [])
                expires = None
                if options["expires"] is not None:
                    try:
                        expires = durations.parse(options["expires"])
                    except ValueError as exc:
                        raise cli.bad_input(f"--expires: {exc}") from None
                key, raw = api_auth.create(options["name"], scopes=scopes, expires_in=expires)
                self.stderr.write(f"created key {key.name!r}; it is shown only now:")
                self.stdout.write(raw)
            elif action == "revoke":
                api_auth.revoke(options["name"])
                self.stdout.write(f"revoked {options['name']}")
            else:
                now = timezone.now()
                for key in ApiKey.objects.all():
                    if key.revoked_at:
                        status = "revoked"
                    elif key.expires_at and key.expires_at <= now:
                        status = "expired"
                    else:
                        status = ",".join(key.scopes)
                    used = key.last_used_at.isoformat() if key.last_used_at else "never"
                    expires = key.expires_at.isoformat() if key.expires_at else "never"
                    self.stdout.write(
                        f"{key.name}\t{key.prefix}…\t{status}\tlast used {used}\texpires {expires}"
                    )
        except api_auth.ApiKeyError as exc:
            raise cli.bad_input(str(exc)) from None
