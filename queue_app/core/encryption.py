"""Sensitive payloads, encrypted at rest with ``cryptography``'s Fernet.

A kind declares what of its payload is secret: some fields, or the whole of it::

    @handler("charge", encrypt=("card",))       # payload {"card": ..., "amount": 5}
    @task(encrypt=True)                         # every argument of the task
    JOBQUEUE = {"ENCRYPTED_KINDS": {"vault": True}, "ENCRYPTION_KEYS": [new, old]}

Each secret value is stored as ``{"$jq_encrypted": "<Fernet token>"}`` whose plaintext
is the value's JSON; a whole payload is one such dict (a Task's keeps empty ``args`` and
``kwargs`` beside it, so its TaskResult still reads as one). The keys are a MultiFernet:
the first encrypts, every one decrypts, so a new key goes first and the old ones stay
until ``manage.py reencrypt`` has rotated the stored payloads to it.

Sealing happens wherever a payload is validated for storing (enqueue, follow-up
templates, requeue and edit with a new payload), and takes a payload that already holds
tokens (an edit of a decrypted copy, a follow-up's parent outcome added) by opening them
first. Only the worker (for the handler) and callers holding the unredacted-payload
permission see plaintext; every other surface shows ``[encrypted]`` (ops/redaction.py).
"""

import json
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from queue_app.conf import settings
from queue_app.exceptions import InvalidJob, UndecryptablePayload

MARKER = "$jq_encrypted"
SHOWN = "[encrypted]"
WHOLE = True
# Tokens sit at most this deep: the payload, its fields, a Task's args/kwargs items.
DEPTH = 3

# kind -> True (the whole payload) or a tuple of field names; for a Task's kind also the
# parameter names, so a secret argument passed by position is found too.
_declared = {}


def declare(kind, encrypt, params=None):
    """Record what of ``kind``'s payload is encrypted (``encrypt``: True, or field names);
    ``params``: a Task's parameter names. None or () forgets it. TypeError for a bad value."""
    spec = spec_of(encrypt, f"{kind}: encrypt")
    if spec is None:
        _declared.pop(kind, None)
    else:
        _declared[kind] = (spec, tuple(params) if params is not None else None)


def declarations():
    """A copy of what is declared, for restore() (registry.override)."""
    return dict(_declared)


def restore(saved):
    _declared.clear()
    _declared.update(saved)


def spec_of(encrypt, field="encrypt"):
    """``encrypt`` checked: True, a tuple of field names, or None for nothing encrypted."""
    if encrypt is None or encrypt is False or encrypt == ():
        return None
    if encrypt is True:
        return WHOLE
    if isinstance(encrypt, str):
        encrypt = (encrypt,)
    if not isinstance(encrypt, (list, tuple)) or not all(isinstance(f, str) and f for f in encrypt):
        raise TypeError(f"{field} must be True (the whole payload) or field names, got {encrypt!r}")
    return tuple(encrypt)


def declared(kind):
    """(spec, params) for ``kind``: declared by its handler or Task, or ENCRYPTED_KINDS."""
    found = _declared.get(kind)
    if found is not None:
        return found
    configured = settings.ENCRYPTED_KINDS.get(kind) if settings.ENCRYPTED_KINDS else None
    return (spec_of(configured, f'JOBQUEUE["ENCRYPTED_KINDS"][{kind!r}]'), None) if configured else None


@lru_cache(maxsize=4)
def _keys(keys):
    """(the MultiFernet of ``keys``, the Fernet of the first, which encrypts)."""
    fernets = [Fernet(k) for k in keys]
    return MultiFernet(fernets), fernets[0]


