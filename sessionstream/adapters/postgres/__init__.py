"""PostgreSQL: the one datastore every process connects through, and the schema's
migrations (shared by the sink, the workers and the gateway).

`connect` / `pool` / `async_pool` put the configured schema on the search path and bound
the connect time; the driver's errors are translated here, once (`translated`, `failure`):
no database to talk to is `DatabaseUnavailable` (naming the database without its
password), a failed statement `QueryFailed`."""

from sessionstream.adapters.postgres.datastore import (
    Reconnecting,
    async_pool,
    connect,
    connect_kwargs,
    failure,
    pool,
    translated,
)

__all__ = [
    "Reconnecting",
    "async_pool",
    "connect",
    "connect_kwargs",
    "failure",
    "pool",
    "translated",
]
