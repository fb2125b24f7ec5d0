"""API keys for scripts: created once, shown once, stored only as a SHA-256 hash.

A key is random (256 bits), so a plain SHA-256 is enough to make a stolen table
useless; a slow password hash would only slow every request down.
"""

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from queue_app.core.validation import SHELL_PERMISSION
from queue_app.exceptions import QueueError
from queue_app.models import ApiKey
from queue_app.ops import redaction

PREFIX = "jq_"
# The ApiKey flags a key needs for the write a permission guards: enqueuing is "write";
# every other write (cancel, requeue, replay, pause, resume) is "operate".
KEY_SCOPES = {
    "queue_app.add_job": ("can_write",),
    SHELL_PERMISSION: ("can_write", "can_run_shell"),
}
SCOPES = ("read", "write", "operate", "shell", "unredacted")
# last_used_at is refreshed at most this often, so reads do not write on every call.
_TOUCH_EVERY = timedelta(minutes=1)


class ApiKeyError(QueueError, ValueError):
    """A key could not be created or revoked; nothing was written."""


@dataclass(frozen=True)
class Principal:
    """Who is calling: an API key or a staff user. ``actor`` goes into events."""

    actor: str
    key: ApiKey | None = None
    user: object = None

    def may_read(self, perm):
        """True when this caller may read what ``perm`` (a view permission) covers: any
        live key, open reads, or a user holding it, as the dashboard asks."""
        if self.user is not None:
            return self.user.has_perm(perm)
        return True

    @property
    def unredacted(self):
        """Whether this caller sees payloads, results, errors and output unredacted: a
        user holding redaction.PERMISSION, or a key with the unredacted scope."""
        if self.key is not None:
            return self.key.can_see_unredacted
        return self.user is not None and self.user.has_perm(redaction.PERMISSION)

    def can(self, perm):
        """True when this caller may perform a write guarded by ``perm``: a user holding
        it, or a key with the scope it falls under (KEY_SCOPES)."""
        if self.key is not None:
            return all(getattr(self.key, flag) for flag in KEY_SCOPES.get(perm, ("can_operate",)))
        if self.user is not None:
            return self.user.has_perm(perm)
        return False


def hash_key(raw):
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def create(name, *, scopes=("read", "write", "operate"), expires_in=None):
    """Create a key called ``name`` with ``scopes`` (of SCOPES; reads always), expiring
    ``expires_in`` seconds from now (None: never); return (ApiKey, the raw key to show once)."""
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown:
        raise ApiKeyError(f"unknown scope(s) {', '.join(unknown)}; choose from {', '.join(SCOPES)}")
    if "shell" in scopes and "write" not in scopes:
        raise ApiKeyError("a key that may enqueue shell jobs must be able to write")
    if expires_in is not None and not expires_in > 0:
        raise ApiKeyError("a key's expiry must be in the future")
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise ApiKeyError("the key name must be 1 to 100 characters")
    raw = PREFIX + secrets.token_urlsafe(32)
    try:
        # A savepoint: a duplicate name must leave the caller's transaction usable.
        with transaction.atomic():
            key = ApiKey.objects.create(
                name=name,
                prefix=raw[: len(PREFIX) + 6],
                hashed_key=hash_key(raw),
                can_write="write" in scopes,
                can_operate="operate" in scopes,
                can_run_shell="shell" in scopes,
                can_see_unredacted="unredacted" in scopes,
                expires_at=None if expires_in is None else timezone.now() + timedelta(seconds=expires_in),
            )
    except IntegrityError:
        raise ApiKeyError(f"a key named {name!r} already exists") from None
    return key, raw


def revoke(name):
    changed = ApiKey.objects.filter(name=name, revoked_at__isnull=True).update(revoked_at=timezone.now())
    if not changed:
        raise ApiKeyError(f"no active key named {name!r}")


def authenticate(raw):
    """The live ApiKey for a raw key (not revoked, not expired), or None."""
    if not raw or not raw.startswith(PREFIX) or len(raw) > 200:
        return None
    key = ApiKey.objects.filter(hashed_key=hash_key(raw), revoked_at__isnull=True).first()
    now = timezone.now()
    if key is None or (key.expires_at is not None and key.expires_at <= now):
        return None
    if key.last_used_at is None or now - key.last_used_at > _TOUCH_EVERY:
        ApiKey.objects.filter(id=key.id).update(last_used_at=now)
    return key
