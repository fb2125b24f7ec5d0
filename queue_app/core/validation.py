"""Checks on what callers hand the queue, done before anything is written.

Every refusal is an InvalidJob that names the field and says what to fix.
"""

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from numbers import Real

from django.utils import timezone

from queue_app.conf import settings
from queue_app.core import durations, encryption, urls
from queue_app.exceptions import InvalidJob
from queue_app.models import (
    ADMISSION_KEY_MAX_LENGTH,
    CONCURRENCY_KEY_MAX_LENGTH,
    IDEMPOTENCY_KEY_MAX_LENGTH,
    KIND_MAX_LENGTH,
    PRIORITY_MAX,
    PRIORITY_MIN,
    QUEUE_NAME_MAX_LENGTH,
    State,
)

# \Z, not $: $ also matches before a trailing newline.
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:\-]*\Z")
# MariaDB's JSON_VALID (its JSON columns' CHECK) refuses 32 or more nesting levels, and
# a payload is stored nested a level or two deeper too (an event's previous_payload, a
# follow-up job's parent outcome): leave that margin.
MAX_JSON_DEPTH = 24
# Farther than this is a typo, not a schedule.
MAX_SCHEDULE_AHEAD = timedelta(days=3650)
# Per-job backoff bounds: a base above 100 reaches any cap within a few attempts, and a
# retry parked for more than a week is a lost job, not a backoff.
BACKOFF_BASE_RANGE = (1, 100)
MAX_BACKOFF_SECONDS = 7 * 24 * 3600

# Debounce and uniqueness by state (transitions._debounce, transitions._unique).
ADMISSION_FIELDS = (
    "debounce_key",
    "debounce_for",
    "debounce_max_wait",
    "debounce_mode",
    "unique_key",
    "unique_while",
)
DEBOUNCE_MODES = ("replace", "keep")
# unique_while's names for the state sets people mean; any tuple of states also goes.
UNIQUE_PRESETS = {
    # At most one waiting job per key: while one runs, one follow-up is queued.
    "pending": ("pending",),
    # At most one waiting or running job per key: while one runs, it is returned.
    "active": ("pending", "leased"),
}
# Ordered keys (transitions._enqueue_ordered): jobs sharing an ordering_key run one at a
# time in enqueue order; with ordering_blocks a dead-lettered one holds those after it.
ORDERING_FIELDS = ("ordering_key", "ordering_blocks")
ENQUEUE_FIELDS = (
    "queue_name",
    "priority",
    "run_at",
    "run_after",
    "max_attempts",
    "idempotency_key",
    "concurrency_key",
    "timeout",
    "unique_for",
    "on_success",
    "on_failure",
    "webhook_url",
    "backoff_base",
    "backoff_max",
    "backoff_jitter",
    *ADMISSION_FIELDS,
    *ORDERING_FIELDS,
)
# A follow-up template is stored as JSON until its parent finishes: no datetimes.
TEMPLATE_FIELDS = tuple(f for f in ENQUEUE_FIELDS if f != "run_at")


