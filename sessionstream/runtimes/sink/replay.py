"""Replay: a run or a session from PostgreSQL, a range of the events topic, a full rebuild.

`rebuild` (`sessionstream/runtimes/sink/rebuild.py`) re-projects PostgreSQL from the events topic
(offset 0) into
a fresh schema, in bulk, and compares it with the live projection, table by table.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg

from sessionstream.adapters.kafka import (
    METADATA_WAIT_S,
    new_reader,
    offsets_at,
    partitions_of,
    read_messages,
)
from sessionstream.adapters.registry import reader_codec
from sessionstream.core.partitioning import partition_for
from sessionstream.runtimes.sink.rebuild import RebuildReport, rebuild
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.events import SESSION_LOG, Event
from sessionstream.settings import Settings

__all__ = [
    "RebuildReport",
    "event_of_row",
    "event_select",
    "events_of_active_runs",
    "events_of_command",
    "events_of_run",
    "events_of_session",
    "offsets_for_time",
    "offsets_of_run",
    "parse_time",
    "read_range",
    "rebuild",
    "schedule_events",
    "session_partition",
]

_EVENT_COLUMNS = (
    "session_id, run_id, seq, type, payload, generation, command_id, tenant_id,"
    " (extract(epoch from ts) * 1000)::bigint, producer_ts"
)
_EVENT_SELECT = f"select {_EVENT_COLUMNS} from agent_run_events"
_EVENT_SELECT_WITH_OFFSET = f"select {_EVENT_COLUMNS}, kafka_offset from agent_run_events"


def _event(row: tuple[Any, ...]) -> Event:
    sid, rid, seq, typ, payload, gen, cid, tenant, ts, producer_ts = row
    return Event.model_validate(
        {
            "sessionId": sid,
            "runId": rid,
            "seq": seq,
            "type": typ,
            "payload": payload,
            "generation": gen,
            "commandId": cid,
            "tenantId": tenant,
            "ts": ts,
            "producerTs": producer_ts,
        }
    )


def event_select() -> str:
    """``select <an event's columns> from agent_run_events``: add the where clause; read
    each row with `event_of_row`."""
    return _EVENT_SELECT


def event_of_row(row: tuple[Any, ...]) -> Event:
    """The event a row of `event_select` holds."""
    return _event(row)


def events_of_run(conn: psycopg.Connection[Any], run_id: str) -> list[Event]:
    """A run's events in `seq` order."""
    rows = conn.execute(f"{_EVENT_SELECT} where run_id = %s order by seq", (run_id,)).fetchall()
    return [_event(r) for r in rows]


def events_of_session(conn: psycopg.Connection[Any], session_id: str) -> list[Event]:
    """A session's events (its runs and its own log) in log order."""
    rows = conn.execute(
        f"{_EVENT_SELECT} where session_id = %s order by kafka_offset", (session_id,)
    ).fetchall()
    return [_event(r) for r in rows]


#: a run still waiting on a person may ask for one
_ACTIVE_STATUSES = ("running", "compacting", "cancelling")


def events_of_active_runs(
    conn: psycopg.Connection[Any], tenant_id: str, types: tuple[str, ...]
) -> dict[str, list[Event]]:
    """The events of `types` of `tenant_id`'s active runs, by run, each in seq order: what a
    person is asked to decide (pending approvals, open questions) is folded from them."""
    rows = conn.execute(
        f"{_EVENT_SELECT} where run_id in (select run_id from agent_runs"
        " where tenant_id = %s and status = any(%s)) and type = any(%s)"
        " order by run_id, seq",
        (tenant_id, list(_ACTIVE_STATUSES), list(types)),
    ).fetchall()
    conn.rollback()
    by_run: dict[str, list[Event]] = {}
    for r in rows:
        e = _event(r)
        by_run.setdefault(e.run_id, []).append(e)
    return by_run


def schedule_events(conn: psycopg.Connection[Any], session_id: str) -> list[Event]:
    """A session's `schedule.*` events (of its own log) in log order: what its schedules
    are folded from."""
    rows = conn.execute(
        f"{_EVENT_SELECT} where session_id = %s and run_id = %s and type like 'schedule.%%'"
        " order by kafka_offset",
        (session_id, SESSION_LOG),
    ).fetchall()
    return [_event(r) for r in rows]


