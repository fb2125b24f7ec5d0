"""Sample workloads the example project registers: enough to try the queue by hand.

Each handler takes the job's JSON payload; ``flaky`` also looks at the job's attempt.
"""
import time

from queue_app import registry


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
    time.sleep(float(payload.get("seconds", 1)))
    return "done"


SAMPLES = {"email": email, "report": report, "flaky": flaky, "slow": slow}


def register():
    for kind, func in SAMPLES.items():
        registry.register(kind, func)
