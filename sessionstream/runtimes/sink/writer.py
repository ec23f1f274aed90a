"""One batch of events into PostgreSQL, in ONE transaction: rows, projection, offsets.

Events go in with `on conflict do nothing` on `(session_id, run_id, seq)` — a conflict means
already written. Two ways to send them, measured by `bench/bench_sink.py`: COPY into a
temporary staging table then one `insert ... select`, or a pipelined `executemany`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import psycopg
from psycopg.types.json import Jsonb

from sessionstream.runtimes.sink.erasure import EraseKeys, apply_erasure
from sessionstream.runtimes.sink.projection import Projection, RunRow, SessionRow
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.events import SESSION_LOG, Event

__all__ = ["EVENT_COLS", "RUN_COLS", "RUN_TIMES", "PendingEvent", "WriteMode", "write_batch"]

WriteMode = Literal["copy", "executemany"]

EVENT_COLS = (
    "session_id, run_id, seq, type, payload, generation, command_id, tenant_id, ts,"
    " producer_ts, kafka_partition, kafka_offset"
)
RUN_COLS = [
    "run_id",
    "session_id",
    "tenant_id",
    "status",
    "generation",
    "lease_owner",
    "lease_expires_at",
    "timeout_at",
    "cancel_requested_at",
    "terminal_status",
    "terminal_at",
    "prompt",
    "context_ref",
    "checkpoint_uri",
    "last_seq",
    "created_at",
    "updated_at",
    "started_by",
    "cancelled_by",
    "retryable",
    "retry_of",
    "input",
    "labels",
]
#: the `jsonb` columns, which the rows hold as JSON text
_JSON_COLS = frozenset({"input", "labels"})
#: `RUN_COLS` as a select list: the typed input and the labels read back as their JSON
#: text (as the row holds them), not as the values psycopg would make of a `jsonb`
_RUN_SELECT = ", ".join(f"{c}::text" if c in _JSON_COLS else c for c in RUN_COLS)
RUN_TIMES = {
    "lease_expires_at",
    "timeout_at",
    "cancel_requested_at",
    "terminal_at",
    "created_at",
    "updated_at",
}


@dataclass(frozen=True)
class PendingEvent:
    """A decoded event and where it was read."""

    event: Event
    topic: str
    partition: int
    offset: int


def ts(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


def _ms(value: datetime | None) -> int | None:
    return None if value is None else round(value.timestamp() * 1000)


def _ms_required(value: object) -> int:
    assert isinstance(value, datetime)
    return round(value.timestamp() * 1000)


def _event_row(p: PendingEvent) -> tuple[object, ...]:
    e = p.event
    payload = Codec.event_to_json(e)["payload"]
    return (
        e.session_id,
        e.run_id,
        e.seq,
        e.type,
        payload,
        e.generation,
        e.command_id,
        e.tenant_id,
        ts(e.ts),
        e.producer_ts,
        p.partition,
        p.offset,
    )


def _insert_events(
    cur: psycopg.Cursor[tuple[object, ...]], batch: Sequence[PendingEvent], mode: WriteMode
) -> None:
    if mode == "copy":
        cur.execute(
            "create temp table if not exists stage_events (session_id text, run_id text,"
            " seq bigint, type text, payload jsonb, generation bigint, command_id text,"
            " tenant_id text, ts timestamptz, producer_ts bigint, kafka_partition integer,"
            " kafka_offset bigint)"
            " on commit delete rows"
        )
        with cur.copy(f"copy stage_events ({EVENT_COLS}) from stdin") as copy:
            for p in batch:
                row = list(_event_row(p))
                row[4] = json.dumps(row[4])
                copy.write_row(row)
        cur.execute(
            f"insert into agent_run_events ({EVENT_COLS}) select {EVENT_COLS} from stage_events"
            " order by kafka_partition, kafka_offset on conflict do nothing"
        )
    else:
        rows = []
        for p in batch:
            row = list(_event_row(p))
            row[4] = Jsonb(row[4])
            rows.append(tuple(row))
        cur.executemany(
            f"insert into agent_run_events ({EVENT_COLS}) values"
            " (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) on conflict do nothing",
            rows,
        )


def _load(cur: psycopg.Cursor[tuple[object, ...]], batch: Sequence[PendingEvent]) -> Projection:
    run_ids = sorted({p.event.run_id for p in batch if p.event.run_id != SESSION_LOG})
    session_ids = sorted({p.event.session_id for p in batch})
    runs: dict[str, RunRow] = {}
    sessions: dict[str, SessionRow] = {}
    # lock the rows we fold: a second sink (zombie) on the same partition waits, then sees
    # our last_seq and skips what we applied
    cur.execute(
        "select session_id, tenant_id, active_run_id, created_at, updated_at, user_id"
        " from agent_sessions where session_id = any(%s) order by session_id for update",
        (session_ids,),
    )
    for sid, tenant, active, created, updated, user in cur.fetchall():
        sessions[str(sid)] = SessionRow(
            str(sid),
            str(tenant),
            None if active is None else str(active),
            _ms_required(created),
            _ms_required(updated),
            None if user is None else str(user),
        )
    if run_ids:
        cur.execute(
            f"select {_RUN_SELECT} from agent_runs where run_id = any(%s)"
            " order by run_id for update",
            (run_ids,),
        )
        for row in cur.fetchall():
            values = dict(zip(RUN_COLS, row, strict=True))
            for k in RUN_TIMES:
                values[k] = _ms(values[k])  # type: ignore[arg-type]
            runs[str(values["run_id"])] = RunRow(**values)  # type: ignore[arg-type]
    return Projection(runs, sessions)


def _write_projection(cur: psycopg.Cursor[tuple[object, ...]], proj: Projection) -> None:
    sessions = proj.sessions_to_write()
    if sessions:
        cur.executemany(
            "insert into agent_sessions (session_id, tenant_id, active_run_id, created_at,"
            " updated_at, user_id) values (%s, %s, %s, %s, %s, %s) on conflict (session_id)"
            " do update set active_run_id = excluded.active_run_id,"
            " updated_at = excluded.updated_at, user_id = excluded.user_id",
            [
                (
                    s.session_id,
                    s.tenant_id,
                    s.active_run_id,
                    ts(s.created_at),
                    ts(s.updated_at),
                    s.user_id,
                )
                for s in sessions
            ],
        )
    runs = proj.runs_to_write()
    if runs:
        cols = ", ".join(RUN_COLS)
        updates = ", ".join(f"{c} = excluded.{c}" for c in RUN_COLS[1:])
        cur.executemany(
            f"insert into agent_runs ({cols}) values ({', '.join(['%s'] * len(RUN_COLS))})"
            f" on conflict (run_id) do update set {updates}",
            [
                tuple(ts(getattr(r, c)) if c in RUN_TIMES else getattr(r, c) for c in RUN_COLS)
                for r in runs
            ],
        )


def _pieces(batch: Sequence[PendingEvent]) -> list[Sequence[PendingEvent]]:
    """The batch cut after each `session.erased`: what comes before an erasure is written
    (and erased) before what comes after it is folded."""
    out: list[Sequence[PendingEvent]] = []
    start = 0
    for i, p in enumerate(batch):
        if p.event.type == "session.erased":
            out.append(batch[start : i + 1])
            start = i + 1
    if start < len(batch):
        out.append(batch[start:])
    return out


def write_batch(
    conn: psycopg.Connection[tuple[object, ...]],
    batch: Sequence[PendingEvent],
    mode: WriteMode = "copy",
    erase_keys: EraseKeys | None = None,
    passed: dict[tuple[str, int], int] | None = None,
) -> dict[tuple[str, int], int]:
    """Write `batch` in one transaction; returns the next offset stored per partition.
    `erase_keys` tombstones event keys (`session.erased`; without it such an event stops
    the sink rather than leave the session's records behind); `passed`: positions past
    records read and not written (tombstones)."""
    nxt: dict[tuple[str, int], int] = dict(passed or {})
    for p in batch:
        nxt[(p.topic, p.partition)] = max(nxt.get((p.topic, p.partition), 0), p.offset + 1)
    with conn.transaction(), conn.cursor() as cur:
        for piece in _pieces(batch):
            # Step 1: the events themselves (a conflict on the unique key: already written)
            _insert_events(cur, piece, mode)
            # Step 2: the projection, folded from the locked rows and the batch, in log order
            proj = _load(cur, piece)
            for p in piece:
                proj.apply(p.event, f"{p.topic}[{p.partition}]@{p.offset}")
            _write_projection(cur, proj)
            # Step 2b: an erasure ends a piece: its session's keys and rows go
            last = piece[-1]
            if last.event.type == "session.erased":
                if erase_keys is None:
                    raise RuntimeError("a session.erased needs a producer for its tombstones")
                apply_erasure(cur, last.event, last.partition, last.offset, erase_keys)
        # Step 3: our position, in the same transaction as the rows (exactly-once)
        cur.executemany(
            "insert into sink_offsets (topic, partition, next_offset, updated_at)"
            " values (%s, %s, %s, now()) on conflict (topic, partition) do update set"
            " next_offset = greatest(sink_offsets.next_offset, excluded.next_offset),"
            " updated_at = now()",
            [(t, part, off) for (t, part), off in sorted(nxt.items())],
        )
    return nxt