@dataclass(frozen=True)
class EnqueueRequest:
    """A validated job, ready to insert."""

    kind: str
    payload: object
    queue_name: str
    priority: int
    run_at: datetime | None
    max_attempts: int
    idempotency_key: str | None
    timeout: float | None
    # Seconds the idempotency key dedupes for; None: for as long as the job exists.
    unique_for: float | None = None
    # Follow-up job templates (follow_ups.py) and the outcome's webhook (webhooks.py).
    on_success: dict | None = None
    on_failure: dict | None = None
    webhook_url: str | None = None
    # Per-job retry backoff; None: the BACKOFF_* settings (conf.py).
    backoff_base: float | None = None
    backoff_max: float | None = None
    backoff_jitter: bool | None = None
    # Jobs of a kind with a per_key limit (flow.py) that share this key are leased at
    # most per_key at a time; None: not limited per key.
    concurrency_key: str | None = None
    # Set by chaining for a follow-up job, never by callers.
    parent_id: int | None = None
    # Workflows (core/workflows.py): the group it is a member of (set by canvas.group,
    # never by callers), the ids it waits for, and its dependency options
    # {"policy": cancel|run|hold, "pass": None|"arg"|"payload"}.
    group_id: int | None = None
    depends_on: tuple = ()
    depends: dict | None = None
    # The payload's JSON text as validated, stored as is (None: encode ``payload``).
    payload_json: str | None = None
    # The earliest start asked for (run_at as given, in UTC, or now + run_after), before
    # run_at is moved up to the enqueue; django.tasks reads it back as run_after.
    run_after: datetime | None = None
    # Debounce: enqueues sharing the key while its job is pending and never leased update
    # that job (run_at = now + debounce_for, at most debounce_max_wait after its
    # enqueue; with "replace" the newest payload) instead of inserting one.
    debounce_key: str | None = None
    debounce_for: float | None = None
    debounce_max_wait: float | None = None
    debounce_mode: str = "replace"
    # Uniqueness by state: an enqueue returns the key's newest job while it is in one of
    # these states, and inserts a new job (which takes the key) otherwise.
    unique_key: str | None = None
    unique_while: tuple | None = None
    # Ordered keys: it waits for the key's previous job to end (its Dependency, policy
    # run), or with ordering_blocks to complete (policy hold: a dead letter holds it).
    ordering_key: str | None = None
    ordering_blocks: bool = False


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def name(value, field, max_length):
    if not isinstance(value, str) or not value:
        raise InvalidJob(f"{field} must be a non-empty string", field)
    if len(value) > max_length:
        raise InvalidJob(f"{field} is {len(value)} characters; the limit is {max_length}", field)
    if not NAME_RE.match(value):
        raise InvalidJob(
            f"{field} {value!r} may hold only letters, digits and _ . : - (and not start with . : -)",
            field,
        )
    return value


def text(value, field):
    """A string every database can store: PostgreSQL refuses NUL in text and jsonb, and
    no driver can send an unpaired UTF-16 surrogate (a lone half of an escaped pair)."""
    if "\x00" in value:
        raise InvalidJob(f"{field} may not contain the NUL character (\\u0000)", field)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidJob(f"{field} holds an unpaired UTF-16 surrogate; send valid Unicode", field) from None
    return value


def _json_text(value, field):
    """Check every string (keys too) and the nesting depth of a JSON value, without recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            text(item, field)
        elif isinstance(item, (dict, list, tuple)):
            if depth > MAX_JSON_DEPTH:
                raise InvalidJob(f"{field} is nested more than {MAX_JSON_DEPTH} levels deep", field)
            if isinstance(item, dict):
                for k, v in item.items():
                    if isinstance(k, str):
                        text(k, field)
                    stack.append((v, depth + 1))
            else:
                stack.extend((v, depth + 1) for v in item)


# Values json.loads gives back as they are: a payload made only of these (and str keys)
# is stored and returned as given, with no decode of what was just encoded.
_NATIVE_SCALARS = frozenset({str, int, float, bool, type(None)})


def _native_depth(value, field):
    """Check the nesting depth; return whether the value holds only JSON-native types
    (exact dict/list/str/int/float/bool/None, str keys), so a JSON round-trip would
    give back an equal value of the same types."""
    native = True
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if kind is dict or kind is list or isinstance(item, (dict, list, tuple)):
            if depth > MAX_JSON_DEPTH:
                raise InvalidJob(f"{field} is nested more than {MAX_JSON_DEPTH} levels deep", field)
            if isinstance(item, dict):
                native = native and kind is dict
                for k, v in item.items():
                    if type(k) is not str:
                        native = False
                    if type(v) in _NATIVE_SCALARS:
                        continue
                    stack.append((v, depth + 1))
            else:
                native = native and kind is list
                stack.extend((v, depth + 1) for v in item)
        elif kind not in _NATIVE_SCALARS:
            native = False
    return native


# json.dumps with options builds an encoder per call.
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


def payload_json(value, field="payload"):
    """Validate a JSON value; return (value as a reader will see it, its JSON text).

    One json.dumps does the work: its text is what gets stored (no second encode), its
    length is the size (ASCII: non-ASCII is escaped), and only text holding an escaped
    NUL or surrogate (rare, and often a false alarm: a literal backslash, an emoji) needs
    the walk over every string.
    """
    if type(value) is dict and not value:  # the default payload
        encoded, native = "{}", True
    else:
        try:
            encoded = _ENCODER.encode(value)
        except (TypeError, ValueError) as exc:
            raise InvalidJob(f"{field} is not JSON-serializable: {exc}", field) from None
        except RecursionError:
            raise InvalidJob(f"{field} is nested too deeply", field) from None
        if "\\u0000" in encoded or "\\ud" in encoded:
            _json_text(value, field)
        native = _native_depth(value, field)
    size = len(encoded)
    if size > settings.MAX_PAYLOAD_BYTES:
        raise InvalidJob(f"{field} is {size} bytes of JSON; the limit is {settings.MAX_PAYLOAD_BYTES}", field)
    # Store what JSON gives back (tuples become lists), so the job holds what a reader sees.
    return (value if native else json.loads(encoded)), encoded


def payload(value, field="payload"):
    return payload_json(value, field)[0]


def priority(value):
    if not _is_int(value):
        raise InvalidJob(f"priority must be an integer, got {value!r}", "priority")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise InvalidJob(f"priority {value} is out of range {PRIORITY_MIN}..{PRIORITY_MAX}", "priority")
    return value


def max_attempts(value):
    if not _is_int(value):
        raise InvalidJob(f"max_attempts must be an integer, got {value!r}", "max_attempts")
    limit = settings.MAX_ATTEMPTS_LIMIT
    if not 1 <= value <= limit:
        raise InvalidJob(f"max_attempts {value} is out of range 1..{limit}", "max_attempts")
    return value


def seconds(value, field, *, maximum, allow_zero=False):
    """A duration as a timedelta or a number of seconds; return float seconds."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise InvalidJob(f"{field} must be a number of seconds or a timedelta, got {value!r}", field)
    if value < 0 or (value == 0 and not allow_zero):
        raise InvalidJob(f"{field} must be {'>= 0' if allow_zero else '> 0'}, got {value}", field)
    if value > maximum:
        raise InvalidJob(f"{field} {value}s is more than the limit of {maximum:.0f}s", field)
    return float(value)


