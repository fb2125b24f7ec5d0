"""The engine contract: the database operations the state machine needs, one class per
vendor (sqlite.py, postgresql.py, mysql.py; engines.of() picks one).

transitions.py decides what every row says (the job's columns, each event's type, states,
attempt and metadata) and calls these methods; they decide how to say it in one vendor's
SQL. Every method that writes a job also writes its events and is atomic with them: on
its own, or inside the caller's transaction when there is one. A method that writes for
a worker (complete_plain) is fenced by owner and attempt (Fence, below). Each claim and
count is bounded by an index, not by the size of the backlog (leasing.py says how).

Event rows travel as lists in rows.EVENT_COLUMNS order (rows.event_params); where the
engine learns a value only from the statement (a new job's id, the attempt a claim
started), the caller leaves it None and the engine fills it in.
"""

from collections import Counter
from dataclasses import dataclass
from functools import cached_property, reduce
from operator import or_

from django.db import transaction
from django.db.models import Q

from queue_app.conf import settings
from queue_app.engines import rows
from queue_app.engines.leasing import ATTEMPTS, ID
from queue_app.models import EventType, KindLimit, Pause, State

# Positions in an event row (rows.EVENT_GIVEN) an engine fills from the statement.
EVENT_JOB, EVENT_ATTEMPT, EVENT_METADATA = 0, 3, 8


class Fence:
    """The fencing token of every worker-owned write (complete, complete_many, fail,
    release, abort, renew): the job is still ``leased``, to ``owner``, at the attempt the
    worker started. A worker whose lease lapsed and was recovered, cancelled or
    re-claimed (even by itself, under a new attempt) matches nothing and changes nothing;
    its caller learns from the count that the lease was lost.

    ``pairs`` is [(job_id, attempt)]. An attempt of None matches any attempt: the
    heartbeat (renew) is handed job ids only, and extending a lease this owner holds
    under a newer attempt harms nothing. The rule is written once, below, and rendered
    for the ORM (q) and for an engine's SQL (sql, joined)."""

    @staticmethod
    def leased_to(prefix="", state=None):
        """SQL: the row is leased to the owner (its one parameter); ``prefix`` qualifies the
        columns; ``state``, SQL for the state column in place of the column itself."""
        return f"{state or prefix + 'state'} = 'leased' AND {prefix}lease_owner = %s"

    def __init__(self, owner, pairs):
        self.owner = owner
        self.by_attempt = {}
        for job_id, attempt in pairs:
            self.by_attempt.setdefault(attempt, []).append(job_id)

    def q(self):
        """The fence as a Q, for a queryset over Job."""
        if not self.by_attempt:
            return Q(pk__in=[])
        which = reduce(
            or_,
            (
                (Q(id=ids[0]) if len(ids) == 1 else Q(id__in=ids))
                & (Q() if attempt is None else Q(attempts=attempt))
                for attempt, ids in self.by_attempt.items()
            ),
        )
        return Q(state=State.LEASED, lease_owner=self.owner) & which

    def sql(self, also=""):
        """(SQL, params): the fence over the job table's bare columns, one id list per
        attempt; ``also`` (SQL without parameters) is a further condition, written before
        the id lists as the tuned statements have always had it."""
        parts, params = [], [self.owner]
        for attempt, ids in self.by_attempt.items():
            marks = ", ".join(["%s"] * len(ids))
            if attempt is None:
                parts.append(f"(id IN ({marks}))")
                params += ids
            else:
                parts.append(f"(attempts = %s AND id IN ({marks}))")
                params += [attempt, *ids]
        also = f"{also} AND " if also else ""
        return f"{self.leased_to()} AND {also}({' OR '.join(parts)})", params

    @classmethod
    def joined(cls, table, pairs_alias):
        """SQL: the fence over ``table`` joined to a relation ``pairs_alias``(id, attempt)
        of the pairs (a VALUES list); its one parameter is the owner. It keeps the planner
        off the indexes on state (``state || ''`` matches no index), so that it
        seeks each pair's id: planning by the state index, SQLite (always) and PostgreSQL
        (with statistics from before a burst of leases) read every leased row of every worker."""
        t, v = table, pairs_alias
        leased = cls.leased_to(f"{t}.", state=f"({t}.state || '')")
        return f"{t}.id = {v}.id AND {t}.attempts = {v}.attempt AND {leased}"


