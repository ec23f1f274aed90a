"""A partition's sessions at assignment: its local store, brought up to the changelogs' end.

State and offsets come from one transaction, so they agree. Each of the partition's two
databases holds a checkpoint: its changelog's topic id and the offset up to which it
reflects it. The states' changelog is `session.state`; the dedup records' is
`session.outcomes`, whose every record says what its command id is remembered as (its
`sessionstream.dedup` header, read without decoding the value; `forget` on an erasure's).
A checkpoint of this topic, not past its end, means only the changelog's tail is read (a
restart costs the changes since the last checkpoint, not the number of sessions); anything
else — no store, a topic created again, a store ahead of its log, a store of an older
version — empties that database and reads its changelog in full, with a progress line:
`session.state` from its beginning, the outcomes from twice the dedup window ago (older ids
are never looked at), after what an older version's `session.dedup` topic still holds, if
it exists. A state this version cannot read (written by an older one) is folded again from
the events log, the source of truth.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import rocksdict

from sessionstream.adapters.kafka import OFFSET_BEGINNING, log_bounds, offsets_at, read_records
from sessionstream.adapters.topics import topic_ids
from sessionstream.core.decider import DeciderConfig, evolve
from sessionstream.core.state import SessionState
from sessionstream.core.state_codec import decode_if_active, decode_state, encode_state, is_current
from sessionstream.core.step import FORGET, dedup_key, encode_dedup, read_remembered
from sessionstream.core.timers import next_due
from sessionstream.runtimes.processor.batch import DEDUP_HEADER
from sessionstream.runtimes.processor.partition import PartitionState
from sessionstream.runtimes.processor.store import Checkpoint, Db, open_partition_store
from sessionstream.schemas.codec import Codec
from sessionstream.settings import Settings

__all__ = ["RestoreReport", "apply_outcome", "restore"]

log = logging.getLogger("sessionstream.processor")

#: changelog records applied to a store per atomic batch (each with its checkpoint)
_CHUNK = 10_000
#: an accepted command's outcome record (its CloudEvents type header)
_ACCEPTED = b"sessionstream.outcome.accepted"
#: seconds between two progress lines of a long restore
_PROGRESS_S = 5.0


@dataclass
class RestoreReport:
    """What an assignment's restore read: per database, from where and how much."""

    partitions: list[int] = field(default_factory=list)
    #: (topic, partition) -> why its store was restored in full (absent: from a checkpoint)
    full: dict[tuple[str, int], str] = field(default_factory=dict)
    records: int = 0
    rebuilt: int = 0
    seconds: float = 0.0


