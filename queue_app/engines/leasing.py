"""The claim query, one per database vendor. Called only from transitions.claim().

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

Vendors:
- PostgreSQL: one statement. The candidate and lock steps are MATERIALIZED CTEs so
  the planner cannot fold them into the UPDATE and re-run the LIMIT per row (the
  reason Oban's engine writes it this way). FOR UPDATE SKIP LOCKED sits after the
  sort, so each claimer takes the best rows nobody else holds.
- MariaDB: a short READ COMMITTED transaction: the levels one MAX() seek at a time,
  one UNION of per-level seeks, the candidates ordered in Python (ordering.py's key),
  then SELECT ... FOR UPDATE SKIP LOCKED on only the best ``limit`` ids (topped up from
  the next ones when some were taken) and an UPDATE by primary key. MariaDB has no UPDATE ... RETURNING.
- SQLite: one UPDATE ... WHERE id IN (SELECT ... LIMIT n) RETURNING the rows inside an
  IMMEDIATE transaction: writers are serialised by the database lock, so no row
  locks are needed.
  The level seeks name their index (INDEXED BY jq_ready_prio): without statistics
  SQLite prefers the equality on ``state`` of jq_job_state_kind_queue and sorts every
  pending row for each level (10-20 ms per claim with 10,000 pending).

Each vendor returns the leased rows whole (rows.JOB_COLUMNS, values as after the
claim), so the caller needs no second SELECT. On PostgreSQL the caller may pass
``log``, the select list of an event row per leased job: the claimed events are then
inserted by the same statement (a data-modifying CTE), one round trip in all.

Exclusions (paused queues and kinds, kinds claimed separately under a limit, and the
concurrency keys of a per-key limited kind that are at their limit; see flow.py) are
extra conditions on the per-level seeks. The seek stays on the index, but it steps
over excluded rows one by one: a level whose oldest ready jobs are mostly paused costs
as many rows as are paused ahead of the first claimable one. A key exclusion is written
``(concurrency_key IS NULL OR NOT ...)``: ``NOT IN`` alone is NULL, not true, for a job
without a key, and would leave every unkeyed job behind.
"""

from datetime import timedelta

from django.utils import timezone

from queue_app.engines.rows import JOB_ATTNAMES, JOB_COLUMNS, JOB_COLUMNS_BARE
from queue_app.models import State

TABLE = "queue_app_job"
_US = timedelta(microseconds=1)


def claim(
    connection,
    *,
    owner,
    limit,
    now,
    expires,
    queues=None,
    kinds=None,
    aging_us=0,
    exclude_queues=None,
    exclude_kinds=None,
    exclude_keys=None,
    log=None,
):
    """Lease up to ``limit`` ready jobs to ``owner``; return their rows (rows.JOB_COLUMNS).

    ``exclude_keys`` leaves out jobs with those concurrency keys (jobs without a key are
    never left out by it). ``log`` (PostgreSQL only): (select list over the leased rows,
    params) of the event to insert per leased job in the same statement; other vendors
    ignore it."""
    scan = max(2 * limit, limit + 16)
    vendor = connection.vendor
    excl = (sorted(exclude_queues or ()), sorted(exclude_kinds or ()), sorted(exclude_keys or ()))
    if vendor == "postgresql":
        return _claim_postgresql(
            connection, owner, limit, scan, now, expires, queues, kinds, aging_us, excl, log
        )
    if vendor == "mysql":
        return _claim_mysql(connection, owner, limit, scan, now, expires, queues, kinds, aging_us, excl)
    if vendor == "sqlite":
        return _claim_sqlite(connection, owner, limit, scan, now, expires, queues, kinds, aging_us, excl)
    raise NotImplementedError(f"jobqueue does not support the {vendor} database")


def _adapt(connection, value):
    return connection.ops.adapt_datetimefield_value(value)


# The columns claim()'s exclusions apply to, in the order of its ``excl`` tuple.
_EXCLUDED = ("queue_name", "kind", "concurrency_key")


def _excluding(ref, condition):
    """``condition`` (NOT IN / NOT = ANY on the column ``ref``) as a seek filter. A job
    without a concurrency key is never excluded by key: ``NOT IN`` is NULL, not true,
    for a NULL key, so the key's filter lets NULL through explicitly."""
    if ref.endswith("concurrency_key"):
        return f"({ref} IS NULL OR {condition})"
    return condition


def _marks(values):
    return ", ".join(["%s"] * len(values))


# Shared by the vendors: what a claim writes to each leased row.
_SET = (
    "state = 'leased', lease_owner = %s, lease_expires_at = %s, "
    "attempts = attempts + 1, started_at = COALESCE(started_at, %s)"
)


