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

PREFIX = "jq_"
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

    def can(self, perm):
        """True when this caller may perform a write guarded by ``perm``."""
        if self.key is not None:
            if perm == SHELL_PERMISSION:
                return self.key.can_write and self.key.can_run_shell
            return self.key.can_write
        if self.user is not None:
            return self.user.has_perm(perm)
        return False


def hash_key(raw):
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def create(name, *, can_write=True, can_run_shell=False):
    """Create a key called ``name``; return (ApiKey, the raw key to show once)."""
    if can_run_shell and not can_write:
        raise ApiKeyError("a key that may enqueue shell jobs must be able to write")
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
                can_write=can_write,
                can_run_shell=can_run_shell,
            )
    except IntegrityError:
        raise ApiKeyError(f"a key named {name!r} already exists") from None
    return key, raw


def revoke(name):
    changed = ApiKey.objects.filter(name=name, revoked_at__isnull=True).update(revoked_at=timezone.now())
    if not changed:
        raise ApiKeyError(f"no active key named {name!r}")


def authenticate(raw):
    """The live ApiKey for a raw key, or None."""
    if not raw or not raw.startswith(PREFIX) or len(raw) > 200:
        return None
    key = ApiKey.objects.filter(hashed_key=hash_key(raw), revoked_at__isnull=True).first()
    if key is None:
        return None
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at > _TOUCH_EVERY:
        ApiKey.objects.filter(id=key.id).update(last_used_at=now)
    return key
