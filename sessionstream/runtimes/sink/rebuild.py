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

import contextlib
import functools
import multiprocessing
import os
import time
import uuid
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.copy import QueuedLibpqWriter

from sessionstream.adapters.kafka import (
    METADATA_WAIT_S,
    log_bounds,
    new_reader,
    partitions_of,
    read_messages,
)
from sessionstream.adapters.postgres import connect, translated
from sessionstream.adapters.postgres.migrate import migrate
from sessionstream.adapters.registry import reader_codec
from sessionstream.errors import DatabaseError, SessionstreamError, SingleWriterViolation
from sessionstream.runtimes.sink.projection import Projection
from sessionstream.runtimes.sink.writer import EVENT_COLS, RUN_COLS, RUN_TIMES, ts
from sessionstream.settings import Settings

__all__ = ["COMPARED", "RebuildFailed", "RebuildReport", "rebuild"]

#: the tables a rebuild writes and compares, with the columns compared
COMPARED = {
    "agent_run_events": "session_id, run_id, seq, type, payload, generation, command_id,"
    " tenant_id, ts, producer_ts, kafka_partition, kafka_offset",
    "agent_runs": ", ".join(c for c in RUN_COLS if c != "updated_at"),
    "agent_sessions": "session_id, tenant_id, active_run_id, created_at, user_id",
}
#: how often progress is reported (events)
PROGRESS_EVERY = 20_000
#: event rows formatted per `COPY` write
_ROWS_PER_WRITE = 2000
_NULL = "\\N"
#: COPY's text format: backslash, tab, newline and carriage return are escaped
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _esc(text: str) -> str:
    """`text` as a field of COPY's text format."""
    if "\\" in text or "\t" in text or "\n" in text or "\r" in text:
        return text.translate(_COPY_ESCAPES)
    return text


@functools.lru_cache(maxsize=4096)
def _second(s: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(s))


def _ts_text(ms: int) -> str:
    """Epoch milliseconds as a `timestamptz` literal (UTC), exact to the millisecond as
    `sessionstream.runtimes.sink.writer.ts` makes it."""
    return f"{_second(ms // 1000)}.{ms % 1000:03d}+00"


class RebuildFailed(SessionstreamError):
    """A rebuild worker failed (the message says which partitions, and why)."""


@dataclass
class RebuildReport:
    schema: str
    events: int
    differences: dict[str, int]
    #: seconds spent loading (read, fold, COPY), building keys and indexes, comparing
    load_s: float = 0.0
    index_s: float = 0.0
    compare_s: float = 0.0
    #: the processes that loaded the partitions, and how they were started ("in process",
    #: "fork" or "spawn": see `_start_method`)
    loaders: int = 1
    started_by: str = "in process"

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
    workers: int | None = None,
) -> RebuildReport:
    """Project the whole events topic into a fresh schema and compare with the live one.

    A session's events all live on its partition, so each partition folds on its own: the
    partitions are shared among `workers` processes (default: one per CPU, at most one per
    partition), each loading its own partitions' events, sessions and runs over its own
    connection; the keys and indexes are built once all of them committed."""
    live = settings.database_schema or "public"
    schema = schema or f"sessionstream_rebuild_{uuid.uuid4().hex[:8]}"
    _require_projection(settings, live)
    # the log's shape first: a broker that does not answer leaves no schema behind
    topic = settings.events_topic
    consumer = new_reader(settings)
    try:
        partitions = partitions_of(
            consumer, topic, timeout=METADATA_WAIT_S, bootstrap=settings.kafka_bootstrap
        )
    finally:
        consumer.close()
    bounds = log_bounds(settings, [(topic, p) for p in partitions])
    total = sum(high - low for low, high in bounds.values())  # markers count: an upper bound
    n_workers = max(1, min(workers or os.cpu_count() or 1, len(partitions)))
    shares = [partitions[i::n_workers] for i in range(n_workers)]
    try:
        migrate(settings.database_conninfo, schema=schema)
        with connect(settings, schema) as conn:
            # Step 1: the keys and indexes go (committed: every loader sees bare tables)
            deferred = _defer(conn, schema)
            conn.commit()
            # Step 2: every partition folded and copied, the partitions in parallel
            t0 = time.perf_counter()
            started_by = "in process" if n_workers == 1 else _start_method()
            if n_workers == 1:
                n = _load(settings, schema, shares[0], bounds, progress, total)
            else:
                n = _load_parallel(settings, schema, shares, bounds, progress, total, started_by)
            t1 = time.perf_counter()
            # Step 3: keys and indexes, built once (a duplicate or a second active run
            # fails here)
            _restore(conn, deferred)
            conn.commit()
            t2 = time.perf_counter()
            if progress:
                progress(n, n)
            diffs = _compare(conn, live, schema)
            t3 = time.perf_counter()
    except BaseException:
        if not keep:  # a failed rebuild leaves nothing behind, unless asked to keep it
            # the database may be what failed: its error must not hide the rebuild's
            with (
                contextlib.suppress(DatabaseError),
                translated(settings.database_conninfo, queries=True),
            ):
                _drop_schema(settings, schema)
        raise
    if not keep:
        _drop_schema(settings, schema)
    return RebuildReport(schema, n, diffs, t1 - t0, t2 - t1, t3 - t2, n_workers, started_by)


