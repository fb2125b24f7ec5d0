"""Redaction: what a payload, result, error, traceback or captured output shows to a
caller who may not read secrets. Every surface (dashboard, admin, API, CLI) reads jobs
through here; stored rows are never changed, only the copies shown.

Two settings decide it (``queue_app.conf``): ``REDACT_KEYS``, words that make a JSON
key secret wherever it is nested (matched case-insensitively inside the key, ``-`` read
as ``_``: ``X-Api-Key`` and ``db_password`` are secret), whose whole value is replaced;
and ``REDACT_PATTERNS``, regular expressions whose matches in any string (a value, an
error message, a traceback, printed output) are replaced. A caller with
``queue_app.view_unredacted_payload`` (superusers have it; an API key with the
``unredacted`` scope) sees the stored values.

List previews are cut from the JSON text by the database (``reads._previewed``), so they
cannot be parsed: ``preview()`` reads the text's strings from its start, and at the first
secret key it shows nothing further. The preview stays bounded and shows less, never more.
"""

import copy
import json
import re
from functools import lru_cache

from queue_app.conf import settings
from queue_app.core import encryption

PERMISSION = "queue_app.view_unredacted_payload"
MARKER = "[redacted]"

# A JSON string token; inside a preview the text is JSON from its first character, so
# scanning from the start meets every string at its opening quote.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_COLON = re.compile(r"\s*:")


def _norm(word):
    return str(word).lower().replace("-", "_")


@lru_cache(maxsize=8)
def _compiled(keys, patterns):
    return tuple(_norm(k) for k in keys if k), tuple(re.compile(p) for p in patterns)


def _rules():
    return _compiled(tuple(settings.REDACT_KEYS), tuple(settings.REDACT_PATTERNS))


def secret_key(key):
    """Whether a JSON key's value is secret under REDACT_KEYS."""
    name = _norm(key)
    return any(word in name for word in _rules()[0])


def text(value):
    """``value`` (a string, or None) with every REDACT_PATTERNS match replaced."""
    if not isinstance(value, str) or not value:
        return value
    for pattern in _rules()[1]:
        value = pattern.sub(MARKER, value)
    return value


def redact(value):
    """A copy of JSON ``value`` with secret keys' values and pattern matches replaced,
    and encrypted values shown as ``[encrypted]``."""
    if isinstance(value, dict):
        if encryption.MARKER in value:
            rest = {k: redact(v) for k, v in value.items() if k != encryption.MARKER}
            return {**rest, encryption.MARKER: encryption.SHOWN} if rest else encryption.SHOWN
        return {k: MARKER if secret_key(k) else redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return text(value)
    return value


def preview(value):
    """A preview (the start of a JSON text, cut anywhere) redacted: the text stops at
    the first secret key's value, and pattern matches are replaced."""
    if not isinstance(value, str) or not value:
        return value
    value = sealed_preview(value)
    for match in _STRING.finditer(value):
        colon = _COLON.match(value, match.end())
        if colon is None:
            continue
        try:
            key = json.loads(match.group())
        except ValueError:
            key = match.group()[1:-1]
        if secret_key(key):
            return text(value[: colon.end()]) + f' "{MARKER}"…'
    return text(value)


# An encrypted value in a preview, maybe cut short: only its marker is shown, to anyone.
_TOKEN = re.compile(r'\{"' + re.escape(encryption.MARKER) + r'":\s*"[A-Za-z0-9_=-]*(?:"\s*\}?)?')


def sealed_preview(value):
    """A preview with its encrypted values shown as ``[encrypted]`` (a cut token cannot
    be opened, so an unredacted preview shows that too)."""
    if not isinstance(value, str) or encryption.MARKER not in value:
        return value
    return _TOKEN.sub(f'"{encryption.SHOWN}"', value)


# Fields of each model that carry what a handler, its caller or its output put there.
_JSON_FIELDS = ("payload", "result", "last_error", "metadata", "error")
_PREVIEWS = ("payload_preview", "result_preview", "error_preview")
_TEXTS = ("message", "last_error_message", "error_message", "progress_message")


def row(obj):
    """A shallow copy of a Job, Event or DeadLetter (or a list row of one) as a caller
    without PERMISSION sees it. Deferred columns stay deferred; the original is untouched."""
    shown = copy.copy(obj)  # a model's copy has its own __dict__ and state
    loaded = shown.__dict__
    for name in _JSON_FIELDS:
        if name in loaded:
            loaded[name] = redact(loaded[name])
    for name in _PREVIEWS:
        if name in loaded:
            loaded[name] = preview(loaded[name])
    for name in _TEXTS:
        if name in loaded:
            loaded[name] = text(loaded[name])
    return shown


def revealed(obj):
    """A Job, Event or DeadLetter (or a list row) as a caller with PERMISSION sees it:
    as stored, with encrypted values decrypted. ``obj`` itself when it holds none."""
    loaded = obj.__dict__
    json_fields = [n for n in _JSON_FIELDS if n in loaded and encryption.holds_tokens(loaded[n])]
    previews = [n for n in _PREVIEWS if isinstance(loaded.get(n), str) and encryption.MARKER in loaded[n]]
    if not json_fields and not previews:
        return obj
    shown = copy.copy(obj)
    for name in json_fields:
        shown.__dict__[name] = encryption.revealed(loaded[name])
    for name in previews:
        shown.__dict__[name] = sealed_preview(loaded[name])
    return shown


def rows(objs, unredacted):
    """``objs`` as shown: each one's revealed() when ``unredacted``, else its row()."""
    return [revealed(o) for o in objs] if unredacted else [row(o) for o in objs]


def data(value, unredacted):
    """A CLI dict (or list of them) as shown: every string pattern-checked, and the
    JSON columns' secret keys replaced."""
    if unredacted:
        return _revealed_data(value)
    if isinstance(value, list):
        return [data(v, False) for v in value]
    if isinstance(value, dict):
        return {
            k: redact(v)
            if k in (*_JSON_FIELDS, "output")
            else data(v, False)
            if isinstance(v, dict | list)
            else text(v)
            for k, v in value.items()
        }
    return text(value)


def _revealed_data(value):
    if isinstance(value, list):
        return [_revealed_data(v) for v in value]
    if isinstance(value, dict):
        return {
            k: encryption.revealed(v)
            if k in (*_JSON_FIELDS, "output")
            else sealed_preview(v)
            if k in _PREVIEWS
            else _revealed_data(v)
            if isinstance(v, dict | list)
            else v
            for k, v in value.items()
        }
    return value
