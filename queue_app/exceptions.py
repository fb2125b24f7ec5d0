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


class Snooze(Exception):
    """Raised by a handler or task: "not now, run me again in ``seconds``". The job goes
    back to pending with its run_at that much later and its attempt not spent (a
    `snoozed` event), at most MAX_SNOOZES times; past that the attempt fails."""

    def __init__(self, seconds):
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < 10**9:
            raise ValueError(f"Snooze takes a number of seconds from 0, got {seconds!r}")
        self.seconds = float(seconds)
        super().__init__(f"snoozed for {self.seconds:g}s")


class TooManySnoozes(QueueError):
    """A job snoozed more than MAX_SNOOZES times: its last snooze fails the attempt."""

    def __init__(self, limit):
        super().__init__(f"snoozed {limit} times already (MAX_SNOOZES): this snooze fails the attempt")


class NotStarted(QueueError):
    """A claimed job's attempt could not get as far as its handler: the database went
    away while the worker prepared it (a Task job's history read). Nothing of the
    handler ran, so it is tried again once the database answers; it is not a failure
    of the job. ``error`` is the database's error."""

    def __init__(self, job_id, error):
        super().__init__(f"job {job_id} was not started: {error}")
        self.job_id = job_id
        self.error = error


class ClaimNotRead(QueueError):
    """complete_and_claim committed, acknowledging ``completed`` and leasing jobs, but
    reading the leased rows failed (a raising Job post_init receiver, a converter): the
    acknowledgements stand, and the jobs it leased are unknown to the worker, which gives
    them back as after any failed claim. The cause is the read's error."""

    def __init__(self, completed):
        super().__init__(
            f"the claim committed with {len(completed)} acknowledgements, but its jobs were not read"
        )
        self.completed = completed


class WaitTimeout(QueueError, TimeoutError):
    """wait() gave up: the job had not ended within the timeout."""

    def __init__(self, job_id, timeout, state):
        super().__init__(f"job {job_id} did not end within {timeout:g}s (it is {state})")
        self.job_id = job_id
        self.timeout = timeout
        self.state = state


class UndecryptablePayload(QueueError):
    """A stored payload holds a value that no key in ENCRYPTION_KEYS decrypts (the key
    was removed, or the token was changed): running the job again cannot help."""

    def __init__(self, error=None):
        super().__init__(
            'the payload cannot be decrypted: no key in JOBQUEUE["ENCRYPTION_KEYS"] opens it '
            "(put the key it was encrypted with back in the list, then requeue the job)"
        )
        self.error = error
