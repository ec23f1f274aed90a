"""PostgreSQL: the one datastore every process connects through, and the schema's
migrations (shared by the sink, the workers and the gateway).

`connect` / `pool` / `async_pool` put the configured schema on the search path and bound
the connect time; the driver's connection errors become `DatabaseUnavailable` here, once,
naming the database without its password (`translated`)."""

from sessionstream.adapters.postgres.datastore import (
    Reconnecting,
    async_pool,
    connect,
    connect_kwargs,
    pool,
    translated,
)

__all__ = ["Reconnecting", "async_pool", "connect", "connect_kwargs", "pool", "translated"]
