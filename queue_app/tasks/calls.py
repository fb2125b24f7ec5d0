"""A @task call to put in a workflow (canvas.group / chain / Workflow) instead of
enqueueing it on its own: ``call(send_email, "a@example.com", subject="hi")``."""

from dataclasses import dataclass, field

from django.tasks.exceptions import InvalidTask

from queue_app.tasks.backend import DatabaseBackend


@dataclass(frozen=True)
class TaskCall:
    task: object
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    @property
    def backend(self):
        backend = self.task.get_backend()
        if not isinstance(backend, DatabaseBackend):
            raise InvalidTask(f"{self.task.module_path}: a workflow needs a queue_app DatabaseBackend task")
        return backend

    @property
    def database(self):
        return self.backend.database

    def enqueue_request(self):
        """Its validated EnqueueRequest (canvas.py calls this for each TaskCall)."""
        return self.backend.request(self.task, self.args, self.kwargs)

    def enqueued(self, job):
        """Its job is in (canvas.py): receivers of task_enqueued hear of it on commit."""
        return self.backend.enqueued(self.task, job)


def call(task, /, *args, **kwargs):
    """A call of ``task`` with these arguments, not yet enqueued."""
    return TaskCall(task, args, kwargs)
