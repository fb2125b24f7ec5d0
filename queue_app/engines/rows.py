"""Row building for the engines' multi-row SQL (claim, complete, enqueue): shared by
every vendor module; transitions.py decides what every row says.

Why raw SQL here. Building a model instance per Event and per Job and letting the ORM
adapt every field of every row cost about half of a batched drain (py-spy on
benchmarks/worker_throughput.py). These helpers adapt each column once per batch where the value
is shared (times, owner, constants), write all of a batch's events in one INSERT, and
read leased jobs back from the statement that changed them (RETURNING) instead of a
second SELECT.

Columns come from the models' ``_meta``, so a column another migration adds is still
read back and still inserted (with its field default).
"""

import json
from itertools import chain

from django.db.models.base import ModelState

from queue_app.models import Event, Job

JOB_TABLE = Job._meta.db_table
EVENT_TABLE = Event._meta.db_table
JOB_FIELDS = tuple(Job._meta.concrete_fields)
JOB_ATTNAMES = tuple(f.attname for f in JOB_FIELDS)
# Qualified for PostgreSQL's UPDATE ... FROM; bare for SQLite's RETURNING.
JOB_COLUMNS = ", ".join(f"{JOB_TABLE}.{f.column}" for f in JOB_FIELDS)
JOB_COLUMNS_BARE = ", ".join(f.column for f in JOB_FIELDS)

# The event columns a transition fills; any other column gets its field default.
EVENT_GIVEN = ("job_id", "type", "at", "attempt", "worker", "from_state", "to_state", "message", "metadata")
_EVENT_OTHER = tuple(
    f for f in Event._meta.concrete_fields if f.attname not in EVENT_GIVEN and not f.primary_key
)
EVENT_COLUMNS = ", ".join(
    [Event._meta.get_field(a).column for a in EVENT_GIVEN] + [f.column for f in _EVENT_OTHER]
)
EVENT_WIDTH = len(EVENT_GIVEN) + len(_EVENT_OTHER)
_METADATA = Event._meta.get_field("metadata")


def _default(field, connection):
    return field.get_db_prep_save(field.get_default(), connection)


def placeholders(width, count, connection=None):
    """``(%s, ..., %s), ...`` for ``count`` rows of ``width`` values.

    Given a SQLite connection, ``?`` marks: Django rewrites each ``%s`` of a SQLite query
    with a regex, a quarter of a bulk insert's time in the database wrapper. Not while
    queries are logged (DEBUG, CaptureQueriesContext): the log formats them with ``%``."""
    qmark = connection is not None and connection.vendor == "sqlite" and not connection.queries_logged
    mark = "?" if qmark else "%s"
    row = "(" + ", ".join([mark] * width) + ")"
    return ", ".join([row] * count)


def values_clause(connection, rows):
    """``VALUES`` rows and their parameters for a multi-row INSERT. On MySQL/MariaDB a
    column holding the same object in every row (None, a shared time, a constant) is
    written once as a literal in the statement: mysqlclient quotes each parameter in
    Python, half of a bulk enqueue's time when every column of every row was one."""
    width = len(rows[0])
    if connection.vendor != "mysql" or len(rows) < 2:
        return placeholders(width, len(rows), connection), list(chain.from_iterable(rows))
    first = rows[0]
    shared = [all(row[i] is first[i] for row in rows) for i in range(width)]
    db = connection.connection
    marks = [
        db.literal(first[i]).decode(db.encoding).replace("%", "%%") if shared[i] else "%s"
        for i in range(width)
    ]
    varying = [i for i in range(width) if not shared[i]]
    template = "(" + ", ".join(marks) + ")"
    params = [row[i] for row in rows for i in varying] if varying else []
    return ", ".join([template] * len(rows)), params


def json_value(connection, value):
    """Adapt a JSON document for a JSONField column (None stays SQL NULL)."""
    return _METADATA.get_db_prep_save(value, connection) if value is not None else None


