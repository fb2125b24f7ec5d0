"""Job chaining: a job's ``on_success`` / ``on_failure`` template becomes a new job when
the job reaches that outcome.

    enqueue("fetch", {"url": u},
            on_success={"kind": "parse", "payload": {"lang": "en"}, "priority": 10},
            on_failure={"kind": "alert", "payload": {"team": "ops"}})

Success is ``completed``; failure is ``dead_letter`` (the attempt budget is spent, or
the error was not retryable): a job that will still be retried has not failed yet,
and an operator's cancel is neither outcome. The follow-up is built here and inserted by the
transition itself (transitions.complete / complete_many / fail / recover), in the
same transaction, so a parent is never completed without its child or the other way
round. The child's payload is the template's plus ``parent``: {id, kind, state,
result, error}; the child's ``parent_id`` points back and its ``enqueued`` event says
``parent``; the parent's terminal event says ``chained``: both timelines show the link.

A template is validated when the parent is enqueued. If it no longer validates when
the parent finishes (a setting changed, the parent's result is too large to pass on),
the parent still finishes and its event records ``chain_error`` instead.
"""

import dataclasses
import logging

from queue_app.core import validation
from queue_app.exceptions import InvalidJob
from queue_app.models import State

log = logging.getLogger("queue_app")


def template_for(job, state):
    if state == State.COMPLETED:
        return job.on_success
    if state == State.DEAD_LETTER:
        return job.on_failure
    return None


def follow_up(job, state, now, *, result=None, error=None):
    """Return (EnqueueRequest or None, event metadata): ``job``'s follow-up for ``state``.

    The caller (the terminal transition) enqueues the request in its own transaction and
    records the child's id as ``chained``; a template that no longer validates gives no
    request and ``chain_error``."""
    template = template_for(job, state)
    if not template:
        return None, {}
    spec = dict(template)
    kind = spec.pop("kind")
    body = dict(spec.pop("payload", None) or {})
    body["parent"] = {"id": job.id, "kind": job.kind, "state": str(state), "result": result, "error": error}
    try:
        req = validation.enqueue_request(kind, body, now=now, **spec)
    except InvalidJob as exc:
        log.error("chain refused id=%s kind=%s: %s", job.id, kind, exc)
        return None, {"chain_error": str(exc)}
    return dataclasses.replace(req, parent_id=job.id), {}
