"""Runtime settings: the knobs an operator tunes while the queue runs, kept in the
database so every process picks them up without a restart.

``manage.py config set lease-seconds 60``, the admin and ``PUT /api/config/{name}``
all call set(); the value overrides ``JOBQUEUE["LEASE_SECONDS"]`` in every process
within RUNTIME_SETTINGS_TTL seconds (conf.QueueSettings reads the table through load(),
once per interval), and each change appends a SettingChange row: who, when, the value
in force before and after. unset() goes back to JOBQUEUE's value. A bad value is
refused with the message the settings check (checks.runtime_options) gives for it in
JOBQUEUE, and nothing is written.
"""

import math
from numbers import Real

from django.db import connections, router, transaction
from django.utils import timezone

from queue_app.conf import RUNTIME, settings
from queue_app.core import durations, validation
from queue_app.exceptions import InvalidJob
from queue_app.models import RuntimeSetting, SettingChange

# The names operators type (the QueueCTL seed's), each the JOBQUEUE setting it sets.
# A worker is lost once silent for a lease (models.lost_before), so the stale-worker
# timeout is the lease length: one setting under both names.
NAMES = {
    "max-attempts": "DEFAULT_MAX_ATTEMPTS",
    "backoff-base": "BACKOFF_BASE",
    "backoff-cap": "BACKOFF_MAX_SECONDS",
    "aging-interval": "AGING_INTERVAL",
    "lease-seconds": "LEASE_SECONDS",
    "stale-worker-timeout": "LEASE_SECONDS",
    "recovery-interval": "RECOVERY_INTERVAL",
}
KEYS = {setting: key for key, setting in reversed(NAMES.items())}  # the first name of each

# Seconds settings: (least, most, whether the least itself is allowed).
_SECONDS = {
    "BACKOFF_MAX_SECONDS": (0, 7 * 24 * 3600, False),
    "AGING_INTERVAL": (0, 7 * 24 * 3600, True),  # 0 disables aging
    "LEASE_SECONDS": (0, 24 * 3600, False),
    "RECOVERY_INTERVAL": (0, 24 * 3600, True),  # 0: only the sweep at start-up
}


def setting_name(name):
    """The JOBQUEUE name for ``name`` (``lease-seconds``, ``LEASE_SECONDS`` ...); InvalidJob
    naming the allowed ones otherwise."""
    text = str(name).strip()
    if text in NAMES:
        return NAMES[text]
    upper = text.upper().replace("-", "_")
    if upper in RUNTIME:
        return upper
    raise InvalidJob(
        f"{name!r} is not a runtime setting; use one of {', '.join(NAMES)} (or their JOBQUEUE names)", "name"
    )


def problem(setting, value):
    """What is wrong with ``value`` for ``JOBQUEUE[setting]``, or None: the one message
    the settings check and every set() refusal give."""
    where = f'JOBQUEUE["{setting}"]'
    if setting == "DEFAULT_MAX_ATTEMPTS":
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not 1 <= value <= settings.MAX_ATTEMPTS_LIMIT
        ):
            return f"{where} must be a whole number in 1..{settings.MAX_ATTEMPTS_LIMIT}, got {value!r}"
        return None
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        return f"{where} must be a number of seconds, got {value!r}"
    if setting == "BACKOFF_BASE":
        low, high = validation.BACKOFF_BASE_RANGE
        if not low <= value <= high:
            return f"{where} must be in {low}..{high} (retry after base ** attempt seconds), got {value!r}"
        return None
    least, most, zero = _SECONDS[setting]
    if value < least or (value == least and not zero) or value > most:
        bound = f"{'at least' if zero else 'more than'} {least:g} and at most {most:g}"
        return f"{where} must be {bound} seconds, got {value!r}"
    return None


def parse(setting, text):
    """A value typed on the command line (``3``, ``2.5``, ``30s``, ``5m``) for ``setting``."""
    if not isinstance(text, str):
        return text
    if setting == "DEFAULT_MAX_ATTEMPTS":
        try:
            return int(text.strip())
        except ValueError:
            raise InvalidJob(f'JOBQUEUE["{setting}"] must be a whole number, got {text!r}', "value") from None
    try:
        return durations.parse(text)
    except ValueError as exc:
        raise InvalidJob(f'JOBQUEUE["{setting}"]: {exc}', "value") from None


def check(setting, value):
    """``value`` as stored (a float for seconds), or InvalidJob with problem()'s message."""
    message = problem(setting, value)
    if message:
        raise InvalidJob(message, "value")
    return value if setting == "DEFAULT_MAX_ATTEMPTS" else float(value)


def load():
    """{name: value} of the stored runtime settings (conf reads them through this)."""
    db = router.db_for_read(RuntimeSetting)
    query = RuntimeSetting.objects.using(db).filter(name__in=RUNTIME).values_list("name", "value")
    if connections[db].in_atomic_block:
        # A failed read (no table yet) must not break the caller's transaction.
        with transaction.atomic(using=db):
            return dict(query)
    return dict(query)


def _changed(db, setting, old, new, actor, now):
    SettingChange.objects.using(db).create(name=setting, old=old, new=new, actor=actor or "", at=now)
    settings.reload()  # this process sees it at once; the others within the TTL


def set_value(name, value, *, actor="", using=None):
    """Store ``value`` for the runtime setting ``name``; return entry() of it."""
    setting = setting_name(name)
    value = check(setting, parse(setting, value))
    db = using or router.db_for_write(RuntimeSetting)
    now = timezone.now()
    with transaction.atomic(using=db):
        row = RuntimeSetting.objects.using(db).select_for_update().filter(name=setting).first()
        old = row.value if row is not None else settings.configured(setting)
        RuntimeSetting.objects.using(db).update_or_create(
            name=setting, defaults={"value": value, "updated_at": now, "updated_by": actor or ""}
        )
        _changed(db, setting, old, value, actor, now)
    return entry(setting)


def unset(name, *, actor="", using=None):
    """Go back to JOBQUEUE's value for ``name``; return entry() of it, or None when no
    value was stored (nothing is written then)."""
    setting = setting_name(name)
    db = using or router.db_for_write(RuntimeSetting)
    with transaction.atomic(using=db):
        row = RuntimeSetting.objects.using(db).select_for_update().filter(name=setting).first()
        if row is None:
            return None
        row.delete()
        _changed(db, setting, row.value, settings.configured(setting), actor, timezone.now())
    return entry(setting)


def entry(setting, rows=None):
    """One runtime setting as every surface shows it."""
    if rows is None:
        rows = {r.name: r for r in RuntimeSetting.objects.filter(name=setting)}
    row = rows.get(setting)
    return {
        "name": KEYS[setting],
        "setting": setting,
        "value": row.value if row is not None else settings.configured(setting),
        "configured": settings.configured(setting),
        "source": "store" if row is not None else "settings",
        "updated_at": row.updated_at if row is not None else None,
        "updated_by": row.updated_by if row is not None else "",
    }


def entries():
    """Every runtime setting (entry()), in conf.RUNTIME's order."""
    rows = {r.name: r for r in RuntimeSetting.objects.filter(name__in=RUNTIME)}
    return [entry(setting, rows) for setting in RUNTIME]


def changes(name=None, *, limit=50):
    """The latest SettingChange rows, newest first (of ``name`` only, if given)."""
    qs = SettingChange.objects.all()
    if name is not None:
        qs = qs.filter(name=setting_name(name))
    return list(qs[:limit])
