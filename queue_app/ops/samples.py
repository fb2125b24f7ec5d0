"""Sample workloads for the demo, the tests and trying the queue by hand, registered
only with JOBQUEUE["SAMPLE_HANDLERS"] (registry.SAMPLES names them).

Each handler takes the job's JSON payload; ``flaky`` also looks at the job's attempt.
"""

import hashlib
import hmac
import json
import os
import time

from queue_app.core import webhooks
from queue_app.handlers import registry
from queue_app.worker import shell as shell_kind


def email(payload):
    """Pretend to send an email; refuses a payload without a recipient."""
    if "@" not in str(payload.get("to", "")):
        raise ValueError(f"invalid recipient {payload.get('to')!r}")
    return {"sent_to": payload["to"]}


def report(payload):
    """Add up numbers, slowly if asked."""
    time.sleep(float(payload.get("seconds", 0)))
    return {"total": sum(payload.get("values", []))}


def flaky(payload, job):
    """Fail until attempt ``succeed_on`` (default 2)."""
    if job.attempts < int(payload.get("succeed_on", 2)):
        raise ConnectionError(f"flaky upstream (attempt {job.attempts})")
    return {"attempt": job.attempts}


def slow(payload):
    """Sleep ``seconds`` (default 1): a long job to watch, time out or kill."""
    time.sleep(float(payload.get("seconds", 1)))
    return "done"


def webhook(payload):
    """Sign ``body`` with HMAC-SHA256 and POST it to ``url``; ``dry_run`` only signs."""
    body = json.dumps(payload.get("body", {}), sort_keys=True, separators=(",", ":")).encode()
    signature = hmac.new(str(payload.get("secret", "")).encode(), body, hashlib.sha256).hexdigest()
    if payload.get("dry_run") or not payload.get("url"):
        return {"signature": signature, "delivered": False}
    # The same guarded POST as job webhooks: only WEBHOOK_ALLOWED_HOSTS, vetted addresses,
    # no redirects or proxies, so a payload cannot make a worker call internal services.
    status = webhooks.post(
        payload["url"], body, {"Content-Type": "application/json", "X-Signature-SHA256": signature}
    )
    return {"signature": signature, "delivered": True, "status": status}


def crashy(payload, job):
    """Kill the process running it (as a segfault would) until attempt ``succeed_on``.

    Shows that the worker survives a handler that takes its process down: the
    supervisor fails the job with the exit status and the retry runs in a new process.
    """
    if job.attempts < int(payload.get("succeed_on", 2)):
        os._exit(70)
    return {"attempt": job.attempts}


# The built-in shell kind (shell.py): argv without a shell, the job's timeout, exit code
# and output kept; refuses unless JOBQUEUE["SHELL_JOBS"] is True.
shell = shell_kind.run


def register():
    """Register every sample workload (registry.SAMPLES), whatever SAMPLE_HANDLERS says."""
    registry.load_samples()
