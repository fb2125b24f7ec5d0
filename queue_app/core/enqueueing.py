"""The Python API for putting work on the queue.

from queue_app import enqueue
job = enqueue("email", {"to": "a@example.com"}, priority=20, run_after=60)
job.was_created   # False when a key matched an existing job (or a debounce updated it)
"""

from django.utils import timezone

from queue_app.core import transitions, validation
from queue_app.core.validation import EnqueueRequest  # noqa: F401  (re-exported)
from queue_app.exceptions import InvalidJob


def enqueue(kind, payload=None, /, *, using=None, **options):
    """Put one job on the queue and return it.

    Options: queue_name, priority (-100..100), run_at (aware datetime) or run_after
    (seconds or timedelta), max_attempts, idempotency_key, timeout (seconds), and the
    rest of validation.ENQUEUE_FIELDS (debounce_key/debounce_for/debounce_max_wait/
    debounce_mode, unique_key/unique_while among them: see the README).
    """
    req = validation.enqueue_request(kind, payload, **options)
    job, created = transitions.enqueue(req, using=using)
    job.was_created = created
    return job


def bulk_enqueue(jobs, *, using=None):
    """Put many jobs on the queue in one transaction; return them in order.

    ``jobs`` is an iterable of dicts with ``kind``, ``payload`` and any enqueue option.
    All are validated first: one bad entry refuses the whole batch and writes nothing.
    """
    reqs = []
    now = timezone.now()
    checks = validation.BatchChecks()
    for i, spec in enumerate(jobs):
        if not isinstance(spec, dict):
            raise InvalidJob(f"job {i}: expected a dict with kind and payload, got {type(spec).__name__}")
        spec = dict(spec)
        try:
            kind = spec.pop("kind")
        except KeyError:
            raise InvalidJob(f"job {i}: kind is required", "kind") from None
        payload = spec.pop("payload", None)
        try:
            reqs.append(validation.request(kind, payload, spec, now, checks))
        except InvalidJob as exc:
            raise InvalidJob(f"job {i}: {exc}", exc.field) from None
    return transitions.bulk_enqueue(reqs, using=using)
