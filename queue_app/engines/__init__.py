"""The only home of SQL text and of ``connection.vendor``: base.py states the contract,
sqlite.py, postgresql.py and mysql.py implement it; of() picks one."""

from queue_app.engines.mysql import MariadbEngine
from queue_app.engines.postgresql import PostgresEngine
from queue_app.engines.sqlite import SqliteEngine

ENGINES = {engine.vendor: engine for engine in (SqliteEngine, PostgresEngine, MariadbEngine)}


def of(connection):
    """Return the engine for ``connection``, built on first use and kept on it."""
    engine = getattr(connection, "_jq_engine", None)
    if engine is None:
        try:
            cls = ENGINES[connection.vendor]
        except KeyError:
            raise NotImplementedError(f"jobqueue does not support the {connection.vendor} database") from None
        engine = connection._jq_engine = cls(connection)
    return engine