def check_keys(keys):
    """A message saying what is wrong with ENCRYPTION_KEYS, or None."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, (list, tuple)):
        return f'JOBQUEUE["ENCRYPTION_KEYS"] must be a list of Fernet keys, got {type(keys).__name__}'
    for i, key in enumerate(keys):
        try:
            Fernet(key)
        except (ValueError, TypeError) as exc:
            return (
                f'JOBQUEUE["ENCRYPTION_KEYS"][{i}] is not a Fernet key ({exc}): make one with '
                "python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'"
            )
    return None


def fernet(*, first=False):
    """The MultiFernet of ENCRYPTION_KEYS (``first``: the first key's Fernet); InvalidJob
    when there is no key."""
    keys = settings.ENCRYPTION_KEYS
    problem = check_keys(keys) if keys else 'JOBQUEUE["ENCRYPTION_KEYS"] is empty'
    if problem:
        raise InvalidJob(f"cannot encrypt the payload: {problem}", "payload")
    both = _keys(tuple(k.decode() if isinstance(k, bytes) else k for k in keys))
    return both[1] if first else both[0]


def is_token(value):
    return type(value) is dict and MARKER in value


def _token(value):
    return {MARKER: fernet().encrypt(json.dumps(value, separators=(",", ":")).encode()).decode()}


def holds_tokens(value, depth=DEPTH):
    """Whether a JSON value holds an encrypted value (within the depth sealing uses)."""
    if isinstance(value, dict):
        return MARKER in value or (depth > 1 and any(holds_tokens(v, depth - 1) for v in value.values()))
    if isinstance(value, list) and depth > 1:
        return any(holds_tokens(v, depth - 1) for v in value)
    return False


def spec_stored(payload):
    """What a stored payload has encrypted (for a replacement of it): True, field names, or None."""
    if not isinstance(payload, dict):
        return None
    if MARKER in payload:
        return WHOLE
    fields = [k for k, v in payload.items() if is_token(v)]
    for name in ("args", "kwargs"):
        inner = payload.get(name)
        if isinstance(inner, dict):
            fields.extend(k for k, v in inner.items() if is_token(v))
    return tuple(fields) or None


def seal(kind, payload, *, like=None):
    """``payload`` with what ``kind`` declares secret encrypted; ``like``: the payload it
    replaces, whose encrypted fields stay encrypted whatever this process has declared.
    Tokens already in ``payload`` are opened first, so sealing twice changes nothing."""
    found = declared(kind)
    spec, params = found if found is not None else (None, None)
    if spec is None and like is not None:
        spec = spec_stored(like)
    if spec is None:
        return payload
    if holds_tokens(payload):
        payload = unseal(payload)
    task_shaped = isinstance(payload, dict) and isinstance(payload.get("args"), list)
    if spec is WHOLE:
        if task_shaped:
            return {"args": [], "kwargs": {}, **_token(payload)}
        return _token(payload)
    if not isinstance(payload, dict):
        return payload
    sealed = {k: _token(v) if k in spec else v for k, v in payload.items()}
    if task_shaped:
        kwargs = payload.get("kwargs")
        if isinstance(kwargs, dict):
            sealed["kwargs"] = {k: _token(v) if k in spec else v for k, v in kwargs.items()}
        if params:
            secret = {params.index(f) for f in spec if f in params}
            sealed["args"] = [_token(v) if i in secret else v for i, v in enumerate(payload["args"])]
    return sealed


def _open(token):
    try:
        return json.loads(fernet().decrypt(token.encode() if isinstance(token, str) else token))
    except (InvalidToken, TypeError, AttributeError, InvalidJob) as exc:
        raise UndecryptablePayload(exc) from None


def unseal(value, depth=DEPTH):
    """A copy of ``value`` with its encrypted values decrypted; UndecryptablePayload when
    no key in ENCRYPTION_KEYS opens one."""
    if isinstance(value, dict):
        if MARKER in value:
            plain = _open(value[MARKER])
            rest = {k: unseal(v, depth - 1) for k, v in value.items() if k != MARKER}
            return {**rest, **plain} if rest and isinstance(plain, dict) else plain
        if depth > 1:
            return {k: unseal(v, depth - 1) for k, v in value.items()}
    elif isinstance(value, list) and depth > 1:
        return [unseal(v, depth - 1) for v in value]
    return value


def revealed(value):
    """``value`` decrypted for a caller allowed to see it; a token no key opens is shown
    as ``[encrypted: no key opens it]`` rather than failing the page."""
    if not holds_tokens(value):
        return value
    try:
        return unseal(value)
    except UndecryptablePayload:
        return hidden(value, f"{SHOWN[:-1]}: no key in ENCRYPTION_KEYS opens it]")


def hidden(value, shown=SHOWN, depth=DEPTH):
    """``value`` with each encrypted value replaced by ``[encrypted]``."""
    if isinstance(value, dict):
        if MARKER in value:
            rest = {k: hidden(v, shown, depth - 1) for k, v in value.items() if k != MARKER}
            return {**rest, MARKER: shown} if rest else shown
        if depth > 1:
            return {k: hidden(v, shown, depth - 1) for k, v in value.items()}
    elif isinstance(value, list) and depth > 1:
        return [hidden(v, shown, depth - 1) for v in value]
    return value


def rotated(value, depth=DEPTH):
    """(``value`` with every token the first key does not open re-encrypted under it,
    how many were). UndecryptablePayload when no key opens one."""
    if isinstance(value, dict):
        if MARKER in value:
            out, n = _rotated_items({k: v for k, v in value.items() if k != MARKER}, depth)
            token = value[MARKER]
            try:
                fernet(first=True).decrypt(token)  # already under the first key
            except InvalidToken:
                try:
                    token, n = fernet().rotate(token.encode()).decode(), n + 1
                except InvalidToken as exc:
                    raise UndecryptablePayload(exc) from None
            return {**out, MARKER: token}, n
        if depth > 1:
            return _rotated_items(value, depth)
    elif isinstance(value, list) and depth > 1:
        out, n = _rotated_items(dict(enumerate(value)), depth)
        return list(out.values()), n
    return value, 0


def _rotated_items(items, depth):
    out, total = {}, 0
    for k, v in items.items():
        out[k], n = rotated(v, depth - 1)
        total += n
    return out, total
