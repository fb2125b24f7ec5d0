"""What the management commands share: help with examples, input parsing that refuses
bad values with exit status 2, and rich tables (colour only on a terminal).

Exit statuses: 0 success, 1 operational failure, 2 bad usage or bad input (nothing
written). argparse already exits 2 for an unknown flag; ``bad_input`` does the same
for values only the command can judge, and ``QueueParser`` keeps it 2 when a command
runs through ``call_command``.
"""

import argparse
import json
import os
from datetime import UTC, datetime

from django.core.management.base import BaseCommand, CommandError, CommandParser, DjangoHelpFormatter
from django.utils import timezone
from rich import box
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from queue_app.core import durations

BAD_INPUT = 2


def bad_input(message):
    """A CommandError that exits 2: the caller must fix its input."""
    return CommandError(message, returncode=BAD_INPUT)


class QueueParser(CommandParser):
    """Django's parser, except that a bad flag given through call_command is a
    CommandError with exit status 2, as it is on the command line."""

    def error(self, message):
        if self.called_from_command_line:
            super().error(message)  # usage, the message, exit status 2
        raise bad_input(f"Error: {message}")


class QueueCommand(BaseCommand):
    """A command whose --help keeps the layout of its ``epilog`` (the examples), and
    whose flag errors exit 2 however it is called."""

    epilog = ""

    def create_parser(self, prog_name, subcommand, **kwargs):
        kwargs.setdefault("formatter_class", RawDescriptionDjangoFormatter)
        parser = super().create_parser(prog_name, subcommand, epilog=self.epilog or None, **kwargs)
        # BaseCommand builds a CommandParser itself, and add_arguments() has already made
        # any subcommand parsers: switch them all to QueueParser (it only adds error()).
        for p in _with_subparsers(parser):
            p.__class__ = QueueParser
        return parser

    def console(self):
        """A rich Console on this command's stdout: colour and live progress on a TTY only."""
        stream = getattr(self.stdout, "_out", self.stdout)
        tty = hasattr(stream, "isatty") and stream.isatty()
        return Console(
            file=stream,
            force_terminal=tty,
            no_color=not tty or "NO_COLOR" in os.environ,
            # Piped output is not wrapped at 80 columns: a script may grep whole rows.
            width=None if tty else 200,
            highlight=False,
            soft_wrap=not tty,
        )


class ServingCommand(QueueCommand):
    """A long-running command (a worker, a web or metrics server) that must start while
    the database refuses connections and wait for it, not crash at start-up: its system
    checks leave out the ones that connect (Django runs the model fields' backend checks
    against every database by default, and on MySQL/MariaDB that opens a connection
    before the command's own code runs). `manage.py check` still runs them all."""

    def check(self, *args, **kwargs):
        return super().check(*args, **{**kwargs, "databases": []})


def _with_subparsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _with_subparsers(sub)


class RawDescriptionDjangoFormatter(DjangoHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Django's ordering (command options first) with the epilog kept as written."""


# --- argument types (argparse turns ArgumentTypeError into "error: ..." and exit 2) ---


def add_unredacted(parser):
    """The --unredacted flag of the commands that print payloads, results and errors."""
    parser.add_argument(
        "--unredacted",
        action="store_true",
        help="Show payloads, results, errors and output as stored; by default secrets "
        "(REDACT_KEYS, REDACT_PATTERNS) show as [redacted].",
    )


def duration(text):
    try:
        return durations.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_duration(text):
    """A duration longer than 0, for the knobs where 0 would spin or mean nothing."""
    value = duration(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: must be longer than 0, e.g. 500ms or 30s"
        )
    return value


def _at_least_one(text, not_a_number, too_small):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(not_a_number) from None
    if value < 1:
        raise argparse.ArgumentTypeError(too_small)
    return value


def positive_int(text):
    return _at_least_one(
        text,
        f"invalid number {text!r}: expected a whole number",
        f"invalid number {text!r}: must be at least 1",
    )


def integer(text):
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: expected a whole number") from None


def job_id(text):
    message = f"invalid job id {text!r}: expected a positive whole number"
    return _at_least_one(text, message, message)


def json_value(text, what="--payload", example='{"to": "user@example.com"}'):
    """Parse JSON given on the command line or raise a bad-input CommandError."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise bad_input(f"{what} is not valid JSON ({exc}); e.g. '{example}'") from None


def timestamp(text, what="--run-at"):
    """Parse an RFC 3339 timestamp with a UTC offset, e.g. 2026-12-01T09:00:00Z."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise bad_input(f"{what} {text!r} is not an RFC 3339 time; e.g. 2026-12-01T09:00:00Z") from None
    if timezone.is_naive(value):
        raise bad_input(f"{what} {text!r} has no UTC offset; add Z or e.g. +02:00")
    return value


# --- output ---------------------------------------------------------------------------


class PlainTable(Table):
    """A table whose cells are plain text: a "[...]" in a payload is not rich markup."""

    def add_row(self, *cells, **kwargs):
        super().add_row(*(Text(str(c)) for c in cells), **kwargs)


def table(*headers, title=None):
    """An aligned table with a plain header rule (no box drawing)."""
    t = PlainTable(
        *headers,
        title=title,
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        title_justify="left",
        title_style="bold",
    )
    return t


def states_table(states):
    """The "Jobs by state" table of `inspect` and `status`."""
    t = table("STATE", "JOBS", title="Jobs by state")
    for state, n in states.items():
        t.add_row(state, str(n))
    return t


def pending_summary(p):
    """One line on the pending jobs (reads.counts()'s "pending" dict)."""
    return (
        f"pending: {p['ready']} ready ({p['late']} late), {p['scheduled']} scheduled, "
        f"{p['retrying']} retrying, {p['paused']} paused; oldest ready job waited {p['oldest_ready_seconds']:.1f}s"
    )


def when(value):
    """A datetime as the tables show it: UTC, to the millisecond."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def progress(console, description, total):
    """A progress bar on a terminal; nothing at all when the output is piped."""
    bar = Progress(console=console, transient=True, disable=not console.is_terminal)
    bar.task = bar.add_task(description, total=total)
    return bar


def compact(value):
    """JSON on one line, for a value inside a sentence."""
    return json.dumps(value, sort_keys=True, default=_default)


def dumps(value):
    """JSON as --json prints it: stable key order, ISO times."""
    return json.dumps(value, indent=2, sort_keys=True, default=_default)


def _default(value):
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
