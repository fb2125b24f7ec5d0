"""PostgreSQL's engine: every hot write is one statement with its events (data-modifying
CTEs), so it is atomic on its own and costs one round trip, with no BEGIN/COMMIT around
it; bulk inserts go by COPY; the supervisor LISTENs for the NOTIFY an enqueue sends."""

from contextlib import nullcontext
from itertools import chain

from queue_app.conf import settings
from queue_app.engines import leasing, rows
from queue_app.engines.base import (
    COMPLETED_SET,
    ENDED_MANY,
    ENDED_MAX_IDS,
    EVENT_ATTEMPT,
    EVENT_JOB,
    EVENT_METADATA,
    GATED,
    Engine,
    Fence,
    WakeUp,
    ended_channel,
    no_follow_up,
)
from queue_app.engines.leasing import SET, TABLE, excluding

# The distinct priorities of the pending jobs, highest first, one index seek each (a
# recursive "loose index scan"): the levels both claims seek their candidates in.
_LEVELS = f"""levels(p) AS (
        (SELECT priority FROM {TABLE} WHERE state = 'pending' ORDER BY priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT j.priority FROM {TABLE} j
                WHERE j.state = 'pending' AND j.priority < l.p
                ORDER BY j.priority DESC LIMIT 1)
        FROM levels l WHERE l.p IS NOT NULL
    )"""


def _effective(alias, now, aging_us):
    """The effective priority of ``alias``'s job (ordering.py: one level per aging
    interval waited), as SQL and its parameters; the priority alone without aging."""
    if not aging_us:
        return f"{alias}.priority", []
    return (
        f"{alias}.priority + ((extract(epoch FROM (%s::timestamptz - {alias}.run_at)) * 1000000)::bigint / %s::bigint)",
        [now, aging_us],
    )


_EXPLICIT_ONLY = 2**62


class _Preparing:
    """A psycopg cursor with server-side binding whose execute() prepares the statement:
    psycopg keeps it per connection (by text and parameter types), so the server parses
    it once instead of on every call (PostgreSQL still chooses between a custom and a
    generic plan, plan_cache_mode's default). Django's cursor binds on the client (every
    statement a new text) and turns psycopg's preparation off with a threshold of None,
    which also makes it ignore prepare=True: the threshold is raised for this execute
    only, so psycopg keeps no count, and no copy, of every other statement the
    connection runs (a handler's, with its payloads inlined)."""

    __slots__ = ("cursor",)

    def __init__(self, cursor):
        self.cursor = cursor

    def execute(self, sql, params=None):
        import psycopg

        raw = self.cursor.connection
        raw.prepare_threshold = _EXPLICIT_ONLY
        try:
            try:
                return self.cursor.execute(sql, params, prepare=True)
            except psycopg.errors.FeatureNotSupported as exc:
                # A migration changed a column the statement returns while it was kept:
                # "cached plan must not change result type" until it is prepared again.
                # Outside a transaction, forget the kept ones and run it once more; inside
                # one the caller's rollback makes psycopg forget them.
                if "cached plan" not in str(exc) or not raw.autocommit:
                    raise
                raw.execute("DEALLOCATE ALL")  # psycopg clears its own cache on seeing it
                return self.cursor.execute(sql, params, prepare=True)
        finally:
            raw.prepare_threshold = None

    def __getattr__(self, name):
        return getattr(self.cursor, name)