def backoff_base(value):
    """The per-job retry base: the delay after attempt n is base ** n seconds."""
    if value is None:
        return None
    low, high = BACKOFF_BASE_RANGE
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise InvalidJob(f"backoff_base must be a number, got {value!r}", "backoff_base")
    if not low <= value <= high:
        raise InvalidJob(f"backoff_base {value} is out of range {low}..{high}", "backoff_base")
    return float(value)


def backoff_max(value):
    """The per-job cap on one retry delay, in seconds (or a timedelta)."""
    if value is None:
        return None
    return seconds(value, "backoff_max", maximum=MAX_BACKOFF_SECONDS)


def backoff_jitter(value):
    if value is None or isinstance(value, bool):
        return value
    raise InvalidJob(f"backoff_jitter must be true or false, got {value!r}", "backoff_jitter")


def run_at(value, now):
    if not isinstance(value, datetime):
        raise InvalidJob(f"run_at must be a datetime, got {value!r}", "run_at")
    if timezone.is_naive(value):
        raise InvalidJob("run_at must be timezone-aware (e.g. datetime.now(UTC))", "run_at")
    try:
        # Normalise now: an offset near datetime.min/max overflows when the database adapts it.
        value = value.astimezone(UTC)
    except (OverflowError, ValueError):
        raise InvalidJob(f"run_at {value.isoformat()} is out of range", "run_at") from None
    if value - now > MAX_SCHEDULE_AHEAD:
        raise InvalidJob(f"run_at {value.isoformat()} is more than 10 years ahead", "run_at")
    if now - value > MAX_SCHEDULE_AHEAD:
        raise InvalidJob(f"run_at {value.isoformat()} is more than 10 years ago", "run_at")
    # A job becomes ready no earlier than it is enqueued: a run_at in the past must not
    # buy aging points (effective priority counts from run_at).
    return max(value, now)


def _key(value, field, max_length):
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidJob(f"{field} must be a non-empty string", field)
    text(value, field)
    if len(value) > max_length:
        raise InvalidJob(f"{field} is {len(value)} characters; the limit is {max_length}", field)
    return value