def _claim_postgresql(connection, owner, limit, scan, now, expires, queues, kinds, aging_us, excl, log=None):
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
    for column, names in zip(_EXCLUDED, excl):
        if names:
            kind_cond += f" AND {_excluding(f'j.{column}', f'NOT (j.{column} = ANY(%s::text[]))')}"
            lateral_params.append(names)
    lateral_params.append(scan)
    if aging_us:
        eff = (
            "j.priority + ((extract(epoch FROM (%s::timestamptz - j.run_at)) * 1000000)::bigint / %s::bigint)"
        )
        eff_params = [now, aging_us]
    else:
        eff, eff_params = "j.priority", []
    log_cte = f",\n    logged AS ({log[0]} FROM leased)" if log else ""
    sql = f"""
    WITH RECURSIVE levels(p) AS (
        (SELECT priority FROM {TABLE} WHERE state = 'pending' ORDER BY priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT j.priority FROM {TABLE} j
                WHERE j.state = 'pending' AND j.priority < l.p
                ORDER BY j.priority DESC LIMIT 1)
        FROM levels l WHERE l.p IS NOT NULL
    ),
    candidates AS MATERIALIZED (
        SELECT c.id FROM levels l {queue_join}
        CROSS JOIN LATERAL (
            SELECT j.id FROM {TABLE} j
            WHERE j.state = 'pending' AND j.priority = l.p AND j.run_at <= %s
                  {queue_cond} {kind_cond}
            ORDER BY j.run_at, j.created_at, j.id
            LIMIT %s
        ) c
        WHERE l.p IS NOT NULL
    ),
    picked AS MATERIALIZED (
        SELECT j.id FROM {TABLE} j
        -- = ANY(ARRAY(...)) keeps this a primary-key probe per candidate; with IN (SELECT ...)
        -- the planner may hash-join the candidates against every pending row.
        -- run_at again: under FOR UPDATE, PostgreSQL re-checks only this WHERE against the
        -- newest row version, and a candidate may have been retried into the future since.
        WHERE j.id = ANY(ARRAY(SELECT id FROM candidates)) AND j.state = 'pending' AND j.run_at <= %s
        ORDER BY {eff} DESC, j.run_at, j.created_at, j.id
        LIMIT %s
        FOR UPDATE SKIP LOCKED
    ),
    leased AS (
        UPDATE {TABLE} SET {_SET}
        FROM picked WHERE {TABLE}.id = picked.id
        RETURNING {JOB_COLUMNS}
    ){log_cte}
    SELECT * FROM leased
    """
    params = params + lateral_params + [now] + eff_params + [limit, owner, expires, now]
    if log:
        params += log[1]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