def event_params(connection, job_id, type_, at_db, attempt, worker, from_state, to_state, message, metadata):
    """One event row's parameters, in EVENT_COLUMNS order; ``at_db`` already adapted."""
    # Plain str, not the TextChoices members: psycopg dumps an Enum inside a list by name.
    row = [
        job_id,
        str(type_),
        at_db,
        attempt,
        worker or "",
        str(from_state),
        str(to_state),
        message or "",
        _METADATA.get_db_prep_save(metadata or {}, connection),
    ]
    if _EVENT_OTHER:
        row.extend(_default(f, connection) for f in _EVENT_OTHER)
    return row


def event_select(params, computed):
    """An event row as a select list over a CTE's rows: ``computed`` maps positions in
    ``params`` (from event_params) to SQL; the rest stay parameters."""
    select = ", ".join(computed.get(i, "%s") for i in range(len(params)))
    return select, [p for i, p in enumerate(params) if i not in computed or "%s" in computed[i]]


def unnest_insert(connection, table, columns, fields, rows, returning=""):
    """PostgreSQL: INSERT many rows as one array per column (INSERT ... SELECT FROM
    unnest(...), as Django's own bulk_create does since 5.2): the statement has one
    placeholder per column however many rows, so the driver does not parse thousands."""
    casts = ", ".join(f"%s::{f.db_type(connection)}[]" for f in fields)
    cols = [list(col) for col in zip(*rows)]
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {table} ({columns}) SELECT * FROM unnest({casts}){returning}", cols)
        return cursor.fetchall() if returning else None


def reserve_ids(connection, table, count):
    """PostgreSQL: ``count`` new ids from ``table``'s id sequence, ascending."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)", [table, count]
        )
        return sorted(row[0] for row in cursor.fetchall())


def copy_insert(connection, table, columns, rows):
    """PostgreSQL: append rows with COPY. Unlike an INSERT of arrays, whose every value
    psycopg quotes in Python (client-side binding), COPY formats rows in its C core:
    three quarters of a bulk enqueue's time went to quoting."""
    with connection.cursor() as cursor, cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


def json_once(connection, value):
    """A JSON column's parameter for a value many rows share: encoded here once, not
    once per row by the driver (PostgreSQL); as json_value elsewhere."""
    if connection.vendor != "postgresql" or value is None:
        return json_value(connection, value)
    from psycopg.types.json import Jsonb

    return Jsonb(json.dumps(value, cls=_METADATA.encoder), dumps=str)


_EVENT_FIELDS = [Event._meta.get_field(a) for a in EVENT_GIVEN] + list(_EVENT_OTHER)


def insert_events(connection, rows, chunk=500, copy=False, cursor=None):
    """Append event rows (lists from event_params) with one INSERT per ``chunk`` rows
    (on PostgreSQL one INSERT, or with ``copy`` a COPY), on ``cursor`` if given."""
    if connection.vendor == "postgresql" and copy:
        copy_insert(connection, EVENT_TABLE, EVENT_COLUMNS, rows)
        return
    if connection.vendor == "postgresql" and len(rows) > 1:
        unnest_insert(connection, EVENT_TABLE, EVENT_COLUMNS, _EVENT_FIELDS, rows)
        return
    if cursor is None:
        with connection.cursor() as cursor:
            return insert_events(connection, rows, chunk, copy, cursor)
    for start in range(0, len(rows), chunk):
        sql, params = values_clause(connection, rows[start : start + chunk])
        cursor.execute(f"INSERT INTO {EVENT_TABLE} ({EVENT_COLUMNS}) VALUES {sql}", params)


def _per_connection(cls, connection):
    """The ``cls`` instance built once for ``connection`` (they depend on its vendor and ops)."""
    attr = f"_jq_{cls.__name__}"
    instance = getattr(connection, attr, None)
    if instance is None:
        instance = cls(connection)
        setattr(connection, attr, instance)
    return instance


def _memoised(convert, size=4096):
    """``convert`` (a backend's text-to-datetime converter) remembering its answers by
    text: a claimed batch's rows share their lease and start times, often their run_at
    and created_at, and parsing them was a fifth of reading the rows (SQLite). A datetime
    is immutable, so one may be shared."""
    memo = {}

    def converted(value, expression, connection):
        if value is None:
            return None
        hit = memo.get(value)
        if hit is None:
            if len(memo) >= size:
                memo.clear()
            hit = memo[value] = convert(value, expression, connection)
        return hit

    return converted