def idempotency_key(value):
    return _key(value, "idempotency_key", IDEMPOTENCY_KEY_MAX_LENGTH)


def concurrency_key(value):
    """The key a kind's per_key limit counts by, e.g. "customer:42"; any text."""
    return _key(value, "concurrency_key", CONCURRENCY_KEY_MAX_LENGTH)


def duration(value, field, *, maximum):
    """seconds(), also taking a duration string such as "30s" or "5m" (durations.py)."""
    if isinstance(value, str):
        try:
            value = durations.parse(value)
        except ValueError as exc:
            raise InvalidJob(f"{field}: {exc}", field) from None
    return seconds(value, field, maximum=maximum)


def admission(options):
    """Validate the debounce and unique options; return their EnqueueRequest fields."""
    given = [f for f in ADMISSION_FIELDS if options.get(f) is not None]
    if not given:
        return {}
    debounce = _key(options.get("debounce_key"), "debounce_key", ADMISSION_KEY_MAX_LENGTH)
    unique = _key(options.get("unique_key"), "unique_key", ADMISSION_KEY_MAX_LENGTH)
    for field in given:
        if field.startswith("debounce_") and debounce is None:
            raise InvalidJob(f"{field} needs a debounce_key: it is that key's debounce", field)
        if field == "unique_while" and unique is None:
            raise InvalidJob("unique_while needs a unique_key: it says when that key is unique", field)
    if debounce is not None and unique is not None:
        raise InvalidJob("give debounce_key or unique_key, not both", "unique_key")
    for other in ("idempotency_key", "run_at", "run_after"):
        if options.get(other) is not None:
            field = "debounce_key" if debounce is not None else "unique_key"
            why = "debounce_for sets run_at" if other != "idempotency_key" else "each is a key of its own"
            raise InvalidJob(f"{field} does not go with {other} ({why})", field)
    if unique is not None:
        return {"unique_key": unique, "unique_while": unique_while(options.get("unique_while"))}
    limit = MAX_SCHEDULE_AHEAD.total_seconds()
    if options.get("debounce_for") is None:
        raise InvalidJob(
            "debounce_key needs debounce_for: how long to wait for a quiet spell", "debounce_for"
        )
    mode = options.get("debounce_mode") or "replace"
    if mode not in DEBOUNCE_MODES:
        raise InvalidJob(
            f"debounce_mode must be replace (the newest payload wins) or keep (the first stays), got {mode!r}",
            "debounce_mode",
        )
    wait = options.get("debounce_max_wait")
    return {
        "debounce_key": debounce,
        "debounce_for": duration(options["debounce_for"], "debounce_for", maximum=limit),
        "debounce_max_wait": None if wait is None else duration(wait, "debounce_max_wait", maximum=limit),
        "debounce_mode": mode,
    }


def ordering(options):
    """Validate ordering_key and ordering_blocks; return their EnqueueRequest fields."""
    key = _key(options.get("ordering_key"), "ordering_key", ADMISSION_KEY_MAX_LENGTH)
    blocks = options.get("ordering_blocks")
    if key is None:
        if blocks is not None:
            raise InvalidJob(
                "ordering_blocks needs an ordering_key: it says what a failure there does", "ordering_blocks"
            )
        return {}
    for other in ("debounce_key", "unique_key"):
        if options.get(other) is not None:
            raise InvalidJob(
                f"ordering_key does not go with {other} (each is a key of its own)", "ordering_key"
            )
    if blocks is not None and not isinstance(blocks, bool):
        raise InvalidJob(f"ordering_blocks must be true or false, got {blocks!r}", "ordering_blocks")
    return {"ordering_key": key, "ordering_blocks": bool(blocks)}


def unique_while(value):
    """A preset name, a state or states; return the states as a sorted tuple."""
    if value is None:
        value = "active"
    if isinstance(value, str):
        value = UNIQUE_PRESETS.get(value, (value,))
    if not isinstance(value, (list, tuple)) or not value:
        raise InvalidJob(
            f"unique_while must be a preset ({', '.join(UNIQUE_PRESETS)}) or a list of states, got {value!r}",
            "unique_while",
        )
    unknown = [s for s in value if s not in State.values]
    if unknown:
        raise InvalidJob(
            f"unique_while: {unknown[0]!r} is not a state; use {', '.join(State.values)} "
            f"or a preset ({', '.join(UNIQUE_PRESETS)})",
            "unique_while",
        )
    return tuple(sorted(set(value)))