class PostgresEngine(Engine):
    vendor = "postgresql"

    def hot_cursor(self):
        """A cursor for a statement the worker runs all the time (the claim, the batched
        acknowledgement): here prepared (_Preparing) unless POSTGRES_PREPARE is off. Wrapped
        as Django wraps its own, so its errors, execute_wrappers and query log still apply."""
        connection = self.connection
        if not settings.POSTGRES_PREPARE:
            return connection.cursor()
        import psycopg  # only PostgreSQL installs have it

        connection.ensure_connection()
        return connection._prepare_cursor(_Preparing(psycopg.Cursor(connection.connection)))

    # A table this share dead (and at least this many dead rows) is one autovacuum is not
    # keeping up with: the claim's index scans step over the dead entries of done jobs.
    DEAD_RATIO = 0.2
    DEAD_MIN = 10_000

    def doctor(self):
        out = []
        with self.connection.cursor() as cursor:
            cursor.execute("SHOW autovacuum")
            if cursor.fetchone()[0] != "on":
                out.append(("PostgreSQL autovacuum is off", "set autovacuum = on in postgresql.conf"))
            cursor.execute(
                "SELECT c.relname, coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0),"
                " coalesce(array_to_string(c.reloptions, ','), '')"
                " FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid"
                " WHERE c.relname IN (%s, %s) AND c.relkind = 'r'",
                [rows.JOB_TABLE, rows.EVENT_TABLE],
            )
            for table, live, dead, options in cursor.fetchall():
                if "autovacuum_enabled=false" in options.replace(" ", "").lower():
                    out.append(
                        (
                            f"autovacuum is disabled on {table}",
                            f"ALTER TABLE {table} RESET (autovacuum_enabled)",
                        )
                    )
                if dead >= self.DEAD_MIN and dead > self.DEAD_RATIO * (live + dead):
                    out.append(
                        (
                            f"{table} is {dead / (live + dead):.0%} dead rows ({dead:,})",
                            f"VACUUM (ANALYZE) {table}, and lower its autovacuum_vacuum_scale_factor",
                        )
                    )
        return out

    def plan(self, sql, params):
        with self.connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN {sql}", params)
            return "\n".join(row[0] for row in cursor.fetchall())

    def estimated_rows(self, table):
        # The planner's own estimate (-1: never analysed; then the highest id).
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT reltuples FROM pg_class WHERE relname = %s AND relkind = 'r'", [table])
            row = cursor.fetchone()
        if row and row[0] >= 0:
            return int(row[0])
        return super().estimated_rows(table)

    # --- enqueue ---------------------------------------------------------------------

    def insert_chunk(self):
        # COPY has no statement size to keep small: fewer, larger chunks, fewer waits for
        # the server to finish one before the next is sent.
        return max(settings.BULK_BATCH_SIZE, 10_000)

    def _insert_atomic(self, count, savepoint):
        # A single job is one statement with its event: atomic on its own, no BEGIN/COMMIT.
        return nullcontext() if count == 1 else super()._insert_atomic(count, savepoint)

    def _insert_chunk(self, writer, chunk, texts, events, now, cache):
        connection = self.connection
        if len(chunk) > 1:
            values, adapted = writer.rows(chunk, {"payload": texts}, cache, raw_json=True)
            ids = rows.reserve_ids(connection, rows.JOB_TABLE, len(chunk))
            rows.copy_insert(
                connection,
                rows.JOB_TABLE,
                "id, " + writer.columns,
                ([job_id, *row] for job_id, row in zip(ids, adapted)),
            )
            if len(ids) == len(chunk):
                rows.insert_events(
                    connection, [[job_id, *tail] for job_id, tail in zip(ids, events)], copy=True
                )
            return values, ids
        # A single job: one statement with its event and NOTIFY, atomic on its own, and
        # prepared (hot_cursor): planning this three-part statement was about a tenth of a
        # single enqueue's wall time (0.2 of 2.1 ms at 20 ms spacing).
        values, adapted = writer.rows(chunk, {"payload": texts}, cache)
        insert = (
            f"INSERT INTO {rows.JOB_TABLE} ({writer.columns})"
            f" VALUES {rows.placeholders(writer.width, 1, connection)}"
            " RETURNING id"
        )
        select, event_params = rows.event_select([None, *events[0]], {EVENT_JOB: "id"})
        notify, notify_params = "", []
        channel = settings.NOTIFY_CHANNEL
        if channel and chunk[0]["run_at"] <= now:
            notify, notify_params = ", pg_notify(%s, %s)", [channel, chunk[0]["queue_name"]]
        with self.hot_cursor() as cursor:
            cursor.execute(
                f"WITH j AS ({insert}), e AS (INSERT INTO {rows.EVENT_TABLE} ({rows.EVENT_COLUMNS})"
                f" SELECT {select} FROM j) SELECT id{notify} FROM j",
                list(chain.from_iterable(adapted)) + event_params + notify_params,
            )
            return values, [cursor.fetchone()[0]]

    def deadlocked(self, exc):
        return getattr(exc.__cause__, "sqlstate", None) == "40P01"  # deadlock_detected

    def notify(self, queues):
        # NOTIFY inside the enqueuing transaction is delivered by PostgreSQL only when that
        # transaction (or the caller's outer one) commits, and dropped on rollback: the same
        # guarantee as transaction.on_commit without a second round trip after the commit.
        channel = settings.NOTIFY_CHANNEL
        if channel and queues:
            with self.connection.cursor() as cursor:
                for queue in queues:
                    cursor.execute("SELECT pg_notify(%s, %s)", [channel, queue])

    def notify_ended(self, job_ids):
        # As notify(): delivered on commit, dropped on rollback.
        channel = ended_channel()
        if channel and job_ids:
            payload = ",".join(map(str, job_ids)) if len(job_ids) <= ENDED_MAX_IDS else ENDED_MANY
            with self.connection.cursor() as cursor:
                cursor.execute("SELECT pg_notify(%s, %s)", [channel, payload])

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
        # One statement. The candidate and lock steps are MATERIALIZED CTEs so the planner
        # cannot fold them into the UPDATE and re-run the LIMIT per row (the reason Oban's
        # engine writes it this way). FOR UPDATE SKIP LOCKED sits after the sort, so each
        # claimer takes the best rows nobody else holds. The claimed events go in with the
        # claim (a data-modifying CTE over the leased rows): one round trip in all.
        # unless_gated reads the pause and limit tables in the same statement (the gate
        # CTE, one snapshot with the claim) and answers through a LEFT JOIN from it: one
        # row (closed, NULLs) when nothing was leased, so "gated" and "nothing ready"
        # are told apart without a second statement.
        excl = leasing.excluded(exclude_queues, exclude_kinds, exclude_keys)
        params = []
        queue_join = ""
        queue_cond = ""
        if queues:
            queue_join = "CROSS JOIN unnest(%s::text[]) AS q(name)"
            params.append(list(queues))
            queue_cond = "AND j.queue_name = q.name"
        kind_cond = ""
        lateral_params = [now]
        if kinds:
            kind_cond = "AND j.kind = ANY(%s::text[])"
            lateral_params.append(list(kinds))
        for column, names in zip(leasing.EXCLUDED, excl):
            if names:
                kind_cond += f" AND {excluding(f'j.{column}', f'NOT (j.{column} = ANY(%s::text[]))')}"
                lateral_params.append(names)
        # The limits are literals, not parameters: the statement is prepared (hot_cursor),
        # and a generic plan, if PostgreSQL picks one, must know how few rows the seeks and
        # the lock step yield (a LIMIT parameter is priced at a tenth of its input, which
        # could make the UPDATE a hash join over the whole table). A worker's batch size
        # seldom changes, so there are few texts.
        limit, scan = int(limit), int(leasing.scan(limit))
        eff, eff_params = _effective("j", now, aging_us)
        select, event_params = rows.event_select(event, {EVENT_JOB: "id", EVENT_ATTEMPT: "attempts"})
        gate, gate_cond, result = "", "", "SELECT * FROM leased"
        if unless_gated:
            gate = f"gate AS (SELECT {GATED} AS closed),"
            gate_cond = "AND NOT (SELECT closed FROM gate)"
            result = "SELECT gate.closed, leased.* FROM gate LEFT JOIN leased ON true"
        sql = f"""
    WITH RECURSIVE {gate} {_LEVELS},
    candidates AS MATERIALIZED (
        SELECT c.id FROM levels l {queue_join}
        CROSS JOIN LATERAL (
            SELECT j.id FROM {TABLE} j
            WHERE j.state = 'pending' AND j.priority = l.p AND j.run_at <= %s
                  {queue_cond} {kind_cond}
            ORDER BY j.run_at, j.created_at, j.id
            LIMIT {scan}
        ) c
        WHERE l.p IS NOT NULL {gate_cond}
    ),
    picked AS MATERIALIZED (
        SELECT j.id FROM {TABLE} j
        -- = ANY(ARRAY(...)) keeps this a primary-key probe per candidate; with IN (SELECT ...)
        -- the planner may hash-join the candidates against every pending row.
        -- run_at again: under FOR UPDATE, PostgreSQL re-checks only this WHERE against the
        -- newest row version, and a candidate may have been retried into the future since.
        -- IS NOT DISTINCT FROM, not =, on the NOT NULL state: the same test, but one that
        -- does not imply the ready indexes' WHERE state = 'pending', so the planner cannot
        -- take one of them instead of the probe (without statistics, on a table filled
        -- since the last ANALYZE, it scanned jq_ready_tenant for run_at <= now: 2.6 ms of a
        -- 3.6 ms claim of 10, against 0.6 ms with the probe).
        WHERE j.id = ANY(ARRAY(SELECT id FROM candidates))
              AND j.state IS NOT DISTINCT FROM 'pending' AND j.run_at <= %s
        ORDER BY {eff} DESC, j.run_at, j.created_at, j.id
        LIMIT {limit}
        FOR UPDATE SKIP LOCKED
    ),
    leased AS (
        UPDATE {TABLE} SET {SET}
        FROM picked WHERE {TABLE}.id = picked.id
        RETURNING {rows.JOB_COLUMNS}
    ),
    logged AS (INSERT INTO {rows.EVENT_TABLE} ({rows.EVENT_COLUMNS}) SELECT {select} FROM leased)
    {result}
    """
        params = params + lateral_params + [now] + eff_params + [owner, expires, now] + event_params
        with self.hot_cursor() as cursor:
            cursor.execute(sql, params)
            found = cursor.fetchall()
        if not unless_gated:
            return found
        if found[0][0]:
            return None
        return [row[1:] for row in found if row[1] is not None]

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
        # One statement, as claim(): the tenants as an array WITH ORDINALITY (their turn),
        # per tenant and level a LATERAL seek of jq_ready_tenant (two branches, one for a
        # key and one for the keyless jobs: ``IS NOT DISTINCT FROM`` would not seek), each
        # tenant's candidates numbered in lease order (row_number() n: the round is
        # (n - 1) / weight), and the ids in (round, turn, n) order as one array: the lock step keeps claim()'s
        # primary-key probes (= ANY) and takes the first ``limit`` by array_position.
        cond, cond_params = "", []
        if queues:
            cond += " AND j.queue_name = ANY(%s::text[])"
            cond_params.append(list(queues))
        if exclude_queues:
            cond += " AND NOT (j.queue_name = ANY(%s::text[]))"
            cond_params.append(sorted(exclude_queues))
        seek = (
            f"(SELECT j.id, j.priority, j.run_at, j.created_at FROM {TABLE} j"
            " WHERE {tenant} AND j.state = 'pending' AND j.kind = %s AND j.priority = l.p"
            # The whole index order, constants too: PostgreSQL does not count ``IS NULL``
            # as an equality that fixes the order, and would sort the keyless backlog.
            f" AND j.run_at <= %s{cond}"
            " ORDER BY j.kind, j.concurrency_key, j.priority, j.run_at, j.created_at, j.id LIMIT %s)"
        )
        weights = list(weights or [1] * len(tenants))
        seek_params = [kind, now, *cond_params, self.fair_scan(limit, weights)]
        keyed = seek.format(tenant="t.key IS NOT NULL AND j.concurrency_key = t.key")
        keyless = seek.format(tenant="t.key IS NULL AND j.concurrency_key IS NULL")
        eff, eff_params = _effective("c", now, aging_us)
        select, event_params = rows.event_select(event, {EVENT_JOB: "id", EVENT_ATTEMPT: "attempts"})
        sql = f"""
    WITH RECURSIVE {_LEVELS},
    tenants AS (SELECT * FROM unnest(%s::text[], %s::integer[]) WITH ORDINALITY AS t(key, weight, turn)),
    candidates AS MATERIALIZED (
        SELECT c.id, t.turn, t.weight,
               row_number() OVER (PARTITION BY t.turn ORDER BY {eff} DESC, c.run_at, c.created_at, c.id) AS n
        FROM tenants t CROSS JOIN levels l
        CROSS JOIN LATERAL ({keyed} UNION ALL {keyless}) c
        WHERE l.p IS NOT NULL
    ),
    ranked AS MATERIALIZED (
        SELECT ARRAY(SELECT id FROM candidates ORDER BY (n - 1) / weight, turn, n) AS ids
    ),
    picked AS MATERIALIZED (
        SELECT j.id FROM ranked r JOIN {TABLE} j ON j.id = ANY(r.ids)
        -- run_at again, as in claim(): FOR UPDATE re-checks only this WHERE; and the
        -- state as there, in a form no ready index's WHERE follows from.
        WHERE j.state IS NOT DISTINCT FROM 'pending' AND j.run_at <= %s
        ORDER BY array_position(r.ids, j.id)
        LIMIT %s
        FOR UPDATE OF j SKIP LOCKED
    ),
    leased AS (
        UPDATE {TABLE} SET {SET}
        FROM picked WHERE {TABLE}.id = picked.id
        RETURNING {rows.JOB_COLUMNS}
    ),
    logged AS (INSERT INTO {rows.EVENT_TABLE} ({rows.EVENT_COLUMNS}) SELECT {select} FROM leased)
    SELECT * FROM leased
    """
        params = (
            [list(tenants), weights]
            + eff_params
            + seek_params
            + seek_params
            + [now, limit, owner, expires, now]
            + event_params
        )
        with self.connection.cursor() as cursor:
            # The planner cannot know the tenants' count or the seeks' LIMIT (parameters)
            # and prices this statement past jit_above_cost at a batch of 100; compiling
            # it then costs 300-600 ms for a statement that runs in 2. SET LOCAL: only
            # for the fair kind's own transaction (flow.reserve() holds one open).
            if not self.connection.get_autocommit():
                cursor.execute("SET LOCAL jit = off")
            cursor.execute(sql, params)
            return cursor.fetchall()

    def complete_plain(self, done, owner, at_db, event):
        # One statement: the pairs as arrays (unnest) joined to the fence, the UPDATE and
        # the INSERT of their events as CTEs. Arrays, not a VALUES row per job: the text
        # stays the same at any batch size, so psycopg parses it once (a 100-row VALUES
        # list is past its cache and was split anew each time: 4% of a worker at --batch 100).
        connection = self.connection
        ids, attempts, results, metas = [], [], [], []
        for job_id, attempt, result, meta in done:
            ids.append(job_id)
            attempts.append(attempt)
            results.append(rows.json_value(connection, result))
            metas.append(rows.json_value(connection, meta))
        values = [ids, attempts, results, metas]
        select, event_params = rows.event_select(
            event, {EVENT_JOB: "id", EVENT_ATTEMPT: "attempts", EVENT_METADATA: "COALESCE(meta::jsonb, %s)"}
        )
        t = rows.JOB_TABLE
        # wait() callers hear of these ends on commit (notify_ended's payload), from the
        # same statement; a SELECT in a CTE runs only if used, hence the join.
        channel = ended_channel()
        told, told_join, told_params = "", "", []
        if channel:
            told = (
                ", told AS (SELECT pg_notify(%s, CASE WHEN count(*) <= %s"
                " THEN string_agg(id::text, ',') ELSE %s END) FROM done HAVING count(*) > 0)"
            )
            told_join = " LEFT JOIN told ON true"
            told_params = [channel, ENDED_MAX_IDS, ENDED_MANY]
        sql = f"""
        WITH v(id, attempt, result, meta) AS (
            SELECT * FROM unnest(%s::bigint[], %s::integer[], %s::jsonb[], %s::jsonb[])
        ),
        done AS (
            UPDATE {t} SET {COMPLETED_SET.replace("result = %s", "result = v.result::jsonb")}
            FROM v WHERE {Fence.joined(t, "v")} AND {no_follow_up(t)}
            RETURNING {t}.id, {t}.attempts, v.meta
        ),
        logged AS (INSERT INTO {rows.EVENT_TABLE} ({rows.EVENT_COLUMNS}) SELECT {select} FROM done){told}
        SELECT id FROM done{told_join}
        """
        with self.hot_cursor() as cursor:
            cursor.execute(sql, values + [at_db, owner] + event_params + told_params)
            return {row[0] for row in cursor.fetchall()}

    # --- waiting for work ----------------------------------------------------------------

    def wake_up(self):
        # Enqueue NOTIFYs the channel in its transaction, so the wake-up arrives on commit.
        channel = settings.NOTIFY_CHANNEL
        return WakeUp(channel=channel) if channel else None

    def listen(self, channel):
        import psycopg  # only PostgreSQL installs have it

        params = self.connection.get_connection_params()
        params.pop("cursor_factory", None)
        # Its own autocommit connection: PostgreSQL delivers notifications to a session
        # only between its transactions, and the worker's connection is often in one.
        conn = psycopg.Connection.connect(**params, autocommit=True)
        conn.execute(f'LISTEN "{channel}"')
        return conn
