"""PostgreSQL for the gateway: a small pool of synchronous connections used from threads,
so the gateway reads with the same queries as the CLI (`sessionstream.runtimes.sink.replay`,
`keys`)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sessionstream.adapters.postgres import pool, translated
from sessionstream.settings import Settings

__all__ = ["Database"]

T = TypeVar("T")


class Database:
    """`await db.run(fn, *args)` calls `fn(conn, *args)` in a worker thread with a pooled
    connection (search path = the settings' schema); errors become `DatabaseUnavailable`.
    The threads are its own, one per connection: on asyncio's shared default executor (6
    threads on 2 cores) a few slow SSE catch-ups held every one of them, and every key
    check and query waited behind them."""

    def __init__(self, settings: Settings, *, max_size: int = 8) -> None:
        self._conninfo = settings.database_conninfo
        self.pool = pool(settings, max_size=max_size)
        self._threads = ThreadPoolExecutor(max_size, thread_name_prefix="gateway-db")

    def open(self) -> None:
        self.pool.open(wait=False)

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
        self.pool.close()

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        with translated(self._conninfo), self.pool.connection() as conn:
            return fn(conn, *args)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, functools.partial(self._call, fn, *args))
