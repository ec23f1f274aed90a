"""One lookup per key in flight: callers that ask while it runs wait for the same result.

Under load an expiring cache entry is found missing by hundreds of requests at once; each
sending its own PostgreSQL query was most of the gateway's time at 500 requests/s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["SingleFlight"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SingleFlight(Generic[K, V]):
    def __init__(self) -> None:
        self._inflight: dict[K, asyncio.Future[V]] = {}

    async def do(self, key: K, fn: Callable[[], Awaitable[V]]) -> V:
        """`await fn()`, or the result of the call for `key` already running."""
        pending = self._inflight.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            value = await fn()
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # retrieved: no "never retrieved" warning when nobody waits
            raise
        finally:
            del self._inflight[key]
        fut.set_result(value)
        return value
