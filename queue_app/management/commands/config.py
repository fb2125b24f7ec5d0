"""manage.py config: the runtime settings (core/runtime.py): list, set, unset, history."""

import getpass

from queue_app.core import runtime
from queue_app.exceptions import InvalidJob
from queue_app.ops import cli


def _actor():
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


def _shown(value):
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


class Command(cli.QueueCommand):
    help = (
        "Show or change the settings an operator tunes while the queue runs. A stored value "
        "overrides JOBQUEUE's in every worker within RUNTIME_SETTINGS_TTL seconds (no restart); "
        "each change is kept with who made it and the value before and after."
    )
    epilog = f"""names: {", ".join(runtime.NAMES)}
(stale-worker-timeout is lease-seconds: a worker is lost once silent for a lease)

examples:
  manage.py config list                      # each value, and whether the store or JOBQUEUE gives it
  manage.py config list --json
  manage.py config set max-attempts 5
  manage.py config set lease-seconds 2m      # seconds settings take 500ms, 30s, 5m, 1h
  manage.py config unset lease-seconds       # back to JOBQUEUE["LEASE_SECONDS"]
  manage.py config history [NAME]            # the latest changes, newest first

Exit status 2 on an unknown name or a bad value (the settings check's message); nothing is written."""

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True, metavar="{list,set,unset,history}")
        listing = sub.add_parser("list", help="Every runtime setting and where its value comes from.")
        listing.add_argument("--json", action="store_true", help="One JSON list of the settings.")
        setting = sub.add_parser("set", help="Store a value.")
        setting.add_argument("name")
        setting.add_argument("value")
        unsetting = sub.add_parser("unset", help="Go back to JOBQUEUE's value.")
        unsetting.add_argument("name")
        history = sub.add_parser("history", help="The latest changes, newest first.")
        history.add_argument("name", nargs="?")
        history.add_argument("--limit", type=cli.positive_int, default=20)
        history.add_argument("--json", action="store_true")

    def handle(self, *args, **o):
        try:
            getattr(self, f"_{o['action']}")(o)
        except InvalidJob as exc:
            raise cli.bad_input(str(exc)) from None

    def _list(self, o):
        rows = runtime.entries()
        if o["json"]:
            self.stdout.write(cli.dumps(rows))
            return
        table = cli.table("name", "value", "from", "JOBQUEUE", "changed", "by")
        for row in rows:
            table.add_row(
                row["name"],
                _shown(row["value"]),
                row["source"],
                _shown(row["configured"]),
                cli.when(row["updated_at"]) if row["updated_at"] else "-",
                row["updated_by"] or "-",
            )
        self.console().print(table)

    def _set(self, o):
        row = runtime.set_value(o["name"], o["value"], actor=_actor())
        self.stdout.write(f"{row['name']} = {_shown(row['value'])} (workers pick it up within seconds)")

    def _unset(self, o):
        row = runtime.unset(o["name"], actor=_actor())
        if row is None:
            setting = runtime.setting_name(o["name"])
            self.stdout.write(f"{runtime.KEYS[setting]} was not set; JOBQUEUE's value is in force")
            return
        self.stdout.write(f"{row['name']} unset: JOBQUEUE's {_shown(row['value'])} is in force")

    def _history(self, o):
        found = runtime.changes(o["name"], limit=o["limit"])
        if o["json"]:
            self.stdout.write(
                cli.dumps(
                    [
                        {"name": c.name, "old": c.old, "new": c.new, "actor": c.actor, "at": c.at}
                        for c in found
                    ]
                )
            )
            return
        table = cli.table("at", "name", "old -> new", "by")
        for c in found:
            table.add_row(
                cli.when(c.at), runtime.KEYS[c.name], f"{_shown(c.old)} -> {_shown(c.new)}", c.actor or "-"
            )
        self.console().print(table)
