"""The path a site names in ``TASKS``: ``queue_app.backends.DatabaseBackend``.

The backend lives in queue_app.tasks.backend; this module keeps the settings path short
and stable, as Django's own ``django.tasks.backends.database`` is.
"""

from queue_app.tasks.backend import DatabaseBackend, task

__all__ = ["DatabaseBackend", "task"]