def template(value, field, now):
    """A follow-up job as a JSON dict: kind, payload (a dict), enqueue options."""
    if value is None:
        return None
    if not isinstance(value, dict) or "kind" not in value:
        raise InvalidJob(f"{field} must be a dict with a kind (and payload, options)", field)
    spec = dict(value)
    kind = spec.pop("kind")
    body = spec.pop("payload", None)
    if body is not None and not isinstance(body, dict):
        raise InvalidJob(
            f"{field}.payload must be a dict: the parent's outcome is added under 'parent'", field
        )
    unknown = sorted(set(spec) - set(TEMPLATE_FIELDS))
    if unknown:
        raise InvalidJob(
            f"{field}: unknown field(s) {', '.join(unknown)}; allowed: kind, payload, {', '.join(TEMPLATE_FIELDS)}",
            field,
        )
    try:
        enqueue_request(kind, body, now=now, **spec)
    except InvalidJob as exc:
        raise InvalidJob(f"{field}: {exc}", field) from None
    if body is not None and encryption.declared(kind):
        value = {**value, "payload": encryption.seal(kind, body)}
    return payload(value, field)


# The kind of the queue's own webhook deliveries (webhooks.KIND), made by a terminal
# transition only: one enqueued by anyone else would go out signed with the real
# WEBHOOK_SECRET, carrying a body of their choosing. Refused on every enqueue route.
WEBHOOK_KIND = "queue_app.webhook"


# The built-in kind that runs a command on a worker (worker/shell.py). Refused at
# enqueue, on every route, where JOBQUEUE["SHELL_JOBS"] is off: a job the workers would
# refuse must not wait in the queue for the first worker that turns it on.
SHELL_KIND = "shell"
# What enqueuing, editing or requeuing one needs beyond add_job / change_job: a shell job
# runs a command of its enqueuer's choosing on a worker (API keys: ApiKey.can_run_shell).
SHELL_PERMISSION = "queue_app.enqueue_shell_job"


# What a job enqueued with depends_on does when one of them fails: cancel (the default),
# run anyway, or hold for an operator (workflows.py).
DEPENDENCY_POLICIES = ("cancel", "run", "hold")
# How it receives their results: as its first positional argument (a @task chain) or
# under "dependencies" in its payload; None: not at all.
PASS_RESULT = (None, "arg", "payload")
DEPENDENCY_FIELDS = ("depends_on", "on_dependency_failure", "pass_result")


def dependency_options(depends_on, policy=None, pass_result=None):
    """Validate depends_on (job ids) and its options; return (ids tuple, depends dict)."""
    if depends_on is None:
        return (), None
    if isinstance(depends_on, (str, bytes)) or not hasattr(depends_on, "__iter__"):
        raise InvalidJob("depends_on must be a list of job ids", "depends_on")
    ids = []
    for value in depends_on:
        value = getattr(value, "id", value)
        if type(value) is not int or value < 1:
            raise InvalidJob(f"depends_on: {value!r} is not a job id", "depends_on")
        if value not in ids:
            ids.append(value)
    policy = policy or DEPENDENCY_POLICIES[0]
    if policy not in DEPENDENCY_POLICIES:
        raise InvalidJob(
            f"on_dependency_failure must be one of {', '.join(DEPENDENCY_POLICIES)}", "on_dependency_failure"
        )
    if pass_result not in PASS_RESULT:
        raise InvalidJob("pass_result must be None, 'arg' or 'payload'", "pass_result")
    if not ids:
        return (), None
    return tuple(ids), {"policy": policy, "pass": pass_result, "held": False}


def enqueue_request(kind, payload_value=None, /, now=None, *, reserved_ok=False, **options):
    """Validate enqueue() arguments and return an EnqueueRequest."""
    now = now or timezone.now()
    return request(kind, payload_value, options, now, _shared_checks(options), reserved_ok=reserved_ok)


