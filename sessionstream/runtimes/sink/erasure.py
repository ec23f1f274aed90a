"""The sink's half of an erasure: on `session.erased`, every event key the session had
before it gets a tombstone on the events topic, and its rows go from every table.

The processor cannot tombstone the event keys: its state remembers a window of runs, not
every key. The sink has them all (`agent_run_events`), and reads `session.erased` in log
order, after every earlier event of the session is in PostgreSQL. The tombstones are
produced and flushed **before** the transaction that deletes the rows commits: a crash in
between reads the batch again and produces the same tombstones again (a tombstone twice is
one tombstone). Later events of the session (a new run after the erasure) have other keys:
the state keeps the run counter and the session log's seq (docs/protocol.md).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg

from sessionstream.schemas.events import Event, SessionErased

__all__ = ["EraseKeys", "apply_erasure", "event_key"]

#: produce a tombstone for each (partition, key) and wait until the broker has them all
EraseKeys = Callable[[int, list[bytes]], None]

#: tables keyed by the session id: everything the sink, the workers and the webhooks
#: deliverer wrote about it
_BY_SESSION = (
    "agent_run_events",
    "agent_actions",
    "agent_outbox",
    "webhook_dead_letters",
    "session_aliases",
)


def event_key(session_id: str, run_id: str, seq: int) -> bytes:
    """The event's Kafka key, as the processor writes it."""
    return f"{session_id}/{run_id}/{seq:010d}".encode()


def _exists(cur: psycopg.Cursor[Any], table: str) -> bool:
    return bool(cur.execute("select to_regclass(%s) is not null", (table,)).fetchone()[0])  # type: ignore[index]


def apply_erasure(
    cur: psycopg.Cursor[Any], e: Event, partition: int, offset: int, erase_keys: EraseKeys
) -> int:
    """Erase the session of `e` (a `session.erased`, already inserted, read at `partition`
    and `offset` of the events topic) up to and including it; returns the rows deleted."""
    sid = e.session_id
    er = e.payload_as(SessionErased)
    # Step 1: every key the session had before the erasure (the erasure's own included)
    cur.execute(
        "select run_id, seq, kafka_partition from agent_run_events where session_id = %s"
        " and kafka_offset <= %s and kafka_partition = %s order by kafka_offset",
        (sid, offset, partition),
    )
    rows = cur.fetchall()
    runs = sorted({str(r[0]) for r in rows if r[0] != "_session"})
    # Step 2: pointers to what lives outside (checkpoints, step results) are listed; the
    # results stored in step_results (`pg:{key}`) are deleted here
    cur.execute(
        "select distinct coalesce(payload->>'uri', payload->>'resultRef',"
        " payload->>'checkpointRef') from agent_run_events"
        " where session_id = %s and kafka_offset <= %s and type in"
        " ('context.checkpointed', 'step.recorded', 'run.lease_granted')",
        (sid, offset),
    )
    pointers = sorted({str(r[0]) for r in cur.fetchall() if r[0]})
    deleted = 0
    stored = [u[3:] for u in pointers if u.startswith("pg:")]
    if stored and _exists(cur, "step_results"):
        cur.execute("delete from step_results where key = any(%s)", (stored,))
        deleted += cur.rowcount
    elsewhere = [u for u in pointers if not u.startswith("pg:")]
    if elsewhere:
        cur.executemany(
            "insert into erasure_pointers (session_hash, uri) values (%s, %s)"
            " on conflict do nothing",
            [(er.session_hash, u) for u in elsewhere],
        )
    # Step 3: the tombstones, on the broker before the rows go
    keys = [event_key(sid, str(r[0]), int(r[1])) for r in rows]
    if keys:
        erase_keys(partition, keys)
    # Step 4: the rows, from every table that names the session or its runs
    for table in _BY_SESSION:
        if _exists(cur, table):
            cur.execute(f"delete from {table} where session_id = %s", (sid,))
            deleted += cur.rowcount
    if runs:
        for table in ("agent_run_fences", "agent_runs"):
            if _exists(cur, table):
                cur.execute(f"delete from {table} where run_id = any(%s)", (runs,))
                deleted += cur.rowcount
    cur.execute("delete from agent_runs where session_id = %s", (sid,))
    deleted += cur.rowcount
    cur.execute("delete from agent_sessions where session_id = %s", (sid,))
    deleted += cur.rowcount
    if _exists(cur, "analytics.run_events"):
        cur.execute("delete from analytics.run_events where session_id = %s", (sid,))
        deleted += cur.rowcount
    # Step 5: the record of the erasure: a hash of the id, the time, who, why, where
    cur.execute(
        "insert into session_erasures (session_hash, tenant_id, erased_at, trigger, actor,"
        " reason, kafka_partition, kafka_offset, keys_tombstoned, rows_deleted)"
        " values (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) on conflict do nothing",
        (
            er.session_hash,
            e.tenant_id,
            datetime.fromtimestamp(e.ts / 1000, tz=UTC),
            er.trigger,
            er.actor,
            er.reason,
            partition,
            offset,
            len(keys),
            deleted,
        ),
    )
    return deleted