def _require_projection(settings: Settings, live: str) -> None:
    """The live projection the rebuild is compared with must exist: said before anything
    is built (a wrong `SESSIONSTREAM_DATABASE_SCHEMA`, a sink that never ran)."""
    with connect(settings, live) as conn:
        missing = [
            table
            for table in COMPARED
            if conn.execute("select to_regclass(%s)", (f'"{live}".{table}',)).fetchone() == (None,)
        ]
    if missing:
        raise RebuildFailed(
            f"schema {live!r} has no {', '.join(missing)}: nothing to compare a rebuild with "
            "(is SESSIONSTREAM_DATABASE_SCHEMA right? has the sink run there?)"
        )


def _drop_schema(settings: Settings, schema: str) -> None:
    """Drop the rebuild's schema on a connection of its own (the loaders' are gone, the
    main one may be in a failed transaction)."""
    with connect(settings, autocommit=True) as conn:
        conn.execute(f'drop schema if exists "{schema}" cascade')


def _load_parallel(
    settings: Settings,
    schema: str,
    shares: list[list[int]],
    bounds: dict[tuple[str, int], tuple[int, int]],
    progress: Callable[[int, int], None] | None,
    total: int,
    start_method: str,
) -> int:
    ctx = multiprocessing.get_context(start_method)
    counter = ctx.Value("q", 0)
    with ProcessPoolExecutor(
        len(shares), mp_context=ctx, initializer=_init, initargs=(counter,)
    ) as pool:
        futures = [pool.submit(_load_share, settings, schema, share, bounds) for share in shares]
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_EXCEPTION)
            if progress and pending:
                progress(counter.value, max(total, counter.value))
            for f in done:
                failed = f.result()  # a worker that died raises here
                if failed is not None:
                    for other in pending:
                        other.cancel()
                    kind, message = failed
                    raise (SingleWriterViolation if kind == "violation" else RebuildFailed)(message)
    return int(counter.value)


def _start_method() -> str:
    """`fork` when this process runs one thread, else `spawn`.

    A forked worker starts with every module imported (a spawned one imports them again:
    ~0.6 s per worker here, a quarter of the load of an 80k-event log). But a fork copies
    only the calling thread: a lock another thread held (a live Kafka client's, a logging
    handler's) stays locked in the child forever. With one thread in the process there is
    no other thread to hold one; the Kafka clients this module made are closed by then."""
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:  # not Linux: no way to count native threads
        return "spawn"
    return "fork" if threads == 1 else "spawn"


_COUNTER: Any = None


def _init(counter: Any) -> None:
    global _COUNTER
    _COUNTER = counter


