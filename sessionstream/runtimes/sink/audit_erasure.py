"""The audit's ninth point: nothing of an erased session is readable.

Each `session_erasures` row names a session by the hash of its id, the time of its erasure
and where its `session.erased` sits in the events log. Then, for those sessions:

- PostgreSQL holds no row of theirs from before the erasure (events, runs, the session);
- the events topic holds no record at or before the erasure's offset (the sink's
  tombstones, then the log cleaner, remove them);
- the state topic holds no record with content from before it (the processor writes a
  marker with only the id, tenant, clock and counters);
- the open-runs topic holds no record from before it (the processor tombstones it).

The outcomes topic is not checked: its records hold ids and statuses, no content (nor the
dedup records they carry: digests), and go by its retention (7 days).

A record superseded (by a tombstone, or by a later record under its key) but not yet
removed by the log cleaner is still readable from the log's start. The topic's own
configuration says how long that may last (`compaction_bound_ms`: its
`max.compaction.lag.ms`): within that bound of the erasure such a record is *pending*,
said in the notes; past it, in a topic without that bound, or not superseded at all, it
fails the check.
"""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg

from sessionstream.adapters.kafka import read_topic
from sessionstream.adapters.topics import check_topics
from sessionstream.core.state_codec import decode_state
from sessionstream.settings import Settings

__all__ = ["compaction_bound_ms", "erased_leftovers"]

_HASH_SQL = "'sha256:' || encode(sha256(convert_to({col}, 'UTF8')), 'hex')"


@dataclass(frozen=True)
class _Erasure:
    erased_at: int
    partition: int
    offset: int


#: beyond a topic's `max.compaction.lag.ms`, the time its log cleaner may take to get to a
#: log (it looks every 15 s by default; a large log takes a while to clean)
CLEANER_SLACK_MS = 10 * 60 * 1000


def compaction_bound_ms(config: dict[str, str]) -> int | None:
    """How long after it was superseded a record of a compacted topic may stay readable,
    by the topic's configuration: `max.compaction.lag.ms` (the cleaner must then clean
    the segment holding it, and a segment rolls within that lag of its first record)
    plus `CLEANER_SLACK_MS`. None when the topic sets no lag: then nothing bounds it (the
    cleaner waits for `min.cleanable.dirty.ratio`). Either way the active segment rolls
    only when a record is appended: a partition nothing is written to keeps it."""
    lag = int(config.get("max.compaction.lag.ms") or 2**63 - 1)
    return None if lag >= 2**62 else lag + CLEANER_SLACK_MS


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


def _latest(records: list[Any]) -> dict[tuple[int, bytes | None], int]:
    """The last offset of each key per partition: a record below it is superseded."""
    return {(r.partition, r.key): r.offset for r in records}


def _keyed_by_session(
    settings: Settings, topic: str, erased: dict[str, list[_Erasure]]
) -> Iterator[tuple[Any, _Erasure, bool]]:
    """(record, the session's last erasure, superseded) of each record (not a tombstone)
    of a topic keyed by session id whose session was erased."""
    records = read_topic(settings, topic)
    latest = _latest(records)
    for r in records:
        sid = _sid(r.key, 0)
        if sid is None or r.value is None or _hash(sid) not in erased:
            continue
        yield r, _last(erased[_hash(sid)]), latest[(r.partition, r.key)] > r.offset


def erased_leftovers(
    settings: Settings, conn: psycopg.Connection[Any], now_ms: int | None = None
) -> tuple[int, list[str], list[str]]:
    """(erasures recorded, leftovers found, notes): each leftover names where it is. A
    record superseded within its topic's `compaction_bound_ms` of the erasure (as of
    `now_ms`, by default now) is pending compaction: a note, not a leftover."""
    erased = _erasures(conn)
    notes: list[str] = []
    if not erased:
        return 0, [], ["no session erased"]
    now = int(time.time() * 1000) if now_ms is None else now_ms
    configs = check_topics(settings).configs
    left: list[str] = []
    pending: dict[str, list[int]] = defaultdict(list)  # topic -> when each must be gone

    def found(topic: str, r: Any, what: str, superseded: bool, e: _Erasure) -> None:
        where = f"{topic}[{r.partition}]@{r.offset}"
        bound = compaction_bound_ms(configs.get(topic, {}))
        if superseded and bound is not None and now - e.erased_at < bound:
            pending[topic].append(e.erased_at + bound)
        elif superseded and bound is not None:
            left.append(
                f"{where} ({what}; superseded, still readable {(now - e.erased_at) // 60000}"
                f" min after the erasure, past the {bound // 60000} min its topic allows)"
            )
        elif superseded:
            left.append(
                f"{where} ({what}; superseded, but the topic sets no max.compaction.lag.ms:"
                " nothing bounds when its log cleaner removes it)"
            )
        else:
            left.append(f"{where} ({what}; nothing supersedes it)")

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
    latest = _latest(records)
    for r in records:
        sid = _sid(r.key, 2)
        if sid is None or r.value is None:
            continue
        h = _hash(sid)
        hit = [e for e in erased.get(h, ()) if r.partition == e.partition and r.offset <= e.offset]
        if hit:
            superseded = latest[(r.partition, r.key)] > r.offset
            found(settings.events_topic, r, "an event", superseded, _last(hit))
    # the state topic: content from before the erasure (the marker has none)
    topic = settings.state_topic
    for r, e, superseded in _keyed_by_session(settings, topic, erased):
        try:
            st = decode_state(r.value)
        except ValueError:
            left.append(f"{topic}[{r.partition}]@{r.offset}: unreadable state")
            continue
        content = st.active or st.queue or st.finished or st.last_checkpoint
        if content and st.clock <= e.erased_at:
            found(topic, r, "state before erasure", superseded, e)
    # open runs: records written before the erasure
    topic = settings.open_runs_topic
    for r, e, superseded in _keyed_by_session(settings, topic, erased):
        if r.timestamp <= e.erased_at:
            found(topic, r, f"a record of {_hash(r.key.decode())[:19]}…", superseded, e)
    notes.append(
        f"{sum(len(v) for v in erased.values())} erasures of {len(hashes)} sessions checked in"
        " PostgreSQL and the events, state and open-runs topics"
    )
    for topic, until in sorted(pending.items()):
        by = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(max(until) / 1000))
        notes.append(
            f"pending: {len(until)} superseded records of erased sessions in {topic} await"
            f" its log cleaner, within what the topic's configuration allows (by {by})"
        )
    if left:
        notes.append(
            "records still in a topic's log are removed by its log cleaner after the"
            " tombstone (max.compaction.lag.ms bounds when); rows by the sink"
        )
    if any("sets no max.compaction.lag.ms" in x for x in left):
        notes.append(
            "`sessionstream topics create --align` sets the lag where this version creates"
            " topics with one (the events topic: a day)"
        )
    return len(erased), left, notes
