"""The schema SQL that Django's migration operations cannot say, one function per migration.

A migration runs the code it imports as it is at the time it runs, so these functions are
frozen: a later schema change gets a new function and a new migration, never an edit here
(as Oban keeps one module per migration version in its engines).
"""

# 0002: the claim query's indexes (see leasing.py for the query they serve). PostgreSQL and
# SQLite get partial indexes over pending (and leased) rows only, so completed history costs
# them nothing. MariaDB has no partial indexes: the same columns lead with ``state`` instead.
CLAIM_INDEXES_PARTIAL = [
    ("jq_ready_prio", "(priority, run_at, created_at, id) WHERE state = 'pending'"),
    ("jq_ready_queue", "(queue_name, priority, run_at, created_at, id) WHERE state = 'pending'"),
    ("jq_lease_expiry", "(lease_expires_at) WHERE state = 'leased'"),
]
CLAIM_INDEXES_PREFIXED = [
    ("jq_ready_prio", "(state, priority, run_at, created_at, id)"),
    ("jq_ready_queue", "(state, queue_name, priority, run_at, created_at, id)"),
    ("jq_lease_expiry", "(state, lease_expires_at)"),
]


def create_claim_indexes_0002(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    for name, cols in CLAIM_INDEXES_PREFIXED if vendor == "mysql" else CLAIM_INDEXES_PARTIAL:
        schema_editor.execute(f"CREATE INDEX {name} ON queue_app_job {cols}")


def drop_claim_indexes_0002(apps, schema_editor):
    # IF EXISTS: unapplying the later migrations rebuilds the table on SQLite, which keeps
    # only the indexes Django knows of, so by now these may be gone.
    vendor = schema_editor.connection.vendor
    for name, _ in CLAIM_INDEXES_PARTIAL:
        if vendor == "mysql":
            schema_editor.execute(f"DROP INDEX IF EXISTS {name} ON queue_app_job")
        else:
            schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


# 0010: idempotency and concurrency keys are exact strings on every database. MariaDB
# compares strings by the column's collation, utf8mb4_general_ci here: "Key", "key" and
# "key " are one value to it, while PostgreSQL and SQLite tell them apart.
# utf8mb4_nopad_bin compares the bytes, trailing spaces included (utf8mb4_bin still pads).
EXACT_KEY_COLUMNS = ("idempotency_key", "concurrency_key")


def collate_keys_0010(collation):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor != "mysql":
            return
        changes = ", ".join(
            f"MODIFY {column} varchar(255) COLLATE {collation} NULL" for column in EXACT_KEY_COLUMNS
        )
        schema_editor.execute(f"ALTER TABLE queue_app_job {changes}")

    return run


# 0019: debounce and unique keys are exact strings too (their lock row's primary key).
def collate_admission_keys_0019(collation):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor != "mysql":
            return
        schema_editor.execute(
            f"ALTER TABLE queue_app_admissionkey MODIFY id varchar(255) COLLATE {collation} NOT NULL"
        )

    return run


# 0020: on SQLite, changing the state check constraint (the new ``waiting`` state) rebuilds
# the job table, which keeps only the indexes Django knows of: the claim indexes of 0002
# are made again, as they were.
def recreate_claim_indexes_0020(apps, schema_editor):
    if schema_editor.connection.vendor != "sqlite":
        return
    for name, cols in CLAIM_INDEXES_PARTIAL:
        schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON queue_app_job {cols}")


# 0025: the fair claim's index (flow.py, Fair share): per kind and tenant, its ready jobs
# by priority level, oldest first, so both the walk over a kind's tenants and each
# tenant's per-level seek are index seeks. Partial where the database has them, led by
# ``state`` on MariaDB, as in 0002. Like 0002's, a later SQLite table rebuild must make
# it again (Django knows only the indexes in Meta).
FAIR_INDEX_PARTIAL = (
    "jq_ready_tenant",
    "(kind, concurrency_key, priority, run_at, created_at, id) WHERE state = 'pending'",
)
FAIR_INDEX_PREFIXED = ("jq_ready_tenant", "(state, kind, concurrency_key, priority, run_at, created_at, id)")


def create_fair_index_0025(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    name, cols = FAIR_INDEX_PREFIXED if vendor == "mysql" else FAIR_INDEX_PARTIAL
    schema_editor.execute(f"CREATE INDEX {name} ON queue_app_job {cols}")


def drop_fair_index_0025(apps, schema_editor):
    name = FAIR_INDEX_PARTIAL[0]
    if schema_editor.connection.vendor == "mysql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {name} ON queue_app_job")
    else:
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


# 0029: PostgreSQL writes a new entry into every index of a row on each update that
# changes an indexed column (state does, on every transition), NULLs included. Most jobs
# have no parent, group or idempotency key, so the plain indexes on those columns took
# three entries per job per transition that no lookup ever reads (a claim of 10 touched
# some 290 buffers, a third of them those). Partial over the non-NULL values, with the
# same names and definitions otherwise: every lookup by a value still uses them (an
# equality or LIKE implies NOT NULL). The unique constraint on idempotency_key stays one
# (a partial unique index is not a constraint Django could alter later). SQLite and
# MariaDB touch only the indexes whose columns changed.
NOT_NULL_INDEXED = ("group_id", "parent_id", "idempotency_key")


def _single_column_indexes(cursor, column, where, params=()):
    """PostgreSQL: (name, definition) of the job table's indexes on ``column`` alone that
    match ``where`` (SQL over pg_index i, with ``params``)."""
    cursor.execute(
        "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i"
        " JOIN pg_class c ON c.oid = i.indexrelid"
        " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]"
        " WHERE i.indrelid = 'queue_app_job'::regclass AND i.indnatts = 1 AND a.attname = %s"
        f" AND {where}",
        [column, *params],
    )
    return cursor.fetchall()


# Plain (no WHERE) and backing no constraint; and the partial ones 0029 made.
_PLAIN = "i.indpred IS NULL AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid)"
_PARTIAL = "pg_get_expr(i.indpred, i.indrelid) = %s"


def partial_not_null_indexes_0029(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for column in NOT_NULL_INDEXED:
            for name, definition in _single_column_indexes(cursor, column, _PLAIN):
                schema_editor.execute(f'DROP INDEX "{name}"')
                schema_editor.execute(f"{definition} WHERE {column} IS NOT NULL")


def full_indexes_0029(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for column in NOT_NULL_INDEXED:
            for name, definition in _single_column_indexes(
                cursor, column, _PARTIAL, [f"({column} IS NOT NULL)"]
            ):
                schema_editor.execute(f'DROP INDEX "{name}"')
                schema_editor.execute(definition.split(" WHERE ")[0])