def events_of_command(
    conn: psycopg.Connection[Any], session_id: str, command_id: str
) -> list[Event]:
    """The events a command caused in its session, in log order (its outcome)."""
    rows = conn.execute(
        f"{_EVENT_SELECT} where session_id = %s and command_id = %s order by kafka_offset",
        (session_id, command_id),
    ).fetchall()
    return [_event(r) for r in rows]


def offsets_of_run(conn: psycopg.Connection[Any], run_id: str) -> list[tuple[int, Event]]:
    """A run's events in `seq` order, each with its offset in the events topic."""
    rows = conn.execute(
        f"{_EVENT_SELECT_WITH_OFFSET} where run_id = %s order by seq", (run_id,)
    ).fetchall()
    return [(int(r[-1]), _event(r[:-1])) for r in rows]


def read_range(
    settings: Settings,
    partition: int | None,
    start: int,
    end: int | None = None,
    codec: Codec | None = None,
    *,
    session_id: str | None = None,
    run_id: str | None = None,
) -> Iterator[tuple[int, Event]]:
    """(offset, event) of one events partition from `start` up to `end` (exclusive) or its
    end; with `session_id` / `run_id`, only that session's / run's events. The filter reads
    the record key (`{session}/{run}/{seq}`), so only the events asked for are decoded:
    reading skips what decoding would cost (2026-12-04: a raw read at 136k events/s, a
    whole partition decoded at 82k/s; bench/results/profile.md).
    `partition` None: the session's own partition (its key's murmur2 placement), where all
    its events are."""
    codec = codec or reader_codec(settings)
    decode = codec.decode_event
    topic = settings.events_topic
    if partition is None and session_id is None:
        raise ValueError("read_range needs a partition or a session")
    # one metadata read: the session's partition, or a check of the one given (a missing
    # topic or partition would be read forever, never reaching its end)
    partitions = _partitions(settings)
    if partition is None:
        assert session_id is not None
        partition = partition_for(session_id.encode(), len(partitions))
    elif partition not in partitions:
        raise ValueError(
            f"{topic} has no partition {partition} (it has {len(partitions)}: "
            f"0-{len(partitions) - 1})"
        )
    prefix = None if session_id is None else f"{session_id}/".encode()
    run = None if run_id is None else f"/{run_id}/".encode()
    for msg in read_messages(
        settings,
        {topic: [partition]},
        start={(topic, partition): start},
        end=None if end is None else {(topic, partition): end},
        timeout=None,
        group_id=f"sessionstream-replay-{uuid.uuid4()}",
    ):
        if prefix is not None or run is not None:
            key = msg.key() or b""
            if prefix is not None and not key.startswith(prefix):
                continue
            # the run id sits between the key's last two slashes (session ids may hold some)
            if run is not None:
                last = key.rfind(b"/")
                if key[key.rfind(b"/", 0, last) : last + 1] != run:
                    continue
        if msg.value() is None:
            continue  # a tombstone: an erased session's key (docs/protocol.md, erasure)
        yield msg.offset() or 0, decode(msg.value() or b"")


def offsets_for_time(
    settings: Settings, ts_ms: int, partitions: list[int] | None = None
) -> dict[int, int]:
    """Per events partition, the first offset whose record was appended at or after
    `ts_ms` (epoch ms): the partition's end when none was. The events topic is
    `LogAppendTime` (the broker stamps each record as it appends it), so the answer is exact;
    on a topic of an earlier version (`CreateTime`) it is the processor's clock instead."""
    parts = partitions if partitions is not None else _partitions(settings)
    return offsets_at(settings, settings.events_topic, parts, ts_ms)


def parse_time(text: str) -> int:
    """Epoch milliseconds of an ISO 8601 time (``2026-12-05T10:00:00Z``, ``...+01:00``; a
    time without a zone is UTC) or of a number of epoch milliseconds."""
    from datetime import UTC, datetime

    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as e:
        raise ValueError(f"not an ISO 8601 time nor epoch milliseconds: {text!r}") from e
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def _partitions(settings: Settings) -> list[int]:
    """The events topic's partitions (`KafkaUnavailable` after `METADATA_WAIT_S` when the
    topic is missing)."""
    consumer = new_reader(settings)
    try:
        return partitions_of(
            consumer,
            settings.events_topic,
            timeout=METADATA_WAIT_S,
            bootstrap=settings.kafka_bootstrap,
        )
    finally:
        consumer.close()


def session_partition(settings: Settings, session_id: str) -> int:
    """The events (and commands) partition of a session: murmur2 of its id over the events
    topic's partition count, as every producer places its commands."""
    return partition_for(session_id.encode(), len(_partitions(settings)))
