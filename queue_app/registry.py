"""kind -> handler. A handler takes the job's payload (and, if it asks, the job)."""
import inspect

from django.utils.module_loading import import_string

from queue_app.conf import settings
from queue_app.exceptions import UnknownKind

_handlers = {}


def register(kind, func):
    """Make ``func`` run jobs of ``kind``."""
    _handlers[kind] = func
    return func


def handler(kind):
    """Decorator form of register(): ``@handler("email")``."""

    def decorate(func):
        return register(kind, func)

    return decorate


def unregister(kind):
    _handlers.pop(kind, None)


def get(kind):
    """Return the handler for ``kind`` or raise UnknownKind."""
    try:
        return _handlers[kind]
    except KeyError:
        raise UnknownKind(kind) from None


def kinds():
    return sorted(_handlers)


def wants_job(func):
    """True when the handler declares a ``job`` parameter."""
    try:
        return "job" in inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False


def load_configured_handlers():
    for kind, path in (settings.HANDLERS or {}).items():
        register(kind, import_string(path) if isinstance(path, str) else path)
