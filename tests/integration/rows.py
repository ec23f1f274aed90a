"""PostgreSQL against the event log: the sink's rows and projection must equal the log."""

from __future__ import annotations

import json

import psycopg

from sessionstream.adapters.kafka import read_topic
from sessionstream.adapters.registry import reader_codec
from sessionstream.runtimes.sink.projection import Projection
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.events import Event
from sessionstream.settings import Settings, get_settings

__all__ = ["assert_rows_equal_log", "count_rows", "db", "log_events"]


def db(s: Settings) -> psycopg.Connection[tuple[object, ...]]:
    """A connection whose search path is the test's private schema."""
    return psycopg.connect(s.database_url, options=f"-c search_path={s.database_schema}")


def log_events(s: Settings) -> list[tuple[int, int, Event]]:
    """(partition, offset, event) of every committed event."""
    codec = reader_codec(get_settings())
    return [
        (r.partition, r.offset, codec.decode_event(r.value or b""))
        for r in read_topic(s, s.events_topic, timeout=300)
    ]


def count_rows(s: Settings) -> int:
    """Rows in `agent_run_events` (0 while the schema is missing or the database restarts)."""
    try:
        with db(s) as conn:
            row = conn.execute("select count(*) from agent_run_events").fetchone()
            return int(row[0]) if row else 0  # type: ignore[call-overload]
    except psycopg.Error:
        return 0


def assert_rows_equal_log(s: Settings) -> int:
    """Every event once, with its payload; the projection equals the fold of the log."""
    log = log_events(s)
    with db(s) as conn:
        rows = conn.execute(
            "select session_id, run_id, seq, type, payload, generation, command_id,"
            " kafka_partition, kafka_offset from agent_run_events"
        ).fetchall()
        runs = {
            r[0]: r
            for r in conn.execute(
                "select run_id, status, generation, lease_owner, terminal_status, last_seq, prompt,"
                " checkpoint_uri, started_by, cancelled_by, retryable, retry_of, input"
                " from agent_runs"
            ).fetchall()
        }
        offsets = {
            int(p): int(o)  # type: ignore[call-overload]
            for p, o in conn.execute("select partition, next_offset from sink_offsets")
        }
    assert len(rows) == len(log), f"{len(rows)} rows for {len(log)} events"
    by_key = {(r[0], r[1], r[2]): r for r in rows}
    assert len(by_key) == len(rows)
    for p, off, e in log:
        row = by_key[(e.session_id, e.run_id, e.seq)]
        assert row[3] == e.type and row[5] == e.generation and row[6] == e.command_id
        assert row[4] == Codec.event_to_json(e)["payload"]
        assert (row[7], row[8]) == (p, off)
    # the offsets table agrees with the rows
    for p in {p for p, _o, _e in log}:
        assert offsets[p] > max(o for q, o, _e in log if q == p)
    proj = Projection({}, {})
    for p, off, e in log:
        proj.apply(e, f"{p}@{off}")
    assert set(runs) == set(proj.runs)
    for run_id, r in proj.runs.items():
        got = runs[run_id]
        assert got[1:] == (
            r.status,
            r.generation,
            r.lease_owner,
            r.terminal_status,
            r.last_seq,
            r.prompt,
            r.checkpoint_uri,
            r.started_by,
            r.cancelled_by,
            r.retryable,
            r.retry_of,
            None if r.input is None else json.loads(r.input),  # the jsonb's value
        ), run_id
    return len(rows)