def restore(
    settings: Settings,
    partitions: list[int],
    config: DeciderConfig,
    codec: Codec,
    *,
    base: Path,
    cache_sessions: int,
    block_cache: rocksdict.Cache,
) -> tuple[dict[int, PartitionState], RestoreReport]:
    """The state of each of `partitions`, its store caught up with its changelogs."""
    s = settings
    t0 = time.monotonic()
    report = RestoreReport(partitions=sorted(partitions))
    parts: dict[int, PartitionState] = {}
    if not partitions:
        return parts, report
    ids = topic_ids(s, [s.state_topic, s.outcomes_topic])
    per_partition = max(64, cache_sessions // len(partitions))
    dedup_ttl_s = 2 * config.dedup_ttl_ms // 1000
    try:
        for p in partitions:
            store, private = open_partition_store(
                base,
                p,
                cache_sessions=per_partition,
                dedup_ttl_s=dedup_ttl_s,
                block_cache=block_cache,
            )
            parts[p] = PartitionState(
                p,
                store,
                state_topic_id=ids[s.state_topic],
                outcomes_topic_id=ids[s.outcomes_topic],
                private=private,
                retention_ms=s.session_retention_ms,
            )
        topics = (s.state_topic, s.outcomes_topic)
        bounds = log_bounds(s, [(t, p) for t in topics for p in partitions])
        start: dict[tuple[str, int], int] = {}
        for p, part in parts.items():
            for topic, db in zip(topics, (part.store.state_db, part.store.dedup_db), strict=True):
                first, why = _start(db, ids[topic], bounds[(topic, p)])
                start[(topic, p)] = first
                if why is not None:
                    report.full[(topic, p)] = why
        if report.full:
            log.info(
                "restoring in full: %s",
                ", ".join(f"{t}[{p}] ({why})" for (t, p), why in sorted(report.full.items())),
            )
        full_dedup = sorted(p for p in parts if (s.outcomes_topic, p) in report.full)
        if full_dedup:
            # ids decided longer ago than twice the dedup window are never looked at
            since = int(time.time() * 1000) - 2 * config.dedup_ttl_ms
            for p, o in offsets_at(s, s.outcomes_topic, full_dedup, since).items():
                start[(s.outcomes_topic, p)] = o
            report.records += _older_dedup(s, parts, full_dedup)
        stale = _catch_up(s, parts, start, bounds, ids, report)
        if stale:
            report.rebuilt = _rebuild(settings, parts, stale, config, codec)
        for part in parts.values():
            part.load_timers()
    except BaseException:
        for part in parts.values():
            part.close()
        raise
    report.seconds = time.monotonic() - t0
    log.info(
        "restored partitions %s: %s changelog records in %.2fs (%s from a checkpoint, %s in full)",
        report.partitions,
        report.records,
        report.seconds,
        2 * len(partitions) - len(report.full),
        len(report.full),
    )
    return parts, report


def _start(db: Db, topic_id: str, bounds: tuple[int, int]) -> tuple[int, str | None]:
    """Where to read a database's changelog from, and why in full (None: the checkpoint)."""
    low, high = bounds
    cp = db.checkpoint()
    why: str | None = None
    if cp is None:
        why = "no local store" if _empty(db) else "the store has no checkpoint"
    elif cp.topic_id != topic_id:
        why = "another topic's checkpoint (created again, or an older version's)"
    elif cp.offset > high:
        why = f"the store is ahead of the log (checkpoint {cp.offset} > end {high})"
    elif cp.offset < low:
        why = f"the log was truncated past the checkpoint ({cp.offset} < {low})"
    if why is None:
        assert cp is not None
        return cp.offset, None
    if not _empty(db):
        db.clear()
    return OFFSET_BEGINNING, why


def _empty(db: Db) -> bool:
    return next(iter(db.prefix(b"")), None) is None


def _older_dedup(s: Settings, parts: dict[int, PartitionState], partitions: list[int]) -> int:
    """A full restore first takes what `session.dedup`, the dedup changelog of versions
    before the outcome records carried the dedup records, still holds (its records go
    within two days): ids decided before an upgrade stay duplicates. Returns the records
    read; none when the topic is gone."""
    if not topic_ids(s, [s.dedup_topic], missing_ok=True):
        return 0  # deleted (or never there): nothing older to take
    n = 0
    chunk: dict[int, list[tuple[bytes, bytes | None]]] = {}
    group = f"{s.processor_group}-restore"
    for r in read_records(s, {s.dedup_topic: partitions}, timeout=600, group_id=group):
        n += 1
        chunk.setdefault(r.partition, []).append((r.key or b"", r.value))
        if n % _CHUNK == 0:
            for p, recs in chunk.items():
                parts[p].store.write_dedup(recs, None)
            chunk.clear()
    for p, recs in chunk.items():
        parts[p].store.write_dedup(recs, None)
    if n:
        log.info("took %s dedup records of %s (an older version's)", n, s.dedup_topic)
    return n


def apply_outcome(
    pending: dict[bytes, bytes | None], part: PartitionState, session_id: str, carried: str
) -> None:
    """What an outcome record says its command id is remembered as (`carried`), applied
    to `pending` (dedup key -> value, None: delete; on top of `part`'s store)."""
    if carried == FORGET:
        # an erasure: every id the session remembered before it is forgotten
        prefix = f"{session_id}/".encode()
        width = len(prefix) + 16
        for key in pending:
            if len(key) == width and key.startswith(prefix):
                pending[key] = None
        for h in part.remembered_ids(session_id):
            pending[dedup_key(session_id, h)] = None
        return
    record = read_remembered(session_id, carried)
    if record is not None:
        pending[dedup_key(session_id, record.id_hash)] = encode_dedup(record)


def _catch_up(
    s: Settings,
    parts: dict[int, PartitionState],
    start: dict[tuple[str, int], int],
    bounds: dict[tuple[str, int], tuple[int, int]],
    ids: dict[str, str],
    report: RestoreReport,
) -> set[tuple[int, str]]:
    """Apply the changelogs from `start` to their ends, in atomic chunks that each carry
    their checkpoint. Returns the (partition, session) whose state this version cannot read."""
    stale: set[tuple[int, str]] = set()
    states: dict[int, list[tuple[SessionState | None, str, bytes | None, int | None]]] = {}
    dedup: dict[int, dict[bytes, bytes | None]] = {}
    last: dict[tuple[str, int], int] = {}
    pending = 0
    next_line = time.monotonic() + _PROGRESS_S
    outcomes = s.outcomes_topic
    full = report.full
    older = 0

    def flush() -> None:
        for p, rows in states.items():
            off = last.get((s.state_topic, p))
            cp = None if off is None else Checkpoint(ids[s.state_topic], off + 1)
            parts[p].store.write_states(rows, cp)
        for p in parts:
            off = last.get((outcomes, p))
            if off is None and p not in dedup:
                continue
            cp = None if off is None else Checkpoint(ids[outcomes], off + 1)
            parts[p].store.write_dedup(list(dedup.get(p, {}).items()), cp)
        states.clear()
        dedup.clear()

    group = f"{s.processor_group}-restore"
    topics = {s.state_topic: sorted(parts), outcomes: sorted(parts)}
    for r in read_records(s, topics, start=start, timeout=600, group_id=group):
        report.records += 1
        pending += 1
        last[(r.topic, r.partition)] = r.offset
        if r.topic == outcomes:
            carried = r.headers.get(DEDUP_HEADER)
            if carried is not None and r.key:
                # the key is `{sessionId}/{commandId}`; a session id holds no "/"
                sid = r.key.split(b"/", 1)[0].decode(errors="replace")
                p = r.partition
                apply_outcome(dedup.setdefault(p, {}), parts[p], sid, carried.decode())
            elif r.headers.get("ce_type") == _ACCEPTED and (outcomes, r.partition) not in full:
                older += 1  # every accepted command is remembered: an older processor's
        else:
            sid = (r.key or b"").decode()
            stale.discard((r.partition, sid))
            row = _state_row(r.partition, sid, r.value, stale, s.session_retention_ms)
            states.setdefault(r.partition, []).append(row)
        if pending >= _CHUNK:
            flush()
            pending = 0
            if time.monotonic() > next_line:
                next_line = time.monotonic() + _PROGRESS_S
                log.info("restoring: %s changelog records so far", report.records)
    flush()
    if older:
        log.warning(
            "%s accepted outcome records after this store's checkpoint carry no %s header:"
            " a processor of an older version wrote them, and their command ids are not"
            " remembered here (a re-send is decided again). Stop every processor of the"
            " older version before starting this one (docs/operations.md, upgrading)",
            older,
            DEDUP_HEADER,
        )
    # an empty or fully read log: the checkpoint says so, so the next restart starts there
    for p, part in parts.items():
        for topic, db in ((s.state_topic, part.store.state_db), (outcomes, part.store.dedup_db)):
            if (topic, p) not in last and db.checkpoint() is None:
                db.write((), checkpoint=Checkpoint(ids[topic], bounds[(topic, p)][1]))
    return stale


def _state_row(
    p: int,
    sid: str,
    value: bytes | None,
    stale: set[tuple[int, str]],
    retention_ms: int | None = None,
) -> tuple[SessionState | None, str, bytes | None, int | None]:
    """What the store keeps of one changelog record: current-format records as they are
    (decoded only when their session has a deadline: an active run, or with retention an
    idle session's erasure); older readable ones in the current format; unreadable ones
    marked for a rebuild from the events log."""
    if value is None:
        return None, sid, None, None
    try:
        if is_current(value):
            state = decode_if_active(value, idle_too=retention_ms is not None)
            if state is None:
                return None, sid, value, None
            due = next_due(state, retention_ms)
            # an idle session's state goes along: the store files its deadline apart
            return (state if state.active is None else None), sid, value, due
        state = decode_state(value)
    except ValueError as e:  # pydantic's ValidationError is one
        stale.add((p, sid))
        log.debug("state of %s unreadable (%s)", sid, e)
        return None, sid, None, None
    return state, sid, encode_state(state), next_due(state, retention_ms)


def _rebuild(
    settings: Settings,
    parts: dict[int, PartitionState],
    stale: set[tuple[int, str]],
    config: DeciderConfig,
    codec: Codec,
) -> int:
    """States the changelog holds in a form this version cannot read (an upgrade) are
    folded again from the events log: same state, new form (in the store; the changelog
    gets it with the session's next change)."""
    s = settings
    by_partition: dict[int, set[str]] = {}
    for p, sid in stale:
        by_partition.setdefault(p, set()).add(sid)
    log.warning(
        "%s session states in an older form; rebuilding them from %s (partitions %s)",
        len(stale),
        s.events_topic,
        sorted(by_partition),
    )
    rebuilt: dict[tuple[int, str], SessionState] = {}
    group = f"{s.processor_group}-restore"
    for r in read_records(s, {s.events_topic: sorted(by_partition)}, timeout=600, group_id=group):
        if r.value is None:
            continue
        e = codec.decode_event(r.value)
        if e.session_id in by_partition[r.partition]:
            before = rebuilt.get((r.partition, e.session_id)) or SessionState.initial(e.session_id)
            rebuilt[(r.partition, e.session_id)] = evolve(before, e, config)
    for (p, sid), state in rebuilt.items():
        parts[p].store.write_states([(state, sid, encode_state(state), next_due(state))], None)
    log.warning("rebuilt %s session states from the events log", len(rebuilt))
    return len(rebuilt)
