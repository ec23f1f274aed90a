"""A SQL tool on psycopg whose abort stops the statement in the server, not just the wait.

Closing a connection does not stop a running statement: PostgreSQL notices a vanished
client only when it next reads from it, so a `pg_sleep(30)` (or a long scan) whose caller
gave up keeps its backend busy to the end. On abort this tool sends the server a cancel
request for the statement (`AsyncConnection.cancel_safe`), waits for the statement to end
with `query_canceled`, and raises `RunCancelled`; the backend is idle again within
milliseconds (tests/integration/runtimes/worker/test_adapters.py measures it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, LiteralString, TypeAlias

import psycopg
from psycopg import sql
from psycopg.abc import Params
from psycopg.rows import tuple_row

from sessionstream.adapters.postgres import translated
from sessionstream.errors import DatabaseError
from sessionstream.runtimes.worker._signal import AbortSignal, RunCancelled

__all__ = ["run_query"]

log = logging.getLogger("sessionstream.worker")

Row: TypeAlias = tuple[Any, ...]
#: what psycopg executes with parameters (a literal, or composed with psycopg.sql)
Query: TypeAlias = LiteralString | bytes | sql.SQL | sql.Composed


async def run_query(
    db: str | psycopg.AsyncConnection[Any],
    query: Query,
    params: Params | None = None,
    *,
    signal: AbortSignal,
    application_name: str = "sessionstream sql tool",
    connect_timeout_s: int = 10,
) -> list[Row]:
    """The rows of `query` (none for a statement without a result).

    `db` is a conninfo (a connection of its own is opened in autocommit and closed after)
    or an open async connection (on one inside a transaction, a cancelled statement leaves
    that transaction failed: the caller's `transaction()` block rolls it back).
    `application_name` shows in `pg_stat_activity`, so operators can tell whose backend
    it is. RunCancelled on abort; QueryFailed when the statement fails, and
    DatabaseUnavailable when the database cannot be reached or is lost meanwhile.
    """
    signal.raise_if_aborted()
    if isinstance(db, psycopg.AsyncConnection):
        # its conninfo (without the password) names the database in a translated error
        return await _execute(db, db.info.dsn, query, params, signal)
    with translated(db):
        conn = await psycopg.AsyncConnection.connect(
            db,
            autocommit=True,
            application_name=application_name,
            connect_timeout=connect_timeout_s,
        )
    async with conn:
        return await _execute(conn, db, query, params, signal)


async def _execute(
    conn: psycopg.AsyncConnection[Any],
    conninfo: str,
    query: Query,
    params: Params | None,
    signal: AbortSignal,
) -> list[Row]:
    async with conn.cursor(row_factory=tuple_row) as cur:
        statement = asyncio.ensure_future(cur.execute(query, params))
        aborted = asyncio.ensure_future(signal.wait())
        try:
            await asyncio.wait({statement, aborted}, return_when=asyncio.FIRST_COMPLETED)
            if not statement.done():
                # Step 1: ask the server to cancel the statement (over a cancel connection)
                try:
                    with translated(conninfo, queries=True):
                        await conn.cancel_safe(timeout=5.0)
                except DatabaseError as e:
                    log.warning("could not cancel the statement in the server: %s", e.reason)
                # Step 2: the statement ends with query_canceled (or had just finished)
                with contextlib.suppress(DatabaseError), translated(conninfo, queries=True):
                    await statement
                # Step 3: report the abort, not the driver's error
                raise RunCancelled(signal.reason or "aborted")
        finally:
            aborted.cancel()
            if not statement.done():
                # our own task was cancelled: psycopg cancels the statement in the server
                # when its wait is interrupted; let it, before the cursor goes away
                statement.cancel()
                with (
                    contextlib.suppress(asyncio.CancelledError, DatabaseError),
                    translated(conninfo, queries=True),
                ):
                    await statement
        with translated(conninfo, queries=True):
            statement.result()
            return await cur.fetchall() if cur.description is not None else []