@dataclass(frozen=True)
class WakeUp:
    """How an idle worker learns that work may have arrived (worker/wakeup.py waits)."""

    # LISTEN on this channel (enqueue NOTIFYs it on commit).
    channel: str | None = None
    # Or look at wake_version() this often, in seconds.
    interval: float | None = None


class Engine:
    """One database's SQL for the state machine. Built once per connection (engines.of)."""

    vendor = None
    # Whether a claim passes over ready rows another transaction holds locked (FOR UPDATE
    # SKIP LOCKED): an empty claim then does not prove the queue empty.
    skips_locked_rows = True

    def __init__(self, connection):
        self.connection = connection

    def atomic(self):
        """One transaction for a write and its events (none of its own inside the caller's)."""
        return transaction.atomic(using=self.connection.alias, savepoint=False)

    def lone_insert(self, givens):
        """Whether an enqueue of ``givens`` may skip Django's transaction and cursor layers
        (an engine's _insert_one): one job, outside any transaction, while nobody logs or
        wraps the queries (they must then see every statement)."""
        connection = self.connection
        return (
            len(givens) == 1
            and not connection.in_atomic_block
            and connection.get_autocommit()
            and not connection.queries_logged
            and not connection.execute_wrappers
        )

    @cached_property
    def lone_inserts(self):
        """(SQL, SQL): one job row's INSERT and one event row's, with the driver's own
        placeholders, for an engine's _insert_one (run on the driver, only while no query
        is logged: rows.placeholders)."""
        connection = self.connection
        writer = rows.JobWriter.on(connection)
        return (
            f"INSERT INTO {rows.JOB_TABLE} ({writer.columns})"
            f" VALUES {rows.placeholders(writer.width, 1, connection)}",
            f"INSERT INTO {rows.EVENT_TABLE} ({rows.EVENT_COLUMNS})"
            f" VALUES {rows.placeholders(rows.EVENT_WIDTH, 1, connection)}",
        )

    def hot_cursor(self):
        """A cursor for the statements a worker runs all the time (the claim, its events,
        the batched acknowledgement); an engine may make them cheaper to run again."""
        return self.connection.cursor()

    def doctor(self):
        """What this database's own settings would have fixed: [(problem, fix)] (manage.py doctor)."""
        return []

    def deadlocked(self, exc):
        """Whether ``exc`` (a Django DatabaseError) is the database ending this transaction
        to break a deadlock: nothing of it was written, and running it again may succeed."""
        return False

    def plan(self, sql, params):
        """The planner's plan for ``sql`` as text that names each index it uses (EXPLAIN:
        nothing runs)."""
        raise NotImplementedError

    def estimated_rows(self, table):
        """About how many rows ``table`` holds, without counting them (its highest id here)."""
        with self.connection.cursor() as cursor:
            cursor.execute(f"SELECT MAX(id) FROM {table}")
            return cursor.fetchone()[0] or 0

    # --- enqueue ---------------------------------------------------------------------

    def insert_chunk(self):
        """How many new jobs one INSERT carries."""
        return settings.BULK_BATCH_SIZE

    def insert_jobs(self, givens, payload_texts, events, now, *, savepoint=True):
        """Insert new jobs and one enqueued event each, atomic together (as one statement,
        or in ``transaction.atomic(savepoint=savepoint)``); return the Job instances in order.

        ``givens`` are the new rows, {attname: value} of one shape (rows.JobWriter fills
        the other columns' defaults); ``payload_texts`` each one's payload as JSON text;
        ``events`` each one's event row without its job_id (rows.event_params(...)[1:];
        jobs may share one list: its values are adapted once). On PostgreSQL a single
        ready job also NOTIFYs its queue in the same statement."""
        connection = self.connection
        writer = rows.JobWriter.on(connection)
        cache = {}
        out = []
        size = self.insert_chunk()
        with self._insert_atomic(len(givens), savepoint):
            for start in range(0, len(givens), size):
                chunk = givens[start : start + size]
                values, ids = self._insert_chunk(
                    writer,
                    chunk,
                    payload_texts[start : start + size],
                    events[start : start + size],
                    now,
                    cache,
                )
                if len(ids) != len(chunk):
                    raise RuntimeError("the database did not return ids for a bulk insert")
                out += writer.jobs(ids, values)
        return out

    def _insert_atomic(self, count, savepoint):
        """The transaction around an insert of ``count`` jobs with their events."""
        return transaction.atomic(using=self.connection.alias, savepoint=savepoint)

    def _insert_chunk(self, writer, chunk, texts, events, now, cache):
        """Insert one chunk (INSERT ... RETURNING id, then its events); return (values, ids)."""
        values, adapted = writer.rows(chunk, {"payload": texts}, cache)
        sql, params = rows.values_clause(self.connection, adapted)
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {rows.JOB_TABLE} ({writer.columns}) VALUES {sql} RETURNING id", params
            )
            ids = [row[0] for row in cursor.fetchall()]
        if len(ids) == len(chunk):
            rows.insert_events(
                self.connection, [[job_id, *tail] for job_id, tail in zip(ids, events)], copy=len(ids) > 1
            )
        return values, ids

    def notify(self, queues):
        """Wake idle workers of ``queues`` when the caller's transaction commits (PostgreSQL)."""

    def notify_ended(self, job_ids):
        """Wake wait() callers of ``job_ids`` (ended in the caller's transaction) when it
        commits (PostgreSQL; elsewhere they watch wake_version)."""

    # --- worker-owned writes -------------------------------------------------------------

    def claim(
        self,
        *,
        owner,
        limit,
        now,
        expires,
        event,
        queues=None,
        kinds=None,
        aging_us=0,
        exclude_queues=None,
        exclude_kinds=None,
        exclude_keys=None,
        unless_gated=False,
    ):
        """Lease up to ``limit`` ready jobs to ``owner`` in lease order (leasing.py) and
        write ``event`` (its job id and attempt left None) for each, atomic together;
        return the leased rows (rows.JOB_COLUMNS, values as after the claim).

        ``exclude_keys`` leaves out jobs with those concurrency keys (jobs without a key
        are never left out by it). ``unless_gated``: lease nothing and return None if
        any pause or limit exists (GATED, read in the claim's own statement or
        transaction, so exactly as if claim_gates() had been read just before): the
        common case, nothing paused and nothing limited, then costs no statement of
        its own."""
        raise NotImplementedError

    def claim_fair(
        self,
        *,
        owner,
        kind,
        tenants,
        limit,
        now,
        weights=None,
        expires,
        event,
        queues=None,
        aging_us=0,
        exclude_queues=None,
    ):
        """Lease up to ``limit`` ready jobs of ``kind`` round-robin over ``tenants`` (a list
        of concurrency keys, None for the jobs without one, in the order they are served)
        and write ``event`` for each, as claim() does (the same SET, events and locks).

        Round r takes the r-th ``weights[i]`` jobs (default 1) of each tenant ``i`` in
        turn, each tenant's jobs in lease order (leasing.py, per tenant): the order is
        (r, the tenant's place in ``tenants``, the job's place in the tenant), and the
        first ``limit`` of it are leased. Each tenant's candidates
        are per-level seeks on jq_ready_tenant, so the cost grows with ``tenants`` and
        ``limit``, not with the tenants' backlogs."""
        raise NotImplementedError

    # Per tenant and level, how many candidates a fair claim seeks: enough for its share
    # of the batch, and a few over for rows another claimer holds (fair claims of one
    # kind take turns on its limit row, so those are rare: another path's leftovers).
    @staticmethod
    def fair_scan(limit, weights):
        return min(limit, -(-limit // max(1, len(weights))) * max(weights, default=1) + 2)

    # After FROM in the tenant walk: a vendor's index hint.
    FAIR_HINT = ""

    def fair_keys(self, kind, n, after=None, upto=None):
        """Up to ``n`` distinct concurrency keys of ``kind``'s pending jobs in ascending
        order: above ``after`` (None: from the first key), at most ``upto`` (None: no bound).

        A loose index scan of jq_ready_tenant: one seek per key found, however many jobs
        each key has waiting."""
        if n <= 0:
            return []
        seek = (
            f"SELECT concurrency_key FROM {rows.JOB_TABLE}{self.FAIR_HINT}"
            " WHERE state = 'pending' AND kind = %s AND concurrency_key > {prev}{upto}"
            " ORDER BY concurrency_key LIMIT 1"
        )
        bound, bound_params = ("", []) if upto is None else (" AND concurrency_key <= %s", [upto])
        first_prev, first_params = ("%s", [after]) if after is not None else ("''", [])
        sql = f"""
        WITH RECURSIVE walk(k, n) AS (
            SELECT ({seek.format(prev=first_prev, upto=bound)}), 1
            UNION ALL
            SELECT ({seek.format(prev="walk.k", upto=bound)}), walk.n + 1
            FROM walk WHERE walk.k IS NOT NULL AND walk.n < %s
        )
        SELECT k FROM walk WHERE k IS NOT NULL
        """
        params = [kind, *first_params, *bound_params, kind, *bound_params, n]
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return [row[0] for row in cursor.fetchall()]

    def fair_keyless(self, kind):
        """Whether ``kind`` has pending jobs without a concurrency key (one index seek)."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT 1 FROM {rows.JOB_TABLE}{self.FAIR_HINT}"
                " WHERE state = 'pending' AND kind = %s AND concurrency_key IS NULL LIMIT 1",
                [kind],
            )
            return cursor.fetchone() is not None

    def complete_plain(self, done, owner, at_db, event):
        """Complete those of ``done`` [(job_id, attempt, result, metadata)] that ``owner``
        still holds (the Fence) and that have no follow-up to enqueue (no on_success, no
        webhook_url, no workflow), with one ``event`` each (job id and attempt left None, metadata
        from ``done`` or the event's own); atomic together. Return the ids completed."""
        raise NotImplementedError

    # --- flow control ------------------------------------------------------------------------

    def claim_gates(self):
        """Return [(scope, name)]: the pauses, and ('limit', kind) for each limited kind."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT scope, name FROM {Pause._meta.db_table}"
                f" UNION ALL SELECT 'limit', kind FROM {KindLimit._meta.db_table} WHERE {LIMITED}"
            )
            return cursor.fetchall()

    def oldest_ready(self, queues, levels, now, paused_kinds):
        """{queue: the run_at of its oldest ready job} for ``queues`` (none paused), jobs
        of ``paused_kinds`` left out: one statement, a seek per queue and priority level
        on jq_ready_queue (queue_name, priority, run_at), each stepping over paused kinds."""
        if not queues or not levels:
            return {}
        skip = f" AND kind NOT IN ({', '.join(['%s'] * len(paused_kinds))})" if paused_kinds else ""
        seek = (
            f"SELECT %s AS q, (SELECT run_at FROM {rows.JOB_TABLE} WHERE state = 'pending'"
            f" AND queue_name = %s AND priority = %s AND run_at <= %s{skip} ORDER BY run_at LIMIT 1) AS r"
        )
        at = self.connection.ops.adapt_datetimefield_value(now)
        parts, params = [], []
        for queue in queues:
            for level in levels:
                parts.append(seek)
                params += [queue, queue, level, at, *paused_kinds]
        with self.connection.cursor() as cursor:
            cursor.execute(f"SELECT q, MIN(r) FROM ({' UNION ALL '.join(parts)}) seeks GROUP BY q", params)
            found = cursor.fetchall()
        # As the ORM reads a DateTimeField: SQLite returns text, MariaDB naive datetimes.
        convert = getattr(self.connection.ops, "convert_datetimefield_value", None)
        return {
            queue: convert(run_at, None, self.connection) if convert else run_at
            for queue, run_at in found
            if run_at is not None
        }

    # After FROM in the per-key count: a vendor's index hint.
    PER_KEY_HINT = ""

    def leased_per_key(self, kind):
        """Return {concurrency_key: leased jobs} for ``kind``'s leased jobs that have a key."""
        # Keys are exact strings on every vendor (MariaDB's column collates as bytes: 0010).
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT concurrency_key, COUNT(*) FROM {rows.JOB_TABLE}{self.PER_KEY_HINT}"
                " WHERE state = %s AND kind = %s AND concurrency_key IS NOT NULL GROUP BY concurrency_key",
                [State.LEASED.value, kind],
            )
            return Counter(dict(cursor.fetchall()))

    # --- waiting for work ----------------------------------------------------------------

    def wake_up(self):
        """Return how an idle worker here learns of new work (a WakeUp), or None: poll."""
        return None

    def listen(self, channel):
        """Return a connection LISTENing on ``channel`` (its notifies() yields each NOTIFY)."""
        raise NotImplementedError(f"{self.vendor} has no LISTEN")

    def wake_version(self):
        """Return a value that moves when another connection may have added work."""
        raise NotImplementedError(f"{self.vendor} has no wake-up version")

    def commit_watch(self):
        """Return a watch whose wait(timeout) returns early when another connection may
        have committed (its close() ends it), or None: look every WakeUp.interval."""
        return None

    # The edges that make a job claimable at once: the news an idle worker waits for.
    # Not a retry (its run_at is later: the poll finds it) and not the workers' own
    # claims and acknowledgements.
    READY_EVENTS = (
        EventType.ENQUEUED,
        EventType.REQUEUED,
        EventType.RESCHEDULED,
        EventType.RECOVERED,
        EventType.RELEASED,
    )

    def ready_events_since(self, after):
        """Return (the newest event id, whether an event newer than ``after`` made a job
        claimable); ``after`` None: only the newest id. A primary-key range over the
        events written since the last look, so it costs what was written, not the table."""
        with self.connection.cursor() as cursor:
            if after is None:
                cursor.execute(f"SELECT MAX(id) FROM {rows.EVENT_TABLE}")
                return cursor.fetchone()[0] or 0, False
            types = [str(t) for t in self.READY_EVENTS]
            cursor.execute(
                f"SELECT MAX(id), MAX(CASE WHEN type IN ({', '.join(['%s'] * len(types))}) THEN id END)"
                f" FROM {rows.EVENT_TABLE} WHERE id > %s",
                [*types, after],
            )
            newest, ready = cursor.fetchone()
            return newest or after, ready is not None

    # --- shared by the vendors without one-statement writes ----------------------------

    def _claimed_events(self, found, event):
        """``event`` per claimed row of ``found``, with its job id and the attempt it started."""
        return [
            [row[ID], *event[EVENT_JOB + 1 : EVENT_ATTEMPT], row[ATTEMPTS], *event[EVENT_ATTEMPT + 1 :]]
            for row in found
        ]

    def _completed_events(self, done, held, event):
        """``event`` per job of ``done`` whose (id, attempt) is in ``held``, with its id,
        attempt and metadata. By the pair: an acknowledgement may carry an older attempt
        of a job this worker claimed again, which the fence refused."""
        connection = self.connection
        return [
            [
                job_id,
                *event[EVENT_JOB + 1 : EVENT_ATTEMPT],
                attempt,
                *event[EVENT_ATTEMPT + 1 : EVENT_METADATA],
                event[EVENT_METADATA] if meta is None else rows.json_value(connection, meta),
                *event[EVENT_METADATA + 1 :],
            ]
            for job_id, attempt, _, meta in done
            if (job_id, attempt) in held
        ]


# A KindLimit row that limits its kind (a row with every limit cleared and fair off does not).
LIMITED = "concurrency IS NOT NULL OR rate_limit IS NOT NULL OR per_key IS NOT NULL OR fair = TRUE"
# SQL, true when a claim must go the long way (claim_gates(), flow.py): something is
# paused or limited. Two reads of tables of a few rows (usually none).
GATED = (
    f"(EXISTS (SELECT 1 FROM {Pause._meta.db_table})"
    f" OR EXISTS (SELECT 1 FROM {KindLimit._meta.db_table} WHERE {LIMITED}))"
)

# What a completion writes to each row (the result is a parameter).
COMPLETED_SET = (
    "state = 'completed', finished_at = %s, result = %s, lease_owner = NULL, lease_expires_at = NULL"
)
# What wait() listens on (PostgreSQL): NOTIFY_CHANNEL's, for ended jobs. The payload is
# their ids, comma-separated, or ENDED_MANY ("look again") for a batch too long for one.
ENDED_SUFFIX = "_ended"
ENDED_MANY = "*"
ENDED_MAX_IDS = 400


def ended_channel():
    channel = settings.NOTIFY_CHANNEL
    return f"{channel}{ENDED_SUFFIX}" if channel else None


# A job a completion can settle in one statement: nothing to enqueue after it, and no
# group or dependent to tell (in_workflow: core/workflows.py).
# The most result text one completion statement carries; a batch of large results goes
# in several. A MariaDB statement must fit max_allowed_packet (16 MiB by default, 4 MiB
# on older servers) after the driver's escaping, which may double the text; each
# statement takes at least one result, so any result MAX_PAYLOAD_BYTES allows fits.
STATEMENT_BYTES = 2 << 20


def by_size(items, size):
    """``items`` in consecutive runs whose ``size(item)`` adds up to at most
    STATEMENT_BYTES (a run holds at least one item)."""
    run, total = [], 0
    for item in items:
        n = size(item)
        if run and total + n > STATEMENT_BYTES:
            yield run
            run, total = [], 0
        run.append(item)
        total += n
    if run:
        yield run


def no_follow_up(table=None):
    """NO_FOLLOW_UP with its columns qualified by ``table`` (for a statement that joins)."""
    p = f"{table}." if table else ""
    return f"{p}on_success IS NULL AND {p}webhook_url IS NULL AND {p}in_workflow IS NULL"


NO_FOLLOW_UP = no_follow_up()
