"""manage.py limits: per-kind concurrency and rate limits, and fair share between tenants."""

from django.db import transaction

from queue_app.core import flow
from queue_app.exceptions import InvalidJob
from queue_app.ops import cli

_UNSET = flow._UNSET


def _optional_int(text):
    return None if text.lower() in ("none", "off", "0") else int(text)


def _weights(text):
    """'gold=3,silver=2' -> {"gold": 3, "silver": 2}; 'off' -> {} (every key weighs 1)."""
    if text.lower() == "off":
        return {}
    out = {}
    for part in text.split(","):
        key, sep, weight = part.rpartition("=")
        if not sep:
            raise ValueError(text)
        out[key.strip()] = int(weight)
    return out


def _on_off(text):
    if text.lower() not in ("on", "off"):
        raise ValueError(text)
    return text.lower() == "on"


class Command(cli.QueueCommand):
    help = (
        "Show per-kind concurrency and rate limits, or change one: "
        "`limits email --concurrency 5 --rate 100 --per 60`; `limits sync --per-key 1` runs at most one "
        "job per concurrency key at a time; `limits report --fair on` leases its concurrency keys (tenants) "
        "round-robin; `--concurrency off` (or `--per-key off`) clears it."
    )
    epilog = """examples:
  manage.py limits                                   # every limit, with what is leased now
  manage.py limits email --concurrency 5             # at most 5 email jobs leased at once
  manage.py limits email --rate 100 --per 60         # at most 100 starts a minute
  manage.py limits sync --per-key 1                  # one job per concurrency key at a time
  manage.py limits report --fair on                  # tenants (concurrency keys) take turns
  manage.py limits report --weights gold=3           # ... and key "gold" takes 3 jobs a turn
  manage.py limits email --concurrency off           # clear one limit
  manage.py limits email --clear                     # clear them all
  manage.py limits --sync                            # load JOBQUEUE["LIMITS"] first

Exit status 2 on a bad value (a number below 1, a bad kind name); nothing is written."""

    def add_arguments(self, parser):
        parser.add_argument("kind", nargs="?", help="Kind to change; omit to list.")
        parser.add_argument(
            "--concurrency",
            type=_optional_int,
            default=_UNSET,
            metavar="N",
            help="Jobs leased at once; 'off' clears.",
        )
        parser.add_argument(
            "--per-key",
            type=_optional_int,
            default=_UNSET,
            metavar="N",
            help="Jobs leased at once per concurrency key; 'off' clears.",
        )
        parser.add_argument(
            "--rate", type=_optional_int, default=_UNSET, metavar="N", help="Starts per period; 'off' clears."
        )
        parser.add_argument(
            "--per", type=float, default=_UNSET, metavar="SECONDS", help="Rate period in seconds."
        )
        parser.add_argument(
            "--fair",
            type=_on_off,
            default=_UNSET,
            metavar="on|off",
            help="Lease the kind's concurrency keys (tenants) round-robin: one job per tenant per round.",
        )
        parser.add_argument(
            "--weights",
            type=_weights,
            default=_UNSET,
            metavar="KEY=N,...",
            help="With --fair: jobs per round for these keys (others 1); 'off' clears.",
        )
        parser.add_argument("--clear", action="store_true", help="Remove every limit of the kind.")
        parser.add_argument("--sync", action="store_true", help="Load the LIMITS setting first.")

    def handle(
        self,
        *args,
        kind=None,
        concurrency=_UNSET,
        per_key=_UNSET,
        rate=_UNSET,
        per=_UNSET,
        fair=_UNSET,
        weights=_UNSET,
        clear=False,
        sync=False,
        **options,
    ):
        if (
            kind
            and not clear
            and concurrency is _UNSET
            and per_key is _UNSET
            and rate is _UNSET
            and per is _UNSET
            and fair is _UNSET
            and weights is _UNSET
        ):
            raise cli.bad_input("give --concurrency, --per-key, --rate/--per, --fair, --weights or --clear")
        try:
            # All or nothing: a bad LIMITS entry or value leaves every limit as it was.
            with transaction.atomic():
                if sync:
                    self.stdout.write(f"synced {len(flow.sync_limits())} limit(s) from settings")
                if kind and clear:
                    self.stdout.write(
                        f"cleared {kind}" if flow.clear_limit(kind) else f"{kind} had no limits"
                    )
                elif kind:
                    flow.set_limit(
                        kind,
                        concurrency=concurrency,
                        per_key=per_key,
                        rate_limit=rate,
                        rate_period=per,
                        fair=fair,
                        fair_weights=weights,
                    )
        except InvalidJob as exc:
            raise cli.bad_input(str(exc)) from None
        rows = flow.limit_status()
        if not rows:
            self.stdout.write("no limits")
        for row, leased, in_window, keys_full in rows:
            conc = f"{leased}/{row.concurrency} leased" if row.concurrency else f"{leased} leased (no cap)"
            keys = f"{row.per_key} per key ({keys_full} at limit)" if row.per_key else "no per-key cap"
            rate_text = (
                f"{in_window}/{row.rate_limit} per {row.rate_period:g}s"
                if row.rate_limit
                else "no rate limit"
            )
            fair_text = "   fair (round-robin by key)" if row.fair else ""
            if row.fair and row.fair_weights:
                fair_text += ", weights " + ",".join(f"{k}={n}" for k, n in sorted(row.fair_weights.items()))
            self.stdout.write(f"{row.kind:<30} {conc:<24} {keys:<28} {rate_text}{fair_text}")