# Never shared: options whose validated form depends on the moment of the enqueue (run_at
# is moved up to now, run_after counts from it, a follow-up template's schedule too) or on
# the webhook settings, and the keys most callers make unique per job (sharing their
# checks would only fill the cache).
_UNSHARED = (
    "run_at",
    "run_after",
    "on_success",
    "on_failure",
    "webhook_url",
    "idempotency_key",
    "debounce_key",
    "unique_key",
    "ordering_key",
)
_SHARED_MAX = 1024
_shared = {}


def _shared_checks(options):
    """The BatchChecks that single enqueues share in this process, for options that mean
    the same at every call (most callers pass the same few, or none): a site's view calling
    enqueue() validated them in full each time, most of that call's Python. Keyed by the
    settings the options' defaults come from, so a changed setting is seen at once."""
    if options and any(options.get(name) is not None for name in _UNSHARED):
        return None
    key = (
        settings.DEFAULT_QUEUE,
        settings.DEFAULT_MAX_ATTEMPTS,
        settings.MAX_ATTEMPTS_LIMIT,
        settings.MAX_TIMEOUT_SECONDS,
    )
    checks = _shared.get(key)
    if checks is None or len(checks.options) + len(checks.kinds) > _SHARED_MAX:
        # A process that enqueues endless distinct options or kinds starts over.
        if len(_shared) > 8:
            _shared.clear()
        checks = _shared[key] = BatchChecks()
    return checks


class BatchChecks:
    """What a batch has already validated: options by value, kind names. Most batches
    give every job the same options, so those are checked once, not per job."""

    def __init__(self):
        self.options = {}
        self.kinds = set()


def _options_key(options):
    if not options:
        return ()
    # The type too: 1, 1.0 and True are equal keys but not equally valid values.
    try:
        key = tuple(sorted((k, type(v), v) for k, v in options.items()))
        hash(key)
    except TypeError:  # unhashable (a follow-up template dict) or unorderable
        return None
    return key


def request(kind, payload_value, options, now, checks=None, *, reserved_ok=False):
    """Validate one job's kind, payload and ``options`` (dict); return an EnqueueRequest.
    Refusals come in the order fields are listed in enqueue_options."""
    if options and any(name in options for name in DEPENDENCY_FIELDS):
        options = dict(options)
        ids, depends = dependency_options(*(options.pop(name, None) for name in DEPENDENCY_FIELDS))
        keyed = next(
            (k for k in ("debounce_key", "unique_key", "ordering_key") if options.get(k) is not None), None
        )
        if ids and keyed:
            # A waiting job is not one a debounce may update or a unique key return.
            raise InvalidJob(f"{keyed} does not go with depends_on", keyed)
        req = request(kind, payload_value, options, now, checks, reserved_ok=reserved_ok)
        return dataclasses.replace(req, depends_on=ids, depends=depends) if ids else req
    key = fields = None
    if checks is not None:
        key = _options_key(options)
        fields = checks.options.get(key) if key is not None else None
    checked = []

    def kind_and_payload():
        _kind(kind, checks)
        if kind == WEBHOOK_KIND and not reserved_ok:
            raise InvalidJob(
                f"kind {WEBHOOK_KIND!r} is the queue's own: a delivery is made when a job with a webhook_url ends",
                "kind",
            )
        if kind == SHELL_KIND and not settings.SHELL_JOBS:
            raise InvalidJob(
                'shell jobs are disabled: set JOBQUEUE["SHELL_JOBS"] = True where jobs are enqueued and '
                "on the workers that run them (JOBQUEUE_SHELL_JOBS=1 in the example project)",
                "kind",
            )
        value = {} if payload_value is None else payload_value
        checked.extend(payload_json(encryption.seal(kind, value) if encryption.declared(kind) else value))

    if fields is None:
        fields = enqueue_options(options, now, between=kind_and_payload)
        value, encoded = checked
        req = EnqueueRequest(kind=kind, payload=value, payload_json=encoded, **fields)
        if key is not None:
            checks.options[key] = req.__dict__
        return req
    kind_and_payload()
    # A copy of the first request with these options (the dataclass's frozen __init__
    # costs as much as the rest of a cached validation).
    req = object.__new__(EnqueueRequest)
    req.__dict__.update(fields)
    req.__dict__.update(kind=kind, payload=checked[0], payload_json=checked[1])
    return req


