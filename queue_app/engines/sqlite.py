"""SQLite's engine: one file, writers serialised by the database lock (the project opens
every transaction IMMEDIATE), so no row locks are needed and none are taken; UPDATE ...
RETURNING gives back what a write changed; the supervisor watches PRAGMA data_version."""

import ctypes
import functools
import json
import os
import re
import select

from queue_app.conf import settings
from queue_app.engines import leasing, rows
from queue_app.engines.base import (
    COMPLETED_SET,
    GATED,
    Engine,
    Fence,
    WakeUp,
    by_size,
    no_follow_up,
)
from queue_app.engines.leasing import SET, TABLE, excluding, marks


# Whole microseconds since the epoch of a datetime column as SQLite stores it
# ('YYYY-MM-DD HH:MM:SS[.ffffff]'); integer arithmetic keeps aging boundaries exact.
def _sqlite_us(expr):
    return f"(CAST(strftime('%%s', {expr}) AS INTEGER) * 1000000 + CAST(substr({expr} || '.000000', 21, 6) AS INTEGER))"


# The distinct priorities of the pending jobs, highest first, one index seek each: the
# levels both claims seek their candidates in.
_LEVELS = f"""levels(p) AS (
        SELECT (SELECT priority FROM {TABLE} INDEXED BY jq_ready_prio
                WHERE state = 'pending' ORDER BY priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT k.priority FROM {TABLE} k INDEXED BY jq_ready_prio
                WHERE k.state = 'pending' AND k.priority < levels.p
                ORDER BY k.priority DESC LIMIT 1)
        FROM levels WHERE levels.p IS NOT NULL
    )"""


def _effective(alias, now_db, aging_us):
    """The effective priority of ``alias``'s job (ordering.py: one level per aging
    interval waited), as SQL and its parameters; the priority alone without aging."""
    if not aging_us:
        return f"{alias}.priority", []
    run_at = _sqlite_us(f"{alias}.run_at")
    return f"{alias}.priority + (({_sqlite_us('%s')} - {run_at}) / %s)", [now_db, now_db, aging_us]


# Django's SQLite cursor turns each %s into ? with a regular expression over the whole
# statement on every call: for the claim's 2 KB and its events' INSERT that was a tenth
# of a batch's claim and acknowledgement, all of it inside the write lock. hot_cursor()
# converts each text once (Django's own rule: %s, not %%s; %% is %).
_PLACEHOLDER = re.compile(r"(?<!%)%s")


@functools.lru_cache(maxsize=256)
def _qmark(sql):
    return _PLACEHOLDER.sub("?", sql).replace("%%", "%")


class _Qmark:
    """A sqlite3 cursor whose execute() takes Django's %s placeholders, converted once
    per statement text (_qmark)."""

    __slots__ = ("cursor",)

    def __init__(self, cursor):
        self.cursor = cursor

    def execute(self, sql, params=None):
        if params is None:
            return self.cursor.execute(sql)
        return self.cursor.execute(_qmark(sql), params)

    def __getattr__(self, name):
        return getattr(self.cursor, name)


# The batch's completion (complete_plain). UPDATE ... FROM needs SQLite 3.33, which every
# library with RETURNING (3.35, the claim's) has.
_T = TABLE
_COMPLETE_FROM = f"""
    UPDATE {_T} SET {COMPLETED_SET.replace("result = %s", "result = v.result")}
    FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS attempt,
                 json_extract(value, '$[2]') AS result FROM json_each(%s)) AS v
    WHERE {Fence.joined(_T, "v")} AND {no_follow_up(_T)}
    RETURNING {_T}.id, {_T}.attempts
"""


