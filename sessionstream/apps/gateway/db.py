"""PostgreSQL for the gateway: a small pool of synchronous connections used from threads,
so the gateway reads with the same queries as the CLI (`sessionstream.runtimes.sink.replay`,
`keys`)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from sessionstream.errors import DatabaseUnavailable
from sessionstream.settings import Settings, redact_conninfo

__all__ = ["Database"]

T = TypeVar("T")


class Database:
    """`await db.run(fn, *args)` calls `fn(conn, *args)` in a worker thread with a pooled
    connection (search path = the settings' schema); errors become `DatabaseUnavailable`.
    The threads are its own, one per connection: on asyncio's shared default executor (6
    threads on 2 cores) a few slow SSE catch-ups held every one of them, and every key
    check and query waited behind them."""

    def __init__(self, settings: Settings, *, max_size: int = 8) -> None:
        schema = settings.database_schema
        kwargs: dict[str, Any] = {"connect_timeout": 5}
        if schema:
            kwargs["options"] = f"-c search_path={schema}"
        self._url = redact_conninfo(settings.database_conninfo)
        self.pool = ConnectionPool(
            settings.database_conninfo,
            min_size=1,
            max_size=max_size,
            kwargs=kwargs,
            open=False,
            timeout=10,
        )
        self._threads = ThreadPoolExecutor(max_size, thread_name_prefix="gateway-db")

    def open(self) -> None:
        self.pool.open(wait=False)

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
        self.pool.close()

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            with self.pool.connection() as conn:
                return fn(conn, *args)
        except (psycopg.OperationalError, PoolTimeout) as e:
            raise DatabaseUnavailable(str(e).strip(), url=self._url) from e

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, functools.partial(self._call, fn, *args))
