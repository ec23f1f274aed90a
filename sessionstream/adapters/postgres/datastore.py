"""How every process reaches PostgreSQL: one connection, a pool of them (threads or
asyncio), the schema on the search path, a bounded connect, and the driver's errors
translated once: into `DatabaseUnavailable` (no database to talk to) or `QueryFailed`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from sessionstream.errors import DatabaseError, DatabaseUnavailable, QueryFailed
from sessionstream.settings import Settings, redact_conninfo

__all__ = [
    "Reconnecting",
    "async_pool",
    "connect",
    "connect_kwargs",
    "failure",
    "pool",
    "translated",
]

#: how long a connection attempt may take before the database counts as unavailable
CONNECT_TIMEOUT_S = 5


def connect_kwargs(schema: str | None, *, timeout_s: int = CONNECT_TIMEOUT_S) -> dict[str, Any]:
    """psycopg's connect arguments: `schema` first on the search path, a bounded connect."""
    kwargs: dict[str, Any] = {"connect_timeout": timeout_s}
    if schema:
        kwargs["options"] = f"-c search_path={schema}"
    return kwargs


#: sqlstates with which the server ends a connection or will not take one: class 08
#: (connection exception) and 57P01..57P05 (shut down, crashed, starting up, database
#: dropped, idle too long). Other operational sqlstates (57014 a statement timeout or
#: cancel, 40P01 a deadlock, 55P03 a lock not available) are a statement's failure.
_CONNECTION_SQLSTATES = ("08", "57P")


def failure(error: psycopg.Error, conninfo: str) -> DatabaseError:
    """The driver's error as sessionstream's: `DatabaseUnavailable` when there is no
    database to talk to (a pool with no connection to give, a connection refused, broken or
    closed: the driver's OperationalError without a server sqlstate, or one of
    `_CONNECTION_SQLSTATES`), naming `conninfo`'s database without its password;
    `QueryFailed` with the sqlstate for every other error (the server refused the
    statement, or the driver did before sending it)."""
    reason = str(error).strip()
    if isinstance(error, psycopg.OperationalError) and (
        error.sqlstate is None or error.sqlstate.startswith(_CONNECTION_SQLSTATES)
    ):
        return DatabaseUnavailable(reason, url=redact_conninfo(conninfo))
    return QueryFailed(reason, sqlstate=error.sqlstate)


@contextmanager
def translated(conninfo: str, *, queries: bool = False) -> Iterator[None]:
    """Around calls into psycopg (a plain `with` works around `await` too).

    With `queries`, every driver error leaves as `failure` translates it, so a caller
    handles `DatabaseUnavailable`, `QueryFailed` or both (`DatabaseError`) and never
    imports the driver. Without it (around connecting, and for callers that let SQL errors
    go up as they are: `migrate`, the gateway's pool) every OperationalError, whatever the
    server said, is `DatabaseUnavailable`, as `PoolTimeout` is, and the other errors pass
    through untranslated."""
    try:
        yield
    except psycopg.Error as e:
        if queries:
            raise failure(e, conninfo) from e
        if isinstance(e, (psycopg.OperationalError, PoolTimeout)):
            raise DatabaseUnavailable(str(e).strip(), url=redact_conninfo(conninfo)) from e
        raise


def connect(
    settings: Settings,
    schema: str | None = None,
    *,
    autocommit: bool = False,
    timeout_s: int = CONNECT_TIMEOUT_S,
) -> psycopg.Connection[tuple[object, ...]]:
    """A connection to the settings' database, `schema` (default: the settings' schema)
    first on its search path."""
    conninfo = settings.database_conninfo
    kwargs = connect_kwargs(schema or settings.database_schema, timeout_s=timeout_s)
    with translated(conninfo):
        return psycopg.connect(conninfo, autocommit=autocommit, **kwargs)


def pool(
    settings: Settings, *, max_size: int, min_size: int = 1, timeout_s: float = 10
) -> ConnectionPool:
    """A pool of connections for threads (not opened: `open()` it), with the settings'
    schema on the search path; a caller waits at most `timeout_s` for a connection."""
    return ConnectionPool(
        settings.database_conninfo,
        min_size=min_size,
        max_size=max_size,
        kwargs=connect_kwargs(settings.database_schema),
        open=False,
        timeout=timeout_s,
    )


async def async_pool(
    conninfo: str, schema: str | None, *, max_size: int, open_timeout_s: float = 15
) -> AsyncConnectionPool:
    """An opened asyncio pool; a connection a database restart broke is replaced before it
    is handed out. An unreachable database is `DatabaseUnavailable`."""
    opened = AsyncConnectionPool(
        conninfo,
        min_size=1,
        max_size=max_size,
        open=False,
        kwargs=connect_kwargs(schema),
        check=AsyncConnectionPool.check_connection,
    )
    try:
        await opened.open(wait=True, timeout=open_timeout_s)
    except (psycopg.Error, PoolTimeout) as e:
        raise DatabaseUnavailable(str(e).strip(), url=redact_conninfo(conninfo)) from e
    return opened


T = TypeVar("T")


class Reconnecting:
    """One connection that is made again when the database is lost: `run(what, fn)` calls
    `fn(conn)`, and a lost database (refused, broken, restarted: the driver's connection
    errors and `DatabaseUnavailable`) is retried with exponential back-off until it
    answers, or until `stop` is set (the last error is raised then). SQL errors are not
    retried. `on_retry(what, reason, delay_s)` hears of each retry."""

    def __init__(
        self,
        settings: Settings,
        schema: str | None = None,
        *,
        max_backoff_s: float = 10.0,
        on_retry: Callable[[str, str, float], None] | None = None,
    ) -> None:
        self.settings, self.schema = settings, schema
        self.max_backoff_s = max_backoff_s
        self._on_retry = on_retry
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None

    def connection(self) -> psycopg.Connection[tuple[object, ...]]:
        """The open connection, made now if there is none."""
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.settings, self.schema)
        return self._conn

    def run(
        self,
        what: str,
        fn: Callable[[psycopg.Connection[tuple[object, ...]]], T],
        stop: threading.Event | None = None,
    ) -> T:
        delay = 0.2
        while True:
            try:
                return fn(self.connection())
            except (psycopg.OperationalError, DatabaseUnavailable) as e:
                if self._on_retry is not None:
                    self._on_retry(what, str(e).strip().splitlines()[0], delay)
                self.close()
                if stop is not None and stop.wait(delay):
                    raise
                if stop is None:
                    time.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