_ID, _STATE, _OWNER, _EXPIRES, _ATTEMPTS, _STARTED, _PRIORITY, _RUN_AT, _CREATED = (
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


def _claim_mysql(connection, owner, limit, scan, now, expires, queues, kinds, aging_us, excl):
    now_db = _adapt(connection, now)
    with connection.cursor() as cursor:
        # MariaDB plans DISTINCT here as a scan of every pending row, and a recursive CTE
        # re-runs its subquery unoptimised; a MAX() bounded on the index prefix is a single
        # seek ("Select tables optimized away"), so walk the levels down one seek at a time.
        levels = []
        while True:
            if levels:
                cursor.execute(
                    f"SELECT MAX(priority) FROM {TABLE} WHERE state = 'pending' AND priority < %s",
                    [levels[-1]],
                )
            else:
                cursor.execute(f"SELECT MAX(priority) FROM {TABLE} WHERE state = 'pending'")
            level = cursor.fetchone()[0]
            if level is None:
                break
            levels.append(level)
        if not levels:
            return []
        parts, params = [], []
        for level in levels:
            for queue in queues or [None]:
                cond = "state = 'pending' AND priority = %s AND run_at <= %s"
                p = [level, now_db]
                if queue is not None:
                    cond += " AND queue_name = %s"
                    p.append(queue)
                if kinds:
                    cond += f" AND kind IN ({', '.join(['%s'] * len(kinds))})"
                    p.extend(kinds)
                for column, names in zip(_EXCLUDED, excl):
                    if names:
                        cond += f" AND {_excluding(column, f'{column} NOT IN ({_marks(names)})')}"
                        p.extend(names)
                parts.append(
                    f"(SELECT id, priority, run_at, created_at FROM {TABLE} WHERE {cond}"
                    " ORDER BY run_at, created_at, id LIMIT %s)"
                )
                params.extend(p + [scan])
        cursor.execute(" UNION ALL ".join(parts), params)
        naive_now = timezone.make_naive(now, connection.timezone)

        def key(row):
            job_id, priority, run_at, created_at = row
            eff = priority + ((naive_now - run_at) // _US) // aging_us if aging_us else priority
            return (-eff, run_at, created_at, job_id)

        # Order the candidates here, then lock only the best ``limit`` of them. With ORDER
        # BY ... LIMIT in the locking SELECT, InnoDB locks every candidate it reads before
        # the sort, and a concurrent claimer finds them all taken.
        ranked = [row[0] for row in sorted(cursor.fetchall(), key=key)]
        rows = []
        while ranked and len(rows) < limit:
            want, ranked = ranked[: limit - len(rows)], ranked[limit - len(rows) :]
            cursor.execute(
                f"SELECT {JOB_COLUMNS_BARE} FROM {TABLE} WHERE id IN ({', '.join(['%s'] * len(want))})"
                f" AND state = 'pending' AND run_at <= %s FOR UPDATE SKIP LOCKED",
                want + [now_db],
            )
            rows.extend(list(row) for row in cursor.fetchall())
        rows.sort(key=lambda r: key((r[_ID], r[_PRIORITY], r[_RUN_AT], r[_CREATED])))
        if rows:
            cursor.execute(
                f"UPDATE {TABLE} SET {_SET} WHERE id IN ({', '.join(['%s'] * len(rows))})",
                [owner, _adapt(connection, expires), now_db] + [row[_ID] for row in rows],
            )
        # No UPDATE ... RETURNING on MariaDB: the rows as read (under the lock), with what
        # _SET wrote, in the driver's form (naive UTC datetimes).
        naive_expires = timezone.make_naive(expires, connection.timezone)
        for row in rows:
            row[_STATE] = State.LEASED.value
            row[_OWNER] = owner
            row[_EXPIRES] = naive_expires
            row[_ATTEMPTS] += 1
            if row[_STARTED] is None:
                row[_STARTED] = naive_now
        return rows


# Whole microseconds since the epoch of a datetime column as SQLite stores it
# ('YYYY-MM-DD HH:MM:SS[.ffffff]'); integer arithmetic keeps aging boundaries exact.
def _sqlite_us(expr):
    return f"(CAST(strftime('%%s', {expr}) AS INTEGER) * 1000000 + CAST(substr({expr} || '.000000', 21, 6) AS INTEGER))"


def _claim_sqlite(connection, owner, limit, scan, now, expires, queues, kinds, aging_us, excl):
    now_db = _adapt(connection, now)
    params = []
    queue_from, queue_cond = "", ""
    if queues:
        queue_from = ", (" + " UNION ALL ".join(["SELECT %s AS name"] * len(queues)) + ") AS q"
        params.extend(queues)
        queue_cond = "AND k.queue_name = q.name"
    kind_cond = ""
    inner = [now_db]
    if kinds:
        kind_cond = f"AND k.kind IN ({', '.join(['%s'] * len(kinds))})"
        inner.extend(kinds)
    for column, names in zip(_EXCLUDED, excl):
        if names:
            kind_cond += f" AND {_excluding(f'k.{column}', f'k.{column} NOT IN ({_marks(names)})')}"
            inner.extend(names)
    inner.append(scan)
    if aging_us:
        eff = f"j.priority + (({_sqlite_us('%s')} - {_sqlite_us('j.run_at')}) / %s)"
        eff_params = [now_db, now_db, aging_us]
    else:
        eff, eff_params = "j.priority", []
    sql = f"""
    WITH RECURSIVE levels(p) AS (
        SELECT (SELECT priority FROM {TABLE} INDEXED BY jq_ready_prio
                WHERE state = 'pending' ORDER BY priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT k.priority FROM {TABLE} k INDEXED BY jq_ready_prio
                WHERE k.state = 'pending' AND k.priority < levels.p
                ORDER BY k.priority DESC LIMIT 1)
        FROM levels WHERE levels.p IS NOT NULL
    )
    UPDATE {TABLE} SET {_SET}
    WHERE id IN (
        SELECT j.id FROM {TABLE} j
        WHERE j.id IN (
            SELECT k.id FROM levels {queue_from}
            JOIN {TABLE} k ON k.id IN (
                SELECT k2.id FROM {TABLE} k2
                WHERE k2.state = 'pending' AND k2.priority = levels.p AND k2.run_at <= %s
                      {queue_cond.replace("k.", "k2.")} {kind_cond.replace("k.", "k2.")}
                ORDER BY k2.run_at, k2.created_at, k2.id
                LIMIT %s
            )
            WHERE levels.p IS NOT NULL
        )
        ORDER BY {eff} DESC, j.run_at, j.created_at, j.id
        LIMIT %s
    )
    RETURNING {JOB_COLUMNS_BARE}
    """
    # Placeholders in text order: the SET clause comes before the subqueries.
    params = [owner, _adapt(connection, expires), now_db] + params + inner + eff_params + [limit]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()
