"""Rebuild the PostgreSQL projection from the events topic, in bulk.

The sink writes in small transactions that lock, fold and upsert; a rebuild starts from an
empty schema, so it does the same work once: the events topic is read from offset 0 in
large batches, each event decoded and folded into one in-memory `Projection`, and the rows
go in with `COPY` — events as they are read, then sessions and runs at the end — into
tables whose keys and indexes are dropped first and built once after (one sort per index
instead of a B-tree insert per row). What the sink would refuse the rebuild refuses too: an
event whose `(session, run, seq)` was already written is skipped (the sink's `on conflict do
nothing`: the first one wins), and a run started while another is active raises
`SingleWriterViolation`. Then it compares the schema with the live one, table by table.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import Consumer

from schemas.codec import Codec
from sessionstream.kafka import log_bounds, partitions_of, read_records, reader_config
from sessionstream.settings import Settings
from sinks.migrate import migrate
from sinks.projection import Projection
from sinks.sink import connect
from sinks.writer import EVENT_COLS, RUN_COLS, RUN_TIMES, ts

__all__ = ["COMPARED", "RebuildReport", "rebuild"]

#: the tables a rebuild writes and compares, with the columns compared
COMPARED = {
    "agent_run_events": "session_id, run_id, seq, type, payload, generation, command_id,"
    " tenant_id, ts, producer_ts, kafka_partition, kafka_offset",
    "agent_runs": ", ".join(c for c in RUN_COLS if c != "updated_at"),
    "agent_sessions": "session_id, tenant_id, active_run_id, created_at, user_id",
}
#: how often progress is reported (events)
PROGRESS_EVERY = 20_000


@dataclass
class RebuildReport:
    schema: str
    events: int
    differences: dict[str, int]

    @property
    def equal(self) -> bool:
        return not any(self.differences.values())


@dataclass(frozen=True)
class _Deferred:
    """The keys and indexes of the rebuilt tables, dropped before the load, made after."""

    constraints: list[tuple[str, str, str]]  # (table, name, definition), keys before FKs
    indexes: list[str]  # CREATE INDEX statements


def _defer(conn: psycopg.Connection[Any], schema: str) -> _Deferred:
    tables = list(COMPARED)
    rows = conn.execute(
        "select c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid), c.contype"
        " from pg_constraint c join pg_namespace n on n.oid = c.connamespace"
        " where n.nspname = %s and c.contype in ('p', 'u', 'f')"
        " and c.conrelid::regclass::text = any(%s)",
        (schema, tables),
    ).fetchall()
    constraints = sorted(
        ((str(t), str(name), str(d), str(kind)) for t, name, d, kind in rows),
        key=lambda r: r[3] == "f",  # primary and unique keys first: foreign keys need them
    )
    backing = {r[1] for r in constraints}
    indexes = [
        (str(name), str(definition))
        for name, definition in conn.execute(
            "select indexname, indexdef from pg_indexes where schemaname = %s"
            " and tablename = any(%s)",
            (schema, tables),
        ).fetchall()
        if name not in backing
    ]
    for table, name, _d, _k in reversed(constraints):  # foreign keys first
        conn.execute(f'alter table {table} drop constraint "{name}"')
    for name, _definition in indexes:
        conn.execute(f'drop index "{name}"')
    return _Deferred([(t, n, d) for t, n, d, _k in constraints], [d for _n, d in indexes])


def _restore(conn: psycopg.Connection[Any], deferred: _Deferred) -> None:
    for table, name, definition in deferred.constraints:
        conn.execute(f'alter table {table} add constraint "{name}" {definition}')
    for statement in deferred.indexes:
        conn.execute(statement)


def rebuild(
    settings: Settings,
    *,
    schema: str | None = None,
    keep: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> RebuildReport:
    """Project the whole events topic into a fresh schema and compare with the live one."""
    live = settings.database_schema or "public"
    schema = schema or f"sessionstream_rebuild_{uuid.uuid4().hex[:8]}"
    migrate(settings.database_conninfo, schema=schema)
    topic = settings.events_topic
    consumer = Consumer(reader_config(settings))
    try:
        partitions = partitions_of(consumer, topic)
    finally:
        consumer.close()
    bounds = log_bounds(settings, [(topic, p) for p in partitions])
    total = sum(high - low for low, high in bounds.values())  # markers count: an upper bound
    codec = Codec()
    proj = Projection({}, {})
    seen: set[tuple[str, str, int]] = set()
    nxt: dict[int, int] = {}
    n = 0
    with connect(settings, schema) as conn:
        deferred = _defer(conn, schema)
        with conn.cursor() as cur:
            # Step 1: every event, read in batches, folded and copied as it goes
            with cur.copy(f"copy agent_run_events ({EVENT_COLS}) from stdin") as copy:
                for r in read_records(
                    settings,
                    {topic: partitions},
                    end={tp: high for tp, (_low, high) in bounds.items()},
                    timeout=None,
                    group_id=f"sessionstream-rebuild-{uuid.uuid4()}",
                ):
                    e = codec.decode_event(r.value or b"")
                    nxt[r.partition] = r.offset + 1
                    key = (e.session_id, e.run_id, e.seq)
                    if key in seen:
                        continue  # the sink's `on conflict do nothing`: the first one wins
                    seen.add(key)
                    proj.apply(e, f"{topic}[{r.partition}]@{r.offset}")
                    payload = e.payload.__pydantic_serializer__.to_json(e.payload, by_alias=True)
                    copy.write_row(
                        (
                            e.session_id,
                            e.run_id,
                            e.seq,
                            e.type,
                            payload.decode(),
                            e.generation,
                            e.command_id,
                            e.tenant_id,
                            ts(e.ts),
                            e.producer_ts,
                            r.partition,
                            r.offset,
                        )
                    )
                    n += 1
                    if progress and n % PROGRESS_EVERY == 0:
                        progress(n, max(total, n))
            # Step 2: the projection, folded from the whole log, once
            with cur.copy(
                "copy agent_sessions (session_id, tenant_id, active_run_id, created_at,"
                " updated_at, user_id) from stdin"
            ) as copy:
                for s in proj.sessions_to_write():
                    copy.write_row(
                        (
                            s.session_id,
                            s.tenant_id,
                            s.active_run_id,
                            ts(s.created_at),
                            ts(s.updated_at),
                            s.user_id,
                        )
                    )
            with cur.copy(f"copy agent_runs ({', '.join(RUN_COLS)}) from stdin") as copy:
                for run in proj.runs_to_write():
                    copy.write_row(
                        tuple(
                            ts(getattr(run, c)) if c in RUN_TIMES else getattr(run, c)
                            for c in RUN_COLS
                        )
                    )
            # Step 3: where a sink on this schema would go on from
            cur.executemany(
                "insert into sink_offsets (topic, partition, next_offset) values (%s, %s, %s)",
                [(topic, p, o) for p, o in sorted(nxt.items())],
            )
        # Step 4: keys and indexes, built once (a duplicate or a second active run fails here)
        _restore(conn, deferred)
        conn.commit()
        if progress:
            progress(n, n)
        diffs = _compare(conn, live, schema)
        if not keep:
            conn.execute(f'drop schema "{schema}" cascade')
            conn.commit()
    return RebuildReport(schema, n, diffs)


def _compare(conn: psycopg.Connection[Any], live: str, schema: str) -> dict[str, int]:
    diffs: dict[str, int] = {}
    for table, cols in COMPARED.items():
        n = 0
        for a, b in ((live, schema), (schema, live)):
            row = conn.execute(
                f'select count(*) from (select {cols} from "{a}".{table}'
                f' except select {cols} from "{b}".{table}) d'
            ).fetchone()
            n += int(str(row[0])) if row else 0
        diffs[table] = n
    return diffs
