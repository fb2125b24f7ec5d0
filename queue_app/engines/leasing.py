"""The claim query: what every vendor's claim (Engine.claim in sqlite.py, postgresql.py,
mysql.py) shares, and why it is written as it is. Called only from transitions.claim().

Why it is written this way. Ready jobs lease by effective priority, then run_at,
created_at, id (see ordering.py). Without aging one index scan would do, but aging
makes the sort key depend on ``now``, which no index can hold. What an index *can*
give cheaply is, for each priority level, its ready jobs oldest first: inside one
level the oldest job has the highest effective priority. So the claim:

1. finds the priority levels that have pending jobs with a loose index scan
   (one index seek per level, not a scan of the backlog);
2. takes, per level (and per queue when the worker serves named queues), the
   ``scan`` oldest ready jobs: one index range seek each, bounded by ``scan``;
3. orders that small candidate set by the full key and leases the first ``limit``.

Step 2 reads at most levels x queues x scan rows however long the backlog is. The
top ``limit`` jobs overall are always among those candidates, so the order is exact.
``scan`` is larger than ``limit`` so that concurrent claimers who skip each other's
locked rows still find work.

Each vendor module's claim says how it is written there, beside its SQL.

Each vendor returns the leased rows whole (rows.JOB_COLUMNS, values as after the
claim), so the caller needs no second SELECT, and writes a claimed event per leased
job in the same transaction (on PostgreSQL by the same statement: one round trip).

Exclusions (paused queues and kinds, kinds claimed separately under a limit, and the
concurrency keys of a per-key limited kind that are at their limit; see flow.py) are
extra conditions on the per-level seeks. The seek stays on the index, but it steps
over excluded rows one by one: a level whose oldest ready jobs are mostly paused costs
as many rows as are paused ahead of the first claimable one. A key exclusion is written
``(concurrency_key IS NULL OR NOT ...)``: ``NOT IN`` alone is NULL, not true, for a job
without a key, and would leave every unkeyed job behind.
"""

from queue_app.engines.rows import JOB_ATTNAMES

TABLE = "queue_app_job"

# The columns claim()'s exclusions apply to, in the order of excluded()'s tuple.
EXCLUDED = ("queue_name", "kind", "concurrency_key")


def scan(limit):
    """How many candidates a seek takes per level: more than ``limit``, so that concurrent
    claimers who skip each other's locked rows still find work."""
    return max(2 * limit, limit + 16)


def excluded(exclude_queues, exclude_kinds, exclude_keys):
    """The exclusions as sorted lists, in EXCLUDED's order."""
    return (sorted(exclude_queues or ()), sorted(exclude_kinds or ()), sorted(exclude_keys or ()))


def excluding(ref, condition):
    """``condition`` (NOT IN / NOT = ANY on the column ``ref``) as a seek filter. A job
    without a concurrency key is never excluded by key: ``NOT IN`` is NULL, not true,
    for a NULL key, so the key's filter lets NULL through explicitly."""
    if ref.endswith("concurrency_key"):
        return f"({ref} IS NULL OR {condition})"
    return condition


def marks(values):
    return ", ".join(["%s"] * len(values))


# Shared by the vendors: what a claim writes to each leased row.
SET = (
    "state = 'leased', lease_owner = %s, lease_expires_at = %s, "
    "attempts = attempts + 1, started_at = COALESCE(started_at, %s)"
)

# Positions in a claimed row (rows.JOB_COLUMNS) the vendors read or fill in.
ID, STATE, OWNER, EXPIRES, ATTEMPTS, STARTED, PRIORITY, RUN_AT, CREATED = (
    JOB_ATTNAMES.index(a)
    for a in (
        "id",
        "state",
        "lease_owner",
        "lease_expires_at",
        "attempts",
        "started_at",
        "priority",
        "run_at",
        "created_at",
    )
)
