from django.core.management.base import BaseCommand, CommandError

from queue_app import flow
from queue_app.exceptions import InvalidJob

_UNSET = flow._UNSET


def _optional_int(text):
    return None if text.lower() in ("none", "off", "0") else int(text)


class Command(BaseCommand):
    help = (
        "Show per-kind concurrency and rate limits, or change one: "
        "`limits email --concurrency 5 --rate 100 --per 60`; `limits sync --per-key 1` runs at most one "
        "job per concurrency key at a time; `--concurrency off` (or `--per-key off`) clears it."
    )

    def add_arguments(self, parser):
        parser.add_argument("kind", nargs="?", help="Kind to change; omit to list.")
        parser.add_argument("--concurrency", type=_optional_int, default=_UNSET, help="Jobs leased at once; 'off' clears.")
        parser.add_argument("--per-key", type=_optional_int, default=_UNSET,
                            help="Jobs leased at once per concurrency key; 'off' clears.")
        parser.add_argument("--rate", type=_optional_int, default=_UNSET, help="Starts per period; 'off' clears.")
        parser.add_argument("--per", type=float, default=_UNSET, help="Rate period in seconds.")
        parser.add_argument("--clear", action="store_true", help="Remove every limit of the kind.")
        parser.add_argument("--sync", action="store_true", help="Load the LIMITS setting first.")

    def handle(self, *args, kind=None, concurrency=_UNSET, per_key=_UNSET, rate=_UNSET, per=_UNSET,
               clear=False, sync=False, **options):
        try:
            if sync:
                self.stdout.write(f"synced {len(flow.sync_limits())} limit(s) from settings")
            if kind and clear:
                self.stdout.write(f"cleared {kind}" if flow.clear_limit(kind) else f"{kind} had no limits")
            elif kind:
                if concurrency is _UNSET and per_key is _UNSET and rate is _UNSET and per is _UNSET:
                    raise CommandError("give --concurrency, --per-key, --rate/--per or --clear")
                flow.set_limit(
                    kind, concurrency=concurrency, per_key=per_key, rate_limit=rate, rate_period=per
                )
        except InvalidJob as exc:
            raise CommandError(str(exc)) from None
        rows = flow.limit_status()
        if not rows:
            self.stdout.write("no limits")
        for row, leased, in_window, keys_full in rows:
            conc = f"{leased}/{row.concurrency} leased" if row.concurrency else f"{leased} leased (no cap)"
            keys = f"{row.per_key} per key ({keys_full} at limit)" if row.per_key else "no per-key cap"
            rate_text = f"{in_window}/{row.rate_limit} per {row.rate_period:g}s" if row.rate_limit else "no rate limit"
            self.stdout.write(f"{row.kind:<30} {conc:<24} {keys:<28} {rate_text}")
