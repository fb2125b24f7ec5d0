"""The one shape of a stored error: what a failed attempt's event, ``Job.last_error`` and
a ``DeadLetter`` hold, whoever noticed the failure (the handler raised, the lease lapsed,
the process was killed)."""


def error(type_, message, traceback=""):
    """An error as stored: {"type", "message", "traceback"}."""
    return {"type": type_, "message": message, "traceback": traceback}


def error_info(exc, tb_text=""):
    """The stored error for an exception: its class path (bare for builtins), message and traceback."""
    cls = type(exc)
    path = f"{cls.__module__}.{cls.__qualname__}" if cls.__module__ != "builtins" else cls.__qualname__
    return error(path, str(exc), tb_text)