def _kind(kind, checks):
    if checks is None or type(kind) is not str or kind not in checks.kinds:
        name(kind, "kind", KIND_MAX_LENGTH)
        if checks is not None:
            checks.kinds.add(kind)


def enqueue_options(options, now, between=None):
    """Validate the enqueue options (all but kind and payload); return EnqueueRequest
    fields. ``between`` runs after the scheduling, timeout and webhook checks and before
    the rest, where enqueue() has always checked the kind and payload."""
    unknown = sorted(set(options) - set(ENQUEUE_FIELDS))
    if unknown:
        raise InvalidJob(
            f"unknown field(s): {', '.join(unknown)}; allowed: kind, payload, {', '.join(ENQUEUE_FIELDS)}",
            unknown[0],
        )
    when = options.get("run_at")
    after = options.get("run_after")
    if when is not None and after is not None:
        raise InvalidJob("give run_at or run_after, not both", "run_at")
    asked = None
    if when is not None:
        when = run_at(when, now)
        asked = options["run_at"].astimezone(UTC)  # run_at() has checked that it converts
    elif after is not None:
        if isinstance(after, datetime):
            raise InvalidJob(
                "run_after is a delay (seconds or a timedelta); use run_at for a datetime", "run_after"
            )
        when = asked = now + timedelta(
            seconds=seconds(after, "run_after", maximum=MAX_SCHEDULE_AHEAD.total_seconds(), allow_zero=True)
        )
    timeout = options.get("timeout")
    if timeout is not None:
        timeout = seconds(timeout, "timeout", maximum=settings.MAX_TIMEOUT_SECONDS)
    attempts = options.get("max_attempts")
    unique_for = options.get("unique_for")
    if unique_for is not None:
        unique_for = seconds(unique_for, "unique_for", maximum=MAX_SCHEDULE_AHEAD.total_seconds())
        if options.get("idempotency_key") is None:
            raise InvalidJob(
                "unique_for needs an idempotency_key: it is the key's dedupe window", "unique_for"
            )
    hook = options.get("webhook_url")
    if hook is not None:
        hook = urls.check_url(text(hook, "webhook_url") if isinstance(hook, str) else hook)
    if between is not None:
        between()
    return {
        "queue_name": name(
            options.get("queue_name") or settings.DEFAULT_QUEUE, "queue_name", QUEUE_NAME_MAX_LENGTH
        ),
        "priority": priority(options.get("priority", 0) if options.get("priority") is not None else 0),
        "run_at": when,
        "run_after": asked,
        "max_attempts": max_attempts(settings.DEFAULT_MAX_ATTEMPTS if attempts is None else attempts),
        "idempotency_key": idempotency_key(options.get("idempotency_key")),
        "concurrency_key": concurrency_key(options.get("concurrency_key")),
        "timeout": timeout,
        "unique_for": unique_for,
        "on_success": template(options.get("on_success"), "on_success", now),
        "on_failure": template(options.get("on_failure"), "on_failure", now),
        "webhook_url": hook,
        "backoff_base": backoff_base(options.get("backoff_base")),
        "backoff_max": backoff_max(options.get("backoff_max")),
        "backoff_jitter": backoff_jitter(options.get("backoff_jitter")),
        **admission(options),
        **ordering(options),
    }


def request_as(template, payload_value):
    """A copy of the validated request ``template`` holding ``payload_value``, which is
    validated here: for a caller that checked the other fields once for many jobs (the
    django.tasks backend, per Task). As in request(), the frozen __init__ is skipped."""
    value = {} if payload_value is None else payload_value
    if encryption.declared(template.kind):
        value = encryption.seal(template.kind, value)
    value, encoded = payload_json(value)
    req = object.__new__(EnqueueRequest)
    req.__dict__.update(template.__dict__)
    req.__dict__.update(payload=value, payload_json=encoded)
    return req


def batch_size(value, field="limit"):
    if not _is_int(value) or not 1 <= value <= settings.MAX_BATCH:
        raise InvalidJob(f"{field} must be an integer in 1..{settings.MAX_BATCH}, got {value!r}", field)
    return value
