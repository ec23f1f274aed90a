"""Runs approved external actions once per idempotency key, with PostgreSQL as the record.

Two modes, and what each guarantees:

* transactional (default): `fn` gets the open transaction. The key's row
  (`agent_actions`, unique key) and everything `fn` writes through that connection commit
  together. A crash before commit leaves no trace, so a retry runs `fn` again; after the
  commit the key is `done` and any retry (same or another worker, any generation) gets the
  recorded result without calling `fn`. Two executors racing on one key serialise on the
  unique index: the second waits for the first's commit and then reads its result.
  **Exactly once** — for effects that live in this database (the reference agent's outbox).

* external (`transactional=False`), for effects outside the database (an HTTP call): the
  key is claimed and committed as `executing` first, then `fn` runs, then the row becomes
  `done`. A crash between claim and record leaves `executing`: a retry does **not** run
  `fn` again (at most once) and returns `(False, "in_doubt: ...")`. `fn` receives the key,
  so a system that deduplicates by key (most payment/email APIs) closes the gap to exactly
  once by retrying with it — that step is the action's author's, and only they can know
  whether the far side supports it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool

from sessionstream.adapters.postgres import async_pool, translated
from sessionstream.errors import DatabaseError
from sessionstream.runtimes.worker._signal import RunFenced

__all__ = ["ActionExecutor", "ActionFn", "ActionRun", "ActionTarget"]

log = logging.getLogger("sessionstream.worker")


@dataclass(frozen=True)
class ActionTarget:
    """The run an action belongs to, and the lease generation that asks for it."""

    session_id: str
    run_id: str
    generation: int
    worker_id: str


@dataclass(frozen=True)
class ActionRun:
    """What an action function gets: its key, its run, and (transactional) the connection."""

    idempotency_key: str
    kind: str
    session_id: str
    run_id: str
    generation: int
    conn: psycopg.AsyncConnection[Any] | None


ActionFn = Callable[[ActionRun], Awaitable[str | None]]

_CLAIM = """
insert into agent_actions
    (idempotency_key, kind, session_id, run_id, generation, worker_id, status)
values (%s, %s, %s, %s, %s, %s, 'executing')
on conflict (idempotency_key) do nothing
"""
#: the fencing token (Kleppmann): the highest generation that touched the run here. Every
#: holder raises it when granted; an action of an older generation sees it and is refused,
#: in the transaction that would have claimed the key
_FENCE = """
insert into agent_run_fences (run_id, generation) values (%s, %s)
on conflict (run_id) do update
    set generation = greatest(agent_run_fences.generation, excluded.generation), updated_at = now()
returning generation
"""
_RECORD = """
update agent_actions set status = %s, result = %s, finished_at = now()
where idempotency_key = %s
"""


class ActionExecutor:
    """Executes actions against `agent_actions`; one pool per worker process."""

    def __init__(self, database_url: str, schema: str | None = None) -> None:
        self.database_url = database_url
        self.schema = schema
        self._pool: AsyncConnectionPool | None = None

    @property
    def conninfo(self) -> str:
        """The database as a tool should connect to it: this schema on the search path."""
        if not self.schema:
            return self.database_url
        return make_conninfo(self.database_url, options=f"-c search_path={self.schema}")

    async def open(self) -> None:
        # the same schema as the sink's tables (SESSIONSTREAM_DATABASE_SCHEMA); a connection
        # broken by a database restart is replaced, not handed to an action
        self._pool = await async_pool(self.database_url, self.schema, max_size=4)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()

    async def raise_fence(self, run_id: str, generation: int) -> None:
        """A new holder's first write: no older generation's action commits after this.
        Raises RunFenced if a newer generation raised it already. A database that does not
        answer is logged, not fatal (each action raises it again)."""
        assert self._pool is not None, "executor not opened"
        try:
            with translated(self.database_url, queries=True):
                async with self._pool.connection() as conn, conn.transaction():
                    await _fence(conn, run_id, generation)
        except DatabaseError as e:
            log.warning(
                "run %s: fence of generation %s not raised: %s", run_id, generation, e.reason
            )

    async def execute(
        self, target: ActionTarget, kind: str, key: str, fn: ActionFn, *, transactional: bool
    ) -> tuple[bool, str | None]:
        """(ok, result) — from `fn`, or the key's recorded outcome when it already ran.
        Raises RunFenced, and acts not, when a newer generation has raised the run's fence."""
        assert self._pool is not None, "executor not opened"
        t = target
        claim = (key, kind, t.session_id, t.run_id, t.generation, t.worker_id)
        async with self._pool.connection() as conn:
            if transactional:
                async with conn.transaction():
                    # Step 1: the fencing token, then the key; a concurrent claim waits here
                    await _fence(conn, t.run_id, t.generation)
                    cur = await conn.execute(_CLAIM, claim)
                    if cur.rowcount == 0:
                        return await _recorded(conn, key)
                    # Step 2: the effect, in the same transaction as the key
                    run = ActionRun(key, kind, t.session_id, t.run_id, t.generation, conn)
                    result = await fn(run)
                    # Step 3: record; the commit makes key, effect and result visible at once
                    await conn.execute(_RECORD, ("done", result, key))
                return True, result
            # external: Step 1 fence, claim and commit, Step 2 effect, Step 3 record
            async with conn.transaction():
                await _fence(conn, t.run_id, t.generation)
                cur = await conn.execute(_CLAIM, claim)
                if cur.rowcount == 0:
                    return await _recorded(conn, key)
            run = ActionRun(key, kind, t.session_id, t.run_id, t.generation, None)
            try:
                result = await fn(run)
            except Exception as e:
                async with conn.transaction():
                    await conn.execute(_RECORD, ("failed", repr(e)[:1000], key))
                return False, repr(e)[:1000]
            async with conn.transaction():
                await conn.execute(_RECORD, ("done", result, key))
            return True, result


async def _fence(conn: psycopg.AsyncConnection[Any], run_id: str, generation: int) -> None:
    cur = await conn.execute(_FENCE, (run_id, generation))
    row = await cur.fetchone()
    current = int(row[0]) if row is not None else generation
    if current > generation:
        # raised inside the transaction: it rolls back, nothing of the action is written
        raise RunFenced(
            f"generation {generation} is fenced: generation {current} holds run {run_id}"
        )


async def _recorded(conn: psycopg.AsyncConnection[Any], key: str) -> tuple[bool, str | None]:
    cur = await conn.execute(
        "select status, result from agent_actions where idempotency_key = %s", (key,)
    )
    row = await cur.fetchone()
    assert row is not None
    status, result = row
    if status == "done":
        return True, result
    if status == "failed":
        return False, result
    return False, f"in_doubt: {key} was claimed but its outcome never recorded"