class JobReader:
    """Turn rows of JOB_COLUMNS into Job instances with the backend's converters
    (SQLite returns datetimes and JSON as text); built once per connection."""

    def __init__(self, connection):
        self.connection = connection
        self.converters = []
        self.always = []
        for i, field in enumerate(JOB_FIELDS):
            col = field.get_col(JOB_TABLE)
            convs = connection.ops.get_db_converters(col) + field.get_db_converters(connection)
            if convs == [getattr(connection.ops, "convert_datetimefield_value", None)]:
                convs = [_memoised(convs[0])]
            if not convs:
                continue
            if all(conv(None, col, connection) is None for conv in convs):
                # Most of a claimed row's columns are NULL (no result, error, follow-up
                # yet): where the converters keep None as None (checked here, once),
                # a NULL skips them.
                self.converters.append((i, col, convs))
            else:
                self.always.append((i, col, convs))

    @classmethod
    def on(cls, connection):
        return _per_connection(cls, connection)

    def jobs(self, rows):
        out = []
        db = self.connection.alias
        connection = self.connection
        # As JobWriter.jobs: built_job() while nothing listens to Job's init signals.
        fast = not _init_listened()
        for row in rows:
            values = list(row)
            for i, col, convs in self.converters:
                v = values[i]
                if v is not None:
                    for conv in convs:
                        v = conv(v, col, connection)
                    values[i] = v
            for i, col, convs in self.always:
                v = values[i]
                for conv in convs:
                    v = conv(v, col, connection)
                values[i] = v
            if fast:
                out.append(built_job(db, JOB_ATTNAMES, values))
            else:
                out.append(Job.from_db(db, JOB_ATTNAMES, values))
        return out


