"""System checks: settings under which the queue works, but badly.

SQLite with Django's defaults (rollback journal, DEFERRED transactions, a 5 s timeout)
lets one worker's write lock fail another's with "database is locked" when several
processes share the file, so workers and enqueues fail at random under load.
"""

import re

from django.conf import settings
from django.core import checks

from queue_app.conf import RUNTIME
from queue_app.conf import settings as queue_settings
from queue_app.core import encryption, runtime

SQLITE_FIX = (
    'Set DATABASES[{alias!r}]["OPTIONS"] = {{"transaction_mode": "IMMEDIATE", "timeout": 30, '
    '"init_command": "PRAGMA journal_mode=WAL; PRAGMA busy_timeout=30000;"}} '
    "(jobqueue_project/settings.py does), or silence queue_app.W00{n} if you know better."
)


@checks.register(checks.Tags.compatibility)
def sqlite_options(app_configs=None, **kwargs):
    return sqlite_warnings(settings.DATABASES)


def sqlite_warnings(databases):
    """The warnings for a DATABASES setting."""
    out = []
    for alias, db in databases.items():
        if not db.get("ENGINE", "").endswith("sqlite3"):
            continue
        options = db.get("OPTIONS") or {}
        if str(options.get("transaction_mode", "")).upper() != "IMMEDIATE":
            out.append(
                checks.Warning(
                    f"SQLite database {alias!r} opens transactions DEFERRED: a worker's claim that "
                    "starts as a read fails with 'database is locked' when another process writes.",
                    hint=SQLITE_FIX.format(alias=alias, n=1),
                    id="queue_app.W001",
                )
            )
        if "journal_mode=wal" not in str(options.get("init_command", "")).replace(" ", "").lower():
            out.append(
                checks.Warning(
                    f"SQLite database {alias!r} is not opened in WAL mode: readers (the dashboard, "
                    "enqueues) wait for every worker's write and time out under load.",
                    hint=SQLITE_FIX.format(alias=alias, n=2),
                    id="queue_app.W002",
                )
            )
    return out


@checks.register()
def redaction_options(app_configs=None, **kwargs):
    """REDACT_KEYS must be words and REDACT_PATTERNS regular expressions: a bad one would
    fail every page that shows a payload."""
    out = []
    keys = queue_settings.REDACT_KEYS
    if isinstance(keys, str) or not all(isinstance(k, str) and k for k in keys):
        out.append(
            checks.Error(
                f'JOBQUEUE["REDACT_KEYS"] must be a list of non-empty strings, got {keys!r}',
                id="queue_app.E001",
            )
        )
    patterns = queue_settings.REDACT_PATTERNS
    if isinstance(patterns, str):
        patterns = [None]  # a lone string would be read as one pattern per character
    for i, pattern in enumerate(patterns):
        try:
            re.compile(pattern)
        except (re.error, TypeError) as exc:  # None: TypeError
            out.append(
                checks.Error(
                    f'JOBQUEUE["REDACT_PATTERNS"][{i}] {pattern!r} is not a regular expression: {exc}',
                    hint="REDACT_PATTERNS is a list of Python regular expressions.",
                    id="queue_app.E002",
                )
            )
    return out


@checks.register()
def encryption_options(app_configs=None, **kwargs):
    """ENCRYPTION_KEYS must be Fernet keys and ENCRYPTED_KINDS say True or field names:
    a bad one would refuse every enqueue of an encrypted kind."""
    out = []
    keys = queue_settings.ENCRYPTION_KEYS
    problem = encryption.check_keys(keys) if keys else None
    if problem:
        out.append(checks.Error(problem, id="queue_app.E003"))
    kinds = queue_settings.ENCRYPTED_KINDS or {}
    if not isinstance(kinds, dict):
        out.append(
            checks.Error(
                f'JOBQUEUE["ENCRYPTED_KINDS"] must be a dict of kind -> True or field names, got {kinds!r}',
                id="queue_app.E004",
            )
        )
        kinds = {}
    for kind, spec in kinds.items():
        try:
            encryption.spec_of(spec, f'JOBQUEUE["ENCRYPTED_KINDS"][{kind!r}]')
        except TypeError as exc:
            out.append(checks.Error(str(exc), id="queue_app.E004"))
    if kinds and not keys:
        out.append(
            checks.Error(
                'JOBQUEUE["ENCRYPTED_KINDS"] names kinds but JOBQUEUE["ENCRYPTION_KEYS"] is empty: '
                "their jobs would be refused at enqueue",
                id="queue_app.E005",
            )
        )
    return out


@checks.register()
def runtime_options(app_configs=None, **kwargs):
    """The settings `manage.py config` may change, as JOBQUEUE gives them: the same rule
    and message as a refused `config set` (core/runtime.problem)."""
    out = []
    for name in RUNTIME:
        message = runtime.problem(name, queue_settings.configured(name))
        if message:
            out.append(checks.Error(message, id="queue_app.E006"))
    return out
