"""manage.py apikey: create, list or revoke keys for the JSON API."""

from queue_app.models import ApiKey
from queue_app.ops import cli
from queue_app.web import auth as api_auth


class Command(cli.QueueCommand):
    help = "Create, list or revoke API keys for the JSON API (keys are stored hashed)."
    epilog = """examples:
  manage.py apikey create deploy-bot                # prints the key once: keep it
  manage.py apikey create grafana --read-only
  manage.py apikey create ops-runner --shell        # may also enqueue shell jobs
  manage.py apikey list
  manage.py apikey revoke deploy-bot
  curl -H "X-API-Key: $KEY" http://127.0.0.1:8000/api/jobs

Exit status 2 for a bad or duplicate name, or revoking a key that is not active
(nothing is written)."""

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="Create a key and print it once.")
        create.add_argument("name")
        create.add_argument("--read-only", action="store_true", help="The key may read but not write.")
        create.add_argument(
            "--shell",
            action="store_true",
            help="The key may also enqueue, edit and requeue shell jobs (commands run on the workers).",
        )
        sub.add_parser("list", help="List keys (names and prefixes, never the keys).")
        revoke = sub.add_parser("revoke", help="Revoke a key by name.")
        revoke.add_argument("name")

    def handle(self, *args, action, **options):
        try:
            if action == "create":
                key, raw = api_auth.create(
                    options["name"], can_write=not options["read_only"], can_run_shell=options["shell"]
                )
                self.stderr.write(f"created key {key.name!r}; it is shown only now:")
                self.stdout.write(raw)
            elif action == "revoke":
                api_auth.revoke(options["name"])
                self.stdout.write(f"revoked {options['name']}")
            else:
                for key in ApiKey.objects.all():
                    status = "revoked" if key.revoked_at else ("read-write" if key.can_write else "read-only")
                    if key.can_run_shell and not key.revoked_at:
                        status += "+shell"
                    used = key.last_used_at.isoformat() if key.last_used_at else "never"
                    self.stdout.write(f"{key.name}\t{key.prefix}…\t{status}\tlast used {used}")
        except api_auth.ApiKeyError as exc:
            raise cli.bad_input(str(exc)) from None