def _load_share(
    settings: Settings,
    schema: str,
    partitions: list[int],
    bounds: dict[tuple[str, int], tuple[int, int]],
) -> tuple[str, str] | None:
    """A worker process: load `partitions`; (kind, message) of what went wrong, or None
    (errors cross the process boundary as text: a driver's exception may not pickle)."""

    def counted(n: int, _total: int) -> None:
        with _COUNTER.get_lock():
            _COUNTER.value += n - counted.last  # type: ignore[attr-defined]
        counted.last = n  # type: ignore[attr-defined]

    counted.last = 0  # type: ignore[attr-defined]
    try:
        _load(settings, schema, partitions, bounds, counted, 0)
    except SingleWriterViolation as e:
        return ("violation", str(e))
    except Exception as e:
        return ("error", f"partitions {partitions}: {type(e).__name__}: {e}")
    return None


def _load(
    settings: Settings,
    schema: str,
    partitions: list[int],
    bounds: dict[tuple[str, int], tuple[int, int]],
    progress: Callable[[int, int], None] | None,
    total: int,
) -> int:
    """Read `partitions` of the events topic to their end, fold them into one in-memory
    projection and COPY the events as they come, then the sessions and runs, and where a
    sink would go on from; one transaction. Returns the events written."""
    topic = settings.events_topic
    decode = reader_codec(settings).decode_event
    proj = Projection({}, {})
    rows: list[str] = []
    seen: set[tuple[str, str, int]] = set()
    nxt: dict[int, int] = {}
    erased: list[tuple[str, int, int]] = []
    n = 0
    with connect(settings, schema) as conn:
        with conn.cursor() as cur:
            # every event, read in batches, folded and copied as it goes (the COPY data
            # goes to the server from a thread of its own while this one decodes on)
            with cur.copy(
                f"copy agent_run_events ({EVENT_COLS}) from stdin",
                writer=QueuedLibpqWriter(cur),
            ) as copy:
                for msg in read_messages(
                    settings,
                    {topic: partitions},
                    end={
                        (t, p): high for (t, p), (_low, high) in bounds.items() if p in partitions
                    },
                    timeout=None,
                    group_id=f"sessionstream-rebuild-{uuid.uuid4()}",
                ):
                    p, offset = msg.partition() or 0, msg.offset() or 0
                    nxt[p] = offset + 1
                    if msg.value() is None:
                        continue  # a tombstone of an erased session's event
                    e = decode(msg.value() or b"")
                    if e.type == "session.erased":
                        # nothing of the session before it is projected (its rows are
                        # deleted once copied, below): a rebuild resurrects nothing
                        erased.append((e.session_id, p, offset))
                        proj.forget(e.session_id)
                    key = (e.session_id, e.run_id, e.seq)
                    if key in seen:
                        continue  # the sink's `on conflict do nothing`: the first one wins
                    seen.add(key)
                    proj.apply(e, (topic, p, offset))
                    payload = e.payload.__pydantic_serializer__.to_json(e.payload, by_alias=True)
                    pts = _NULL if e.producer_ts is None else e.producer_ts
                    rows.append(
                        f"{_esc(e.session_id)}\t{_esc(e.run_id)}\t{e.seq}\t{e.type}\t"
                        f"{_esc(payload.decode())}\t{e.generation}\t{_esc(e.command_id)}\t"
                        f"{_esc(e.tenant_id)}\t{_ts_text(e.ts)}\t"
                        f"{pts}\t{p}\t{offset}\n"
                    )
                    if len(rows) >= _ROWS_PER_WRITE:
                        copy.write("".join(rows))
                        rows.clear()
                    n += 1
                    if progress and n % PROGRESS_EVERY == 0:
                        progress(n, max(total, n))
                copy.write("".join(rows))
            for sid, p, offset in erased:
                cur.execute(
                    "delete from agent_run_events where session_id = %s"
                    " and kafka_partition = %s and kafka_offset <= %s",
                    (sid, p, offset),
                )
            # the projection, folded from the partitions' whole log, once
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
            # where a sink on this schema would go on from
            cur.executemany(
                "insert into sink_offsets (topic, partition, next_offset) values (%s, %s, %s)",
                [(topic, p, o) for p, o in sorted(nxt.items())],
            )
        conn.commit()
    if progress:
        progress(n, max(total, n))
    return n


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
