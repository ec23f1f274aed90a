"""The audit's ninth point: nothing of an erased session is readable.

Each `session_erasures` row names a session by the hash of its id, the time of its erasure
and where its `session.erased` sits in the events log. Then, for those sessions:

- PostgreSQL holds no row of theirs from before the erasure (events, runs, the session);
- the events topic holds no record at or before the erasure's offset (the sink's
  tombstones, then the log cleaner, remove them);
- the state topic holds no record with content from before it (the processor writes a
  marker with only the id, tenant, clock and counters);
- the dedup and open-runs topics hold no record from before it (the processor tombstones
  them).

A record superseded by a tombstone but not yet removed by the log cleaner is still
readable from the log's start: it fails the check until compaction has run (the evidence
says so), which `max.compaction.lag.ms` of each topic bounds.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import psycopg

from sessionstream.adapters.kafka import read_topic
from sessionstream.core.state_codec import decode_state
from sessionstream.settings import Settings

__all__ = ["erased_leftovers"]

_HASH_SQL = "'sha256:' || encode(sha256(convert_to({col}, 'UTF8')), 'hex')"


@dataclass(frozen=True)
class _Erasure:
    erased_at: int
    partition: int
    offset: int


def _hash(session_id: str) -> str:
    return "sha256:" + hashlib.sha256(session_id.encode()).hexdigest()


def _erasures(conn: psycopg.Connection[Any]) -> dict[str, list[_Erasure]]:
    if not conn.execute("select to_regclass('session_erasures') is not null").fetchone()[0]:  # type: ignore[index]
        return {}
    out: dict[str, list[_Erasure]] = defaultdict(list)
    for h, at, p, off in conn.execute(
        "select session_hash, (extract(epoch from erased_at) * 1000)::bigint,"
        " kafka_partition, kafka_offset from session_erasures"
    ).fetchall():
        out[str(h)].append(_Erasure(int(at), int(p), int(off)))
    return out


def _last(erasures: list[_Erasure]) -> _Erasure:
    return max(erasures, key=lambda e: e.erased_at)


def _sid(key: bytes | None, parts: int) -> str | None:
    if key is None:
        return None
    text = key.decode(errors="replace")
    return text.rsplit("/", parts)[0] if parts else text


def erased_leftovers(
    settings: Settings, conn: psycopg.Connection[Any]
) -> tuple[int, list[str], list[str]]:
    """(erasures recorded, leftovers found, notes): each leftover names where it is."""
    erased = _erasures(conn)
    notes: list[str] = []
    if not erased:
        return 0, [], ["no session erased"]
    left: list[str] = []
    hashes = list(erased)
    # PostgreSQL: rows of an erased session from before its erasure
    rows = conn.execute(
        f"select e.session_hash, count(*) from agent_run_events r"
        f" join session_erasures e on {_HASH_SQL.format(col='r.session_id')} = e.session_hash"
        f" and r.kafka_partition = e.kafka_partition and r.kafka_offset <= e.kafka_offset"
        f" group by 1",
    ).fetchall()
    left += [f"agent_run_events: {n} rows of {h[:19]}…" for h, n in rows]
    rows = conn.execute(
        f"select e.session_hash, count(*) from agent_runs r join session_erasures e on"
        f" {_HASH_SQL.format(col='r.session_id')} = e.session_hash"
        f" and r.created_at < e.erased_at group by 1",
    ).fetchall()
    left += [f"agent_runs: {n} runs of {h[:19]}…" for h, n in rows]
    rows = conn.execute(
        f"select e.session_hash from agent_sessions s join session_erasures e on"
        f" {_HASH_SQL.format(col='s.session_id')} = e.session_hash"
        f" and s.created_at < e.erased_at",
    ).fetchall()
    left += [f"agent_sessions: the session {h[:19]}…" for (h,) in rows]
    # the events topic: any record (a value, not a tombstone) at or before the erasure
    records = read_topic(settings, settings.events_topic)
    tombstoned = {r.key for r in records if r.value is None}
    for r in records:
        sid = _sid(r.key, 2)
        if sid is None or r.value is None:
            continue
        h = _hash(sid)
        if h in erased and any(
            r.partition == e.partition and r.offset <= e.offset for e in erased[h]
        ):
            why = (
                "behind a tombstone, awaiting the log cleaner"
                if r.key in tombstoned
                else ("no tombstone")
            )
            left.append(f"{settings.events_topic}[{r.partition}]@{r.offset} ({why})")
    # the state topic: content from before the erasure (the marker has none)
    for r in read_topic(settings, settings.state_topic):
        sid = _sid(r.key, 0)
        if sid is None or r.value is None or _hash(sid) not in erased:
            continue
        e = _last(erased[_hash(sid)])
        try:
            st = decode_state(r.value)
        except ValueError:
            left.append(f"{settings.state_topic}[{r.partition}]@{r.offset}: unreadable state")
            continue
        content = st.active or st.queue or st.finished or st.last_checkpoint
        if content and st.clock <= e.erased_at:
            left.append(f"{settings.state_topic}[{r.partition}]@{r.offset}: state before erasure")
    # dedup and open runs: records decided before the erasure
    for topic, parts in ((settings.dedup_topic, 1), (settings.open_runs_topic, 0)):
        for r in read_topic(settings, topic):
            sid = _sid(r.key, parts)
            if sid is None or r.value is None or _hash(sid) not in erased:
                continue
            e = _last(erased[_hash(sid)])
            at = (
                int.from_bytes(r.value[8:16], "big")
                if topic == settings.dedup_topic and len(r.value) == 16
                else r.timestamp
            )
            if at <= e.erased_at:
                left.append(f"{topic}[{r.partition}]@{r.offset}: {_hash(sid)[:19]}…")
    notes.append(
        f"{sum(len(v) for v in erased.values())} erasures of {len(hashes)} sessions checked in"
        " PostgreSQL and the events, state, dedup and open-runs topics"
    )
    if left:
        notes.append(
            "records still in a topic's log are removed by its log cleaner after the"
            " tombstone (max.compaction.lag.ms bounds when); rows by the sink"
        )
    return len(erased), left, notes
