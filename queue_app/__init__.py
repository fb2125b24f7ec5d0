"""jobqueue: a durable, database-backed job queue for Django."""


def __getattr__(name):
    # Lazy so that importing queue_app (e.g. in settings) does not touch the app registry.
    if name in {"enqueue", "bulk_enqueue", "EnqueueRequest"}:
        from queue_app.core import enqueueing as api_python

        return getattr(api_python, name)
    if name in {"group", "chain", "Workflow"}:
        from queue_app.core import canvas

        return getattr(canvas, name)
    if name in {"wait", "await_job"}:
        from queue_app.worker import wakeup

        return getattr(wakeup, name)
    if name == "call":
        from queue_app.tasks.calls import call

        return call
    if name == "current_job":
        from queue_app.handlers.context import current_job

        return current_job
    if name == "Snooze":
        from queue_app.exceptions import Snooze

        return Snooze
    if name == "handler":
        from queue_app.handlers.registry import handler

        return handler
    raise AttributeError(name)
