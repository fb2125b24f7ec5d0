"""MariaDB's engine (Django's "mysql" backend): short READ COMMITTED transactions (the
project's setting), row locks with FOR UPDATE [SKIP LOCKED], and no UPDATE ... RETURNING,
so a write locks what it may change, changes it by primary key, and knows the rows from
the lock; the supervisor watches the newest event id."""

from datetime import timedelta

from django.utils import timezone

from queue_app.conf import settings
from queue_app.engines import leasing, rows
from queue_app.engines.base import COMPLETED_SET, GATED, NO_FOLLOW_UP, Engine, Fence, WakeUp, by_size
from queue_app.engines.leasing import (
    ATTEMPTS,
    CREATED,
    EXPIRES,
    ID,
    OWNER,
    PRIORITY,
    RUN_AT,
    SET,
    STARTED,
    STATE,
    TABLE,
    excluding,
    marks,
)
from queue_app.models import State

_US = timedelta(microseconds=1)


class MariadbEngine(Engine):
    vendor = "mysql"

    # --- enqueue ---------------------------------------------------------------------

    def insert_jobs(self, givens, payload_texts, events, now, *, savepoint=True):
        if not self.lone_insert(givens):
            return super().insert_jobs(givens, payload_texts, events, now, savepoint=savepoint)
        return self._insert_one(givens[0], payload_texts[0], events[0])

    def _insert_one(self, given, payload_text, event):
        """A single enqueue outside any transaction (a view's): START TRANSACTION, the job
        row, its event and COMMIT on the driver's connection: four round trips, where
        Django's atomic() makes five (the driver switches autocommit off before and back
        on after, a statement each, for this one START TRANSACTION). As on SQLite (engines/sqlite.py), errors are Django's, a failure
        rolls back before it propagates, and logged or wrapped queries go through Django."""
        connection = self.connection
        writer = rows.JobWriter.on(connection)
        (values,), (params,) = writer.rows([given], {"payload": [payload_text]}, {})
        insert_job, insert_event = self.lone_inserts
        db = connection.connection
        with connection.wrap_database_errors, db.cursor() as cursor:
            cursor.execute("START TRANSACTION")
            try:
                cursor.execute(insert_job, params)
                job_id = cursor.lastrowid
                cursor.execute(insert_event, [job_id, *event])
                db.commit()
            except BaseException:
                db.rollback()
                raise
        return writer.jobs([job_id], [values])

    def plan(self, sql, params):
        # One line per table read: its access type (ALL: all of it) and the index (key) used.
        with self.connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN {sql}", params)
            names = [c[0] for c in cursor.description]
            rows_ = [dict(zip(names, row)) for row in cursor.fetchall()]
        return "\n".join(f"{r.get('table')} {r.get('type')} key={r.get('key')}" for r in rows_)

    def estimated_rows(self, table):
        # InnoDB's estimate from its statistics, as the optimizer reads it.
        with self.connection.cursor() as cursor:
            cursor.execute(
                "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()"
                " AND TABLE_NAME = %s",
                [table],
            )
            row = cursor.fetchone()
        return int(row[0] or 0) if row else 0

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
        # The priority levels first, on their own: with none (an idle queue) or a gate
        # (unless_gated, read by the same statement) the claim ends there, one round
        # trip, without the three of a transaction (autocommit off, COMMIT, on again).
        # Reading them before the transaction changes nothing: under READ COMMITTED
        # each statement inside it would read afresh anyway. Then a short transaction:
        # one UNION of per-level seeks, the candidates ordered in Python (ordering.py's
        # key), SELECT ... FOR UPDATE SKIP LOCKED on only the best ``limit`` ids (topped
        # up from the next ones when some were taken) and an UPDATE by primary key.
        levels = self._levels(unless_gated)
        if levels is None:
            return None
        if not levels:
            return []
        with self.atomic():
            found = self._claim(
                levels,
                owner,
                limit,
                now,
                expires,
                queues,
                kinds,
                aging_us,
                exclude_queues,
                exclude_kinds,
                exclude_keys,
            )
            if found:
                rows.insert_events(self.connection, self._claimed_events(found, event))
        return found

    def _levels(self, unless_gated):
        """The priority levels that have pending jobs, highest first; None if gated."""
        # MariaDB plans DISTINCT here as a scan of every pending row, and a recursive CTE
        # re-runs its subquery unoptimised; a MAX() bounded on the index prefix is a single
        # seek ("Select tables optimized away"), so walk the levels down by such seeks, two
        # a statement (the second bounded by the first through a one-row derived table).
        top = f"SELECT MAX(priority) AS p FROM {TABLE} WHERE state = 'pending'"
        below = f"(SELECT MAX(k.priority) FROM {TABLE} k WHERE k.state = 'pending' AND k.priority < t.p)"
        levels = []
        with self.connection.cursor() as cursor:
            while True:
                if levels:
                    cursor.execute(f"SELECT t.p, {below} FROM ({top} AND priority < %s) t", [levels[-1]])
                else:
                    gate = f", {GATED}" if unless_gated else ""
                    cursor.execute(f"SELECT t.p, {below}{gate} FROM ({top}) t")
                first, second, *gated = cursor.fetchone()
                if gated and gated[0]:
                    return None
                levels += [p for p in (first, second) if p is not None]
                if second is None:
                    return levels

    def _claim(
        self,
        levels,
        owner,
        limit,
        now,
        expires,
        queues,
        kinds,
        aging_us,
        exclude_queues,
        exclude_kinds,
        exclude_keys,
    ):
        connection = self.connection
        excl = leasing.excluded(exclude_queues, exclude_kinds, exclude_keys)
        scan = leasing.scan(limit)
        now_db = connection.ops.adapt_datetimefield_value(now)
        with connection.cursor() as cursor:
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
                    for column, names in zip(leasing.EXCLUDED, excl):
                        if names:
                            cond += f" AND {excluding(column, f'{column} NOT IN ({marks(names)})')}"
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
            found = self._lock_best(cursor, ranked, limit, now_db)
            found.sort(key=lambda r: key((r[ID], r[PRIORITY], r[RUN_AT], r[CREATED])))
            self._lease(cursor, found, owner, expires, now, now_db)
            return found

    def _lock_best(self, cursor, ranked, limit, now_db):
        """Lock the first ``limit`` of the ``ranked`` ids still ready, FOR UPDATE SKIP LOCKED,
        topped up from the next ones; return their rows (JOB_COLUMNS) as lists."""
        found = []
        while ranked and len(found) < limit:
            want, ranked = ranked[: limit - len(found)], ranked[limit - len(found) :]
            cursor.execute(
                f"SELECT {rows.JOB_COLUMNS_BARE} FROM {TABLE} WHERE id IN ({marks(want)})"
                " AND state = 'pending' AND run_at <= %s FOR UPDATE SKIP LOCKED",
                want + [now_db],
            )
            found.extend(list(row) for row in cursor.fetchall())
        return found

    def _lease(self, cursor, found, owner, expires, now, now_db):
        """Lease the locked rows ``found`` by primary key, and write into them what SET
        wrote: no UPDATE ... RETURNING on MariaDB, so the rows are the ones read under the
        lock, in the driver's form (naive UTC datetimes)."""
        if not found:
            return
        connection = self.connection
        cursor.execute(
            f"UPDATE {TABLE} SET {SET} WHERE id IN ({marks(found)})",
            [owner, connection.ops.adapt_datetimefield_value(expires), now_db] + [row[ID] for row in found],
        )
        naive_now = timezone.make_naive(now, connection.timezone)
        naive_expires = timezone.make_naive(expires, connection.timezone)
        for row in found:
            row[STATE] = State.LEASED.value
            row[OWNER] = owner
            row[EXPIRES] = naive_expires
            row[ATTEMPTS] += 1
            if row[STARTED] is None:
                row[STARTED] = naive_now

    def fair_keys(self, kind, n, after=None, upto=None):
        # A MIN() bounded on jq_ready_tenant's prefix is one seek ("Select tables optimized
        # away"); a recursive CTE would re-run its subquery unoptimised (see _levels).
        bound, bound_params = ("", []) if upto is None else (" AND concurrency_key <= %s", [upto])
        found = []
        with self.connection.cursor() as cursor:
            while len(found) < n:
                prev = found[-1] if found else after
                cursor.execute(
                    f"SELECT MIN(concurrency_key) FROM {TABLE} WHERE state = 'pending' AND kind = %s"
                    f" AND concurrency_key > %s{bound}",
                    [kind, "" if prev is None else prev, *bound_params],
                )
                key = cursor.fetchone()[0]
                if key is None:
                    break
                found.append(key)
        return found

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
        # As claim(): the levels first, then a short transaction. One UNION of seeks of
        # jq_ready_tenant, per tenant and level, each row tagged with its tenant's turn;
        # the candidates numbered per tenant in lease order (ordering.py's key) in Python,
        # ordered by (round, turn, number), the round being number // weight, and the first ``limit`` locked FOR UPDATE SKIP LOCKED
        # (topped up from the next ones) and leased by primary key.
        levels = self._levels(False)
        if not levels:
            return []
        connection = self.connection
        now_db = connection.ops.adapt_datetimefield_value(now)
        naive_now = timezone.make_naive(now, connection.timezone)
        weights = list(weights or [1] * len(tenants))
        scan = self.fair_scan(limit, weights)
        cond, cond_params = "", []
        if queues:
            cond += f" AND queue_name IN ({marks(queues)})"
            cond_params.extend(queues)
        if exclude_queues:
            cond += f" AND queue_name NOT IN ({marks(exclude_queues)})"
            cond_params.extend(sorted(exclude_queues))
        parts, params = [], []
        for turn, key in enumerate(tenants):
            tenant = "concurrency_key IS NULL" if key is None else "concurrency_key = %s"
            for level in levels:
                parts.append(
                    f"(SELECT %s, id, priority, run_at, created_at FROM {TABLE}"
                    f" WHERE state = 'pending' AND kind = %s AND {tenant} AND priority = %s"
                    f" AND run_at <= %s{cond} ORDER BY run_at, created_at, id LIMIT %s)"
                )
                params += [turn, kind, *([] if key is None else [key]), level, now_db, *cond_params, scan]

        def key(row):
            job_id, priority, run_at, created_at = row
            eff = priority + ((naive_now - run_at) // _US) // aging_us if aging_us else priority
            return (-eff, run_at, created_at, job_id)

        with self.atomic(), connection.cursor() as cursor:
            cursor.execute(" UNION ALL ".join(parts), params)
            per_tenant = {}
            for turn, *row in cursor.fetchall():
                per_tenant.setdefault(turn, []).append(row)
            ranked = sorted(
                (n // weights[turn], turn, n, row[0])
                for turn, candidates in per_tenant.items()
                for n, row in enumerate(sorted(candidates, key=key))
            )
            ranked = [job_id for *_, job_id in ranked]
            found = self._lock_best(cursor, ranked, limit, now_db)
            self._lease(cursor, found, owner, expires, now, now_db)
            if found:
                rows.insert_events(connection, self._claimed_events(found, event))
        return found

    def complete_plain(self, done, owner, at_db, event):
        connection = self.connection
        with self.atomic(), connection.cursor() as cursor:
            # No UPDATE ... RETURNING on MariaDB: lock what we hold, then write by id.
            fence, fence_params = Fence(owner, [(d[0], d[1]) for d in done]).sql(also=NO_FOLLOW_UP)
            cursor.execute(
                f"SELECT id, attempts FROM {rows.JOB_TABLE} WHERE {fence} FOR UPDATE", fence_params
            )
            held = set(cursor.fetchall())
            # One UPDATE for the batch (or for each STATEMENT_BYTES of results), each row's
            # result picked by a CASE on its id: a statement per distinct result cost a
            # round trip per job when results differ. By the (id, attempt) the fence let
            # through: an older attempt of a job claimed again must not give its result.
            mine = [(d[0], rows.json_value(connection, d[2])) for d in done if (d[0], d[1]) in held]
            for run in by_size(mine, lambda pair: len(pair[1] or "")):
                cases = " ".join(["WHEN %s THEN %s"] * len(run))
                marks = ", ".join(["%s"] * len(run))
                cursor.execute(
                    f"UPDATE {rows.JOB_TABLE} SET {COMPLETED_SET.replace('result = %s', f'result = CASE id {cases} END')}"
                    f" WHERE id IN ({marks})",
                    [at_db, *(v for pair in run for v in pair), *(job_id for job_id, _ in run)],
                )
            if held:
                rows.insert_events(connection, self._completed_events(done, held, event))
        return {job_id for job_id, _ in held}

    def deadlocked(self, exc):
        # ER_LOCK_DEADLOCK: InnoDB rolled the whole transaction back. Concurrent inserts
        # of one unique key can meet this way (each waits on the others' shared locks).
        return bool(exc.args) and exc.args[0] == 1213

    def wake_up(self):
        # MariaDB has neither NOTIFY nor a data version, so the supervisor's watch reads
        # the newest event id every MARIADB_WAKE_INTERVAL (wake_version) and, when it
        # moved, whether one of the new events made a job claimable (ready_events_since).
        interval = settings.MARIADB_WAKE_INTERVAL
        return WakeUp(interval=float(interval)) if interval else None

    def wake_version(self):
        # Every edge that makes a job ready (enqueue, requeue, retry now, lease recovery)
        # appends an event in the same transaction, so the id moves on commit, and MAX() of
        # the primary key is a single index read ("Select tables optimized away"). Ids are
        # handed out at insert, not at commit, so an enqueue that commits after a later
        # insert moved MAX() already, or between the empty claim and the first look, is
        # found by the ordinary poll instead: the poll interval stays the worst case. So is
        # a job whose retry or schedule comes due later.
        with self.connection.cursor() as cursor:
            cursor.execute(f"SELECT MAX(id) FROM {rows.EVENT_TABLE}")
            return cursor.fetchone()[0]