class JobWriter:
    """Build INSERT rows for new jobs from plain values; built once per connection.

    Only the columns a new job sets are adapted per row; every other column's default is
    adapted once here. The same values (not adapted) make the returned Job instances.
    """

    def __init__(self, connection):
        from django.db.models import DateTimeField, JSONField

        self.connection = connection
        fields = [f for f in JOB_FIELDS if not f.primary_key]
        self.columns = ", ".join(f.column for f in fields)
        self.fields = fields
        self.attnames = [f.attname for f in fields]
        self.width = len(fields)
        self.defaults = {f.attname: f.get_default() for f in fields}
        # A callable default (timezone.now, dict) is called per row, as the ORM would.
        # (NOT_PROVIDED, a class, is callable too: those defaults are constants.)
        self.fresh = {f.attname: f for f in fields if f.has_default() and callable(f.default)}
        self.preps = []
        for f in fields:
            if isinstance(f, DateTimeField):
                self.preps.append(connection.ops.adapt_datetimefield_value)
            elif isinstance(f, JSONField):
                self.preps.append(lambda v, f=f: f.get_db_prep_save(v, connection) if v is not None else None)
            else:
                self.preps.append(lambda v, f=f: f.get_db_prep_save(v, connection))
        # Plain Python values need no adapting for these (the drivers take them as is).
        plain = {
            "CharField",
            "TextField",
            "IntegerField",
            "SmallIntegerField",
            "BigIntegerField",
            "PositiveIntegerField",
            "PositiveBigIntegerField",
            "FloatField",
            "BooleanField",
            "ForeignKey",
        }
        self.plain = [f.get_internal_type() in plain for f in fields]
        # Every column's default as a value and as a parameter, adapted once here: a row
        # copies them and sets only what its job gives (a single enqueue adapted every column).
        self.default_values = [self.defaults[a] for a in self.attnames]
        self.default_params = self.params(self.default_values, {})
        self._shapes = {}

    @classmethod
    def on(cls, connection):
        return _per_connection(cls, connection)

    def values(self, given):
        """Python values in column order: ``given`` {attname: value}, defaults elsewhere."""
        return [
            given[a] if a in given else self.fresh[a].get_default() if a in self.fresh else self.defaults[a]
            for a in self.attnames
        ]

    def params(self, values, cache):
        """Adapt one row; ``cache`` maps id() of shared values (e.g. now) to their form."""
        out = []
        for value, prep, plain in zip(values, self.preps, self.plain):
            if plain or value is None:
                out.append(value)
                continue
            key = id(value)
            hit = cache.get(key)
            if hit is None or hit[0] is not value:
                hit = cache[key] = (value, prep(value))
            out.append(hit[1])
        return out

    def json_text(self, text):
        """A JSON column's parameter from JSON text already encoded (validation.payload_json)."""
        if self.connection.vendor == "postgresql":
            from psycopg.types.json import Jsonb

            return Jsonb(text, dumps=str)  # the text as is: no second encode
        return text

    def rows(self, givens, json_texts, cache, raw_json=False):
        """(values, params) per row for dicts of the same keys (transitions._given),
        filling defaults once per batch; ``json_texts`` {attname: [text per row]} gives
        JSON columns already encoded. Cheaper than values() and params() per row.
        ``raw_json`` leaves those texts as they are, for COPY, which takes JSON as text."""
        if not givens:
            return [], []
        fresh, plain, other = self._shape(tuple(givens[0]), tuple(json_texts))
        # Each row sets every column its dict gives: the rest keep the defaults.
        base_values, base_params = self.default_values, self.default_params
        texts = [(self.attnames.index(a), t) for a, t in json_texts.items()]
        all_values, all_params = [], []
        for n, given in enumerate(givens):
            values = base_values.copy()
            params = base_params.copy()
            for a, i in plain:
                params[i] = values[i] = given[a]
            for a, i, prep in other:
                value = values[i] = given[a]
                if value is None:
                    params[i] = None
                    continue
                hit = cache.get(id(value))
                if hit is None or hit[0] is not value:
                    hit = cache[id(value)] = (value, prep(value))
                params[i] = hit[1]
            for i, field in fresh:
                value = values[i] = field.get_default()
                params[i] = self.preps[i](value) if value is not None and not self.plain[i] else value
            for i, column in texts:
                values[i] = given[self.attnames[i]]
                params[i] = column[n] if raw_json else self.json_text(column[n])
            all_values.append(values)
            all_params.append(params)
        return all_values, all_params

    def _shape(self, keys, json_keys):
        """(fresh, plain, other) column lists for rows giving ``keys`` (rows()); the
        callers give few shapes, each kept once worked out."""
        shape = self._shapes.get((keys, json_keys))
        if shape is None:
            index = {a: i for i, a in enumerate(self.attnames)}
            fresh = [(index[a], f) for a, f in self.fresh.items() if a not in keys]
            plain = [(a, index[a]) for a in keys if self.plain[index[a]] and a not in json_keys]
            other = [
                (a, index[a], self.preps[index[a]])
                for a in keys
                if not self.plain[index[a]] and a not in json_keys
            ]
            shape = self._shapes[(keys, json_keys)] = (fresh, plain, other)
        return shape

    def jobs(self, ids, rows):
        if _init_listened():
            return [
                Job.from_db(self.connection.alias, ("id", *self.attnames), [i, *v]) for i, v in zip(ids, rows)
            ]
        db = self.connection.alias
        return [built_job(db, self.attnames, v, id=i) for i, v in zip(ids, rows)]


def built_job(db, attnames, values, **more):
    """A Job as Model.from_db builds it from a row of ``db``, without Model.__init__'s
    per-field work (a tenth of what a worker spends on a no-op job, a third of a bulk
    enqueue). Only while nothing listens to Job's init signals (_init_listened)."""
    job = Job.__new__(Job)
    state = job.__dict__["_state"] = ModelState()
    state.adding = False
    state.db = db
    job.__dict__.update(zip(attnames, values))
    job.__dict__.update(more)
    return job


def _init_listened():
    from django.db.models.signals import post_init, pre_init

    return pre_init.has_listeners(Job) or post_init.has_listeners(Job)