class SqliteEngine(Engine):
    vendor = "sqlite"
    skips_locked_rows = False  # writers take turns: a claim sees every ready row

    def hot_cursor(self):
        # Wrapped as Django wraps its own cursors, so its errors, execute_wrappers and
        # query log still apply; only the placeholder conversion is remembered (_Qmark).
        connection = self.connection
        connection.ensure_connection()
        return connection._prepare_cursor(_Qmark(connection.connection.cursor()))

    # --- enqueue ---------------------------------------------------------------------

    def insert_jobs(self, givens, payload_texts, events, now, *, savepoint=True):
        if not self.lone_insert(givens) or self.connection.connection.in_transaction:
            return super().insert_jobs(givens, payload_texts, events, now, savepoint=savepoint)
        return self._insert_one(givens[0], payload_texts[0], events[0])

    def _insert_one(self, given, payload_text, event):
        """A single enqueue outside any transaction (a view's): its own BEGIN IMMEDIATE,
        the job row, its event and COMMIT, on the driver's connection.

        Django's transaction.atomic() and cursor wrapper (four layers per statement, a
        regex over each SQL text, the autocommit switched off and back on) cost more
        Python than the sqlite3 module's whole transaction; only what they do for this
        case is kept: database errors become Django's (wrap_database_errors), and a
        failure rolls the transaction back before it propagates. Not while Django logs
        queries or a site wraps their execution (execute_wrappers): then through Django,
        so that those see every statement."""
        connection = self.connection
        writer = rows.JobWriter.on(connection)
        (values,), (params,) = writer.rows([given], {"payload": [payload_text]}, {})
        insert_job, insert_event = self.lone_inserts
        db = connection.connection
        with connection.wrap_database_errors:
            db.execute("BEGIN IMMEDIATE")  # the write lock now, as settings' transaction_mode does
            try:
                job_id = db.execute(insert_job, params).lastrowid
                db.execute(insert_event, [job_id, *event])
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        return writer.jobs([job_id], [values])

    def doctor(self):
        with self.connection.cursor() as cursor:
            mode = cursor.execute("PRAGMA journal_mode").fetchone()[0].lower()
            # 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA
            synchronous = cursor.execute("PRAGMA synchronous").fetchone()[0]
        out = []
        if mode != "wal":
            # Without WAL a reader blocks the writers and every claim waits on the dashboard.
            out.append(
                (
                    f"SQLite journal_mode is {mode}, not wal",
                    'add "PRAGMA journal_mode=WAL;" to OPTIONS["init_command"] (the example settings do)',
                )
            )
        if synchronous == 0:
            out.append(
                (
                    "SQLite synchronous is OFF: a crash of the OS can lose committed jobs",
                    'add "PRAGMA synchronous=NORMAL;" (or FULL) to OPTIONS["init_command"]',
                )
            )
        return out

    def plan(self, sql, params):
        # One line per step: "SEARCH t USING INDEX name (...)", "SCAN t" (all of it).
        with self.connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
            return "\n".join(str(row[-1]) for row in cursor.fetchall())

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
        # One UPDATE ... WHERE id IN (SELECT ... LIMIT n) RETURNING the rows inside an
        # IMMEDIATE transaction: writers are serialised by the database lock, so no row
        # locks are needed.
        # The level seeks name their index (INDEXED BY jq_ready_prio): without statistics
        # SQLite prefers the equality on ``state`` of jq_job_state_kind_queue and sorts every
        # pending row for each level (10-20 ms per claim with 10,000 pending).
        # unless_gated: NOT GATED guards the UPDATE, and only a claim that leased nothing
        # asks whether that was the gate; inside the IMMEDIATE transaction no pause or
        # limit can commit between the two, so the answer is the claim's own.
        connection = self.connection
        excl = leasing.excluded(exclude_queues, exclude_kinds, exclude_keys)
        now_db = connection.ops.adapt_datetimefield_value(now)
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
        for column, names in zip(leasing.EXCLUDED, excl):
            if names:
                kind_cond += f" AND {excluding(f'k.{column}', f'k.{column} NOT IN ({marks(names)})')}"
                inner.extend(names)
        inner.append(leasing.scan(limit))
        eff, eff_params = _effective("j", now_db, aging_us)
        sql = f"""
    WITH RECURSIVE {_LEVELS}
    UPDATE {TABLE} SET {SET}
    WHERE {"NOT " + GATED + " AND" if unless_gated else ""} id IN (
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
    RETURNING {rows.JOB_COLUMNS_BARE}
    """
        # Placeholders in text order: the SET clause comes before the subqueries.
        params = (
            [owner, connection.ops.adapt_datetimefield_value(expires), now_db]
            + params
            + inner
            + eff_params
            + [limit]
        )
        with self.atomic(), self.hot_cursor() as cursor:
            cursor.execute(sql, params)
            found = cursor.fetchall()
            if not found and unless_gated:
                cursor.execute(f"SELECT {GATED}")
                if cursor.fetchone()[0]:
                    return None
            if found:
                rows.insert_events(connection, self._claimed_events(found, event), cursor=cursor)
        return found

    # The tenant walk and the fair seeks name their index, as the claim's level seeks do.
    FAIR_HINT = " INDEXED BY jq_ready_tenant"

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
        # As claim(): one UPDATE ... RETURNING inside the IMMEDIATE transaction. The
        # tenants as a VALUES list with their turn; per tenant and level a correlated seek
        # of jq_ready_tenant (``IS`` matches the keyless tenant's NULL and still seeks);
        # row_number() n per tenant gives the round, (n - 1) / weight; the first ``limit``
        # by (round, turn, n) lease.
        connection = self.connection
        now_db = connection.ops.adapt_datetimefield_value(now)
        cond, cond_params = "", []
        if queues:
            cond += f" AND k2.queue_name IN ({marks(queues)})"
            cond_params.extend(queues)
        if exclude_queues:
            cond += f" AND k2.queue_name NOT IN ({marks(exclude_queues)})"
            cond_params.extend(sorted(exclude_queues))
        eff, eff_params = _effective("k", now_db, aging_us)
        weights = list(weights or [1] * len(tenants))
        turns = ", ".join(["(%s, %s, %s)"] * len(tenants))
        turn_params = [v for turn, (key, w) in enumerate(zip(tenants, weights), 1) for v in (key, turn, w)]
        sql = f"""
    WITH RECURSIVE {_LEVELS},
    tenants(key, turn, weight) AS (VALUES {turns}),
    candidates AS (
        SELECT k.id, tenants.turn, tenants.weight,
               row_number() OVER (PARTITION BY tenants.turn ORDER BY {eff} DESC, k.run_at, k.created_at, k.id) AS n
        FROM tenants, levels
        JOIN {TABLE} k ON k.id IN (
            SELECT k2.id FROM {TABLE} k2{self.FAIR_HINT}
            WHERE k2.state = 'pending' AND k2.kind = %s AND k2.concurrency_key IS tenants.key
                  AND k2.priority = levels.p AND k2.run_at <= %s{cond}
            ORDER BY k2.run_at, k2.created_at, k2.id
            LIMIT %s
        )
        WHERE levels.p IS NOT NULL
    )
    UPDATE {TABLE} SET {SET}
    WHERE id IN (SELECT id FROM candidates ORDER BY (n - 1) / weight, turn, n LIMIT %s)
    RETURNING {rows.JOB_COLUMNS_BARE}
    """
        params = (
            turn_params
            + eff_params
            + [kind, now_db, *cond_params, self.fair_scan(limit, weights)]
            + [owner, connection.ops.adapt_datetimefield_value(expires), now_db]
            + [limit]
        )
        with self.atomic(), self.hot_cursor() as cursor:
            cursor.execute(sql, params)
            found = cursor.fetchall()
            if found:
                rows.insert_events(connection, self._claimed_events(found, event), cursor=cursor)
        return found

    def complete_plain(self, done, owner, at_db, event):
        # One UPDATE ... FROM for the whole batch (one per STATEMENT_BYTES of results): the
        # (id, attempt, result) triples ride in one JSON parameter (json_each), so the
        # statement text is the same at any batch size
        # and SQLite prepares it once; RETURNING tells which rows the fence let through (no
        # lock, no read first). A statement per distinct result, as it was, cost a worker
        # a sixth of its CPU when the results differ, as they usually do.
        connection = self.connection
        triples = [
            (job_id, attempt, rows.json_value(connection, result)) for job_id, attempt, result, _ in done
        ]
        held = set()
        with self.atomic(), self.hot_cursor() as cursor:
            for run in by_size(triples, lambda t: len(t[2] or "")):
                cursor.execute(_COMPLETE_FROM, [at_db, json.dumps(run), owner])
                held.update(cursor.fetchall())
            if held:
                rows.insert_events(connection, self._completed_events(done, held, event), cursor=cursor)
        return {job_id for job_id, _ in held}

    # SQLite plans from average selectivity: once ANALYZE has seen a table where most
    # rows share one state, the (state, kind) index looks useless to it and it scans
    # every job. Name the index, as the claim does for the level seeks.
    PER_KEY_HINT = " INDEXED BY jq_job_state_kind_queue"

    def wake_up(self):
        # SQLite has no NOTIFY, but ``PRAGMA data_version`` changes whenever another
        # connection commits to the file, and reading it touches no table (it costs
        # microseconds). So the supervisor's watch (worker/wakeup.py) reads it every
        # SQLITE_WAKE_INTERVAL and, when it moved, the events written since
        # (ready_events_since): enqueue-to-start latency is a few milliseconds instead of
        # half the poll interval, while an idle queue still costs no claim queries. Any
        # commit moves it (heartbeats, the workers' own claims); only an event that made
        # a job claimable wakes a child.
        interval = settings.SQLITE_WAKE_INTERVAL
        return WakeUp(interval=float(interval)) if interval else None

    def wake_version(self):
        # data_version is per connection: it moves for commits by *other* connections,
        # which is what an enqueue is. The worker's own claims do not wake it.
        with self.connection.cursor() as cursor:
            cursor.execute("PRAGMA data_version")
            return cursor.fetchone()[0]

    def commit_watch(self):
        # A commit in WAL mode appends to the -wal file, and Linux tells a watcher of the
        # file at once (inotify): the watch sleeps until then instead of looking at
        # data_version every few milliseconds and finding the news 2.5 ms late on average.
        # Any write wakes it (a checkpoint too); data_version says whether it was a
        # commit. Without WAL, or off Linux: None, and the watch looks every interval.
        name = self.connection.settings_dict["NAME"]
        wal = f"{name}-wal"
        if not os.path.exists(wal):
            return None
        try:
            return _WalWatch(wal)
        except OSError:
            return None


class _WalWatch:
    """inotify on the -wal file: wait() returns when it is written, or after ``timeout``."""

    IN_MODIFY = 0x2

    def __init__(self, path):
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        if libc.inotify_add_watch(self.fd, os.fsencode(path), self.IN_MODIFY) < 0:
            os.close(self.fd)
            raise OSError(ctypes.get_errno(), "inotify_add_watch")

    def wait(self, timeout):
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if ready:
            try:
                while os.read(self.fd, 4096):
                    pass
            except BlockingIOError:
                pass
        return bool(ready)

    def close(self):
        os.close(self.fd)
