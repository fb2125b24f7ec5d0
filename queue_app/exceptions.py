"""Errors the queue raises to its callers."""


class QueueError(Exception):
    """Base class for the queue's errors."""


class InvalidJob(QueueError, ValueError):
    """Input to enqueue (or an edit) was refused; nothing was written."""

    def __init__(self, message, field=None):
        super().__init__(message)
        self.field = field


class InvalidTransition(QueueError):
    """The job is not in a state this edge starts from."""

    def __init__(self, job_id, state, action):
        super().__init__(f"job {job_id} is {state}; cannot {action}")
        self.job_id = job_id
        self.state = state
        self.action = action


class JobNotFound(QueueError, LookupError):
    def __init__(self, job_id):
        super().__init__(f"job {job_id} does not exist")
        self.job_id = job_id


class UnknownKind(QueueError, LookupError):
    def __init__(self, kind):
        super().__init__(f"no handler registered for kind {kind!r}")
        self.kind = kind


class UnstorableResult(QueueError):
    """A handler returned a value the job cannot store (JSON cannot hold it, or it is too
    large); ``error`` is the original error, which the failed attempt records."""

    def __init__(self, error):
        super().__init__(str(error))
        self.error = error


class NotStarted(QueueError):
    """A claimed job's attempt could not get as far as its handler: the database went
    away while the worker prepared it (a Task job's history read). Nothing of the
    handler ran, so it is tried again once the database answers; it is not a failure
    of the job. ``error`` is the database's error."""

    def __init__(self, job_id, error):
        super().__init__(f"job {job_id} was not started: {error}")
        self.job_id = job_id
        self.error = error
