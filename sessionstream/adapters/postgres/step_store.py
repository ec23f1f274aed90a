"""Step results over the log's inline bound, in PostgreSQL (`step_results`, migration
0009): the `StepStore` a worker uses by default when it has a database. `put` returns a
pointer `pg:{idempotency id}#{digest}`; `get` reads it back. Connection errors are
`DatabaseUnavailable`; a failed statement, and a pointer with no row, `QueryFailed`."""

from __future__ import annotations

import hashlib

from psycopg_pool import AsyncConnectionPool

from sessionstream.adapters.postgres.datastore import async_pool, translated
from sessionstream.errors import QueryFailed

__all__ = ["POINTER_PREFIX", "PostgresStepStore"]

#: how the pointers this store hands out begin
POINTER_PREFIX = "pg:"


class PostgresStepStore:
    """`open()` before use, `close()` after; pointers stay readable by any worker of the
    same database and schema."""

    def __init__(self, conninfo: str, schema: str | None, *, max_size: int = 2) -> None:
        self.conninfo = conninfo
        self.schema = schema
        self.max_size = max_size
        self._pool: AsyncConnectionPool | None = None

    async def open(self) -> None:
        self._pool = await async_pool(self.conninfo, self.schema, max_size=self.max_size)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def put(self, key: str, data: str) -> str:
        digest = hashlib.sha256(data.encode()).hexdigest()[:16]
        row_key = f"{key}#{digest}"
        await self._run(
            "insert into step_results (key, data) values (%s, %s) on conflict (key) do nothing",
            (row_key, data),
        )
        return POINTER_PREFIX + row_key

    async def get(self, ref: str) -> str:
        if not ref.startswith(POINTER_PREFIX):
            raise QueryFailed(f"not a pointer of this store: {ref!r}", sqlstate=None)
        rows = await self._run(
            "select data from step_results where key = %s", (ref[len(POINTER_PREFIX) :],)
        )
        if not rows:
            raise QueryFailed(f"no step result at {ref!r}", sqlstate=None)
        return str(rows[0][0])

    async def _run(self, sql: str, params: tuple[str, ...]) -> list[tuple[object, ...]]:
        assert self._pool is not None, "step store not opened"
        with translated(self.conninfo, queries=True):
            async with self._pool.connection() as conn, conn.cursor() as cur:
                await cur.execute(sql, params)
                return await cur.fetchall() if cur.description is not None else []
