"""A partition's sessions at assignment: the state and dedup changelogs read to their ends.

State and offsets come from one transaction, so they agree. A state this version cannot
read (written by an older one) is folded again from the events log, the source of truth.
"""

from __future__ import annotations

import logging

from schemas.codec import Codec
from sessionstream.kafka import read_records
from sessionstream.settings import Settings
from streams.decider import DeciderConfig, evolve
from streams.processor.partition import PartitionState
from streams.state import SessionState
from streams.step import decode_dedup, decode_state

__all__ = ["restore"]

log = logging.getLogger("sessionstream.processor")


def restore(
    settings: Settings, partitions: list[int], config: DeciderConfig, codec: Codec
) -> dict[int, PartitionState]:
    """The state of each of `partitions`, from its changelogs (one reader for all)."""
    s = settings
    parts = {p: PartitionState() for p in partitions}
    if not partitions:
        return parts
    stale: set[tuple[int, str]] = set()
    group = f"{s.processor_group}-restore"
    for r in read_records(
        s, {s.state_topic: partitions, s.dedup_topic: partitions}, timeout=600, group_id=group
    ):
        key, value = r.key or b"", r.value
        if r.topic == s.dedup_topic:
            if value is not None:
                parts[r.partition].remember(decode_dedup(key, value))
            continue
        sid = key.decode()
        if value is None:
            parts[r.partition].states.pop(sid, None)
            stale.discard((r.partition, sid))
            continue
        try:
            state = decode_state(value)
        except ValueError as e:  # pydantic's ValidationError is one
            stale.add((r.partition, sid))
            log.debug("state of %s unreadable (%s)", sid, e)
            continue
        stale.discard((r.partition, sid))
        parts[r.partition].states[sid] = state
    if stale:
        _rebuild(settings, parts, stale, config, codec)
    for part in parts.values():
        part.forget_expired(config.dedup_ttl_ms)
        for state in part.states.values():
            part.timers.schedule(state)
    return parts


def _rebuild(
    settings: Settings,
    parts: dict[int, PartitionState],
    stale: set[tuple[int, str]],
    config: DeciderConfig,
    codec: Codec,
) -> None:
    """States the changelog holds in a form this version cannot read (an upgrade) are
    folded again from the events log: same state, new form."""
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
        parts[p].states[sid] = state
    log.warning("rebuilt %s session states from the events log", len(rebuilt))
