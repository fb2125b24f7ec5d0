"""Sample jobs for trying the queue by hand: `manage.py seed`.

Every seeded job has an idempotency key (``seed:<kind>:<n>``), so seeding again adds
nothing while the earlier jobs are still there (a cancelled job gives its key back).
"""

from queue_app.core import enqueueing

# kind -> payload of the n-th seeded job (n from 1); safe to run anywhere: the email
# handler sends nothing, the webhook is a dry run, flaky succeeds on its second try.
PAYLOADS = {
    "email": lambda n: {"to": f"user{n}@example.com", "subject": f"Welcome #{n}"},
    "report": lambda n: {"values": list(range(1, n + 3)), "seconds": 0.1 * n},
    "webhook": lambda n: {
        "url": f"https://example.com/hooks/{n}",
        "body": {"event": "seeded", "n": n},
        "secret": "demo",
        "dry_run": True,
    },
    "flaky": lambda n: {"succeed_on": 2, "n": n},
    "slow": lambda n: {"seconds": n},
}
PRIORITIES = {"email": 20, "report": 0, "webhook": 10, "flaky": 5, "slow": -10}


def specs(kinds=None, count=3):
    """The enqueue() arguments of the seed jobs, in a fixed order."""
    kinds = list(kinds or PAYLOADS)
    unknown = [k for k in kinds if k not in PAYLOADS]
    if unknown:
        raise ValueError(f"no sample workload {', '.join(unknown)}; choose from {', '.join(PAYLOADS)}")
    return [
        {
            "kind": kind,
            "payload": PAYLOADS[kind](n),
            "priority": PRIORITIES[kind],
            "idempotency_key": f"seed:{kind}:{n}",
        }
        for kind in kinds
        for n in range(1, count + 1)
    ]


def seed(kinds=None, count=3, *, progress=None):
    """Enqueue the seed jobs that are not there yet; return (created, existing) lists."""
    created, existing = [], []
    for spec in specs(kinds, count):
        spec = dict(spec)
        job = enqueueing.enqueue(spec.pop("kind"), spec.pop("payload"), **spec)
        (created if job.was_created else existing).append(job)
        if progress:
            progress(1)
    return created, existing
