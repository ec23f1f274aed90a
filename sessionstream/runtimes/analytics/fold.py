"""The analytics fold: one record of `session.events` -> the table writes that record it.

No I/O and no clock: `Folder` keeps a decoded mirror of the table and returns, for each
consumed record, the ordered writes the runtime must append to the table's changelog.

Why it never counts twice (faust-streaming#48, robinhood/faust#340): counters (`n += 1`)
are not idempotent, and faust writes table changes and commits input offsets separately,
so a crash between the two replays events into a table that already holds them. Here no
value is a counter. A run's record is set-once facts plus the highest `seq` folded in, a
rejection's record is keyed by its event key, and counts are derived from those records
when read. Folding an event that is already in the table (a replay after kill -9, or a
processor's byte-identical re-emission under the same key) writes nothing.

Why it never loses one: faust may commit an input offset before the table writes of that
event reached Kafka (its producer-buffer flush waits 0.1 s at most). So offsets are not
taken from faust: each partition's `Cursor` is written into the same table after the facts
it covers, and a restart resumes every partition at its recovered cursor.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Final, NamedTuple

from sessionstream.runtimes.analytics.facts import (
    CURSOR_PREFIX,
    Cursor,
    Fact,
    Rejection,
    RunFacts,
    cursor_key,
    decode_fact,
    encode_fact,
    rejection_key,
    run_key,
)
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.errors import DecodeError
from sessionstream.schemas.events import SESSION_LOG, Event

__all__ = ["RUN_EVENT_TYPES", "FoldStats", "Folder", "Write", "evolve_run"]

#: the run events analytics reads; every other type (and any type added later) is skipped
RUN_EVENT_TYPES: Final = frozenset({"run.started", "run.cancel_requested", "run.finished"})
_MINUTE: Final = 60_000


class Write(NamedTuple):
    """One table write, in changelog order; `value` None deletes the key."""

    key: str
    value: bytes | None


@dataclass
class FoldStats:
    """Counters of this process (not persisted): what the fold saw and why it skipped."""

    records: int = 0
    folded: int = 0
    repeats: int = 0
    other_types: int = 0
    undecodable: int = 0
    late: int = 0
    expired: int = 0
    unowned: int = 0


def evolve_run(facts: RunFacts | None, event: Event, partition: int) -> RunFacts | None:
    """The run's facts after `event`, or None when the event adds nothing.

    `seq` is contiguous per run and one partition holds a run's events in order, so an
    event at or below `last_seq` has been folded in before. Each fact is also set once.
    """
    if facts is not None and event.seq <= facts.last_seq:
        return None
    base = facts or RunFacts(
        session_id=event.session_id,
        run_id=event.run_id,
        tenant_id=event.tenant_id,
        partition=partition,
        last_seq=0,
    )
    if event.type == "run.started":
        if base.started_at is not None:
            return None
        return replace(base, last_seq=event.seq, started_at=event.ts)
    if event.type == "run.cancel_requested":
        if base.cancel_requested_at is not None:
            return None
        return replace(base, last_seq=event.seq, cancel_requested_at=event.ts)
    if event.type == "run.finished":
        if base.finished_at is not None:
            return None
        status = getattr(event.payload, "terminal_status", None)
        return replace(base, last_seq=event.seq, finished_at=event.ts, terminal_status=str(status))
    return None


class Folder:
    """The analytics state of the partitions this process owns, and its fold.

    `retention_ms`: a run that finished, or a rejection made, more than this before the
    partition's newest event is deleted; later events stamped before that horizon are
    ignored. `cursor_every`: records without a table change between cursor writes.
    """

    def __init__(self, retention_ms: int, cursor_every: int = 1000, codec: Codec | None = None):
        self.retention_ms = retention_ms
        self.cursor_every = cursor_every
        self.codec = codec or Codec()
        self.stats = FoldStats()
        self._facts: dict[str, Fact] = {}
        self._cursors: dict[int, Cursor] = {}
        self._saved: dict[int, int] = {}
        self._expiry: dict[int, list[tuple[int, str]]] = {}
        #: partitions whose state is loaded; records of others are not folded
        self._owned: set[int] = set()

    # -- state ------------------------------------------------------------------------------
    def recovered(self, assigned: Iterable[int], items: Iterable[tuple[str, bytes]]) -> None:
        """After faust recovered the table for the partitions `assigned` to this process.

        Partitions held before keep their state: it is ahead of the changelog (faust may
        not have sent the last writes yet). Newly assigned ones are loaded from the
        recovered table `items`; partitions gone elsewhere are forgotten.
        """
        assigned = set(assigned)
        for p in self._owned - assigned:
            self._forget(p)
        new = assigned - self._owned
        for key, data in items:
            fact = decode_fact(data)
            if isinstance(fact, Cursor):
                p = int(key.removeprefix(CURSOR_PREFIX))
                if p in new:
                    self._facts[key] = fact
                    self._cursors[p] = fact
                    self._saved[p] = fact.next_offset
            elif fact.partition in new:
                self._facts[key] = fact
                self._index(key, fact)
        self._owned = assigned

    def _forget(self, partition: int) -> None:
        for key in [k for k, f in self._facts.items() if _partition_of(k, f) == partition]:
            del self._facts[key]
        self._cursors.pop(partition, None)
        self._saved.pop(partition, None)
        self._expiry.pop(partition, None)

    def resume_offset(self, partition: int) -> int | None:
        """Where to resume reading `partition` (None: from its beginning)."""
        cur = self._cursors.get(partition)
        return cur.next_offset if cur is not None else None

    def cursors(self) -> dict[int, Cursor]:
        return dict(self._cursors)

    def owned(self) -> frozenset[int]:
        """The partitions whose state is loaded and folded here."""
        return frozenset(self._owned)

    def runs(self) -> Iterator[RunFacts]:
        return (f for f in self._facts.values() if isinstance(f, RunFacts))

    def rejections(self) -> Iterator[Rejection]:
        return (f for f in self._facts.values() if isinstance(f, Rejection))

    def __len__(self) -> int:
        return len(self._facts)

    # -- the fold ---------------------------------------------------------------------------
    def fold(self, partition: int, offset: int, value: bytes | None) -> list[Write]:
        """The writes recording the record at `offset` of `partition`, in order."""
        self.stats.records += 1
        if partition not in self._owned:
            # not recovered yet: the record is read again from the partition's cursor
            self.stats.unowned += 1
            return []
        cur = self._cursors.get(partition) or Cursor(next_offset=0, watermark=0, horizon=0)
        event = self._decode(value)
        writes: list[Write] = []
        watermark = cur.watermark
        if event is not None:
            if event.ts < cur.horizon:
                self.stats.late += 1
            else:
                watermark = max(watermark, event.ts)
                write = self._fold_event(event, partition)
                if write is not None:
                    writes.append(write)
        horizon = max(cur.horizon, _floor_minute(watermark - self.retention_ms))
        new = Cursor(
            next_offset=max(cur.next_offset, offset + 1), watermark=watermark, horizon=horizon
        )
        self._cursors[partition] = new
        unsaved = new.next_offset - self._saved.get(partition, 0)
        if writes or horizon != cur.horizon or unsaved >= self.cursor_every:
            # after the facts, before any deletion it allows (see Cursor)
            writes.append(self._put(cursor_key(partition), new))
            self._saved[partition] = new.next_offset
        writes.extend(self._expire(partition, horizon))
        return writes

    def _decode(self, value: bytes | None) -> Event | None:
        if value is None:
            return None
        try:
            return self.codec.decode_event(value)
        except DecodeError:
            # new event types or writer schemas this build does not know: not ours to judge
            self.stats.undecodable += 1
            return None

    def _fold_event(self, event: Event, partition: int) -> Write | None:
        if event.run_id == SESSION_LOG:
            if event.type != "command.rejected":
                self.stats.other_types += 1
                return None
            key = rejection_key(event.key)
            if key in self._facts:
                self.stats.repeats += 1
                return None
            payload = event.payload
            fact: Fact = Rejection(
                tenant_id=event.tenant_id,
                partition=partition,
                at=event.ts,
                reason=str(getattr(payload, "reason", "unknown")),
                command_type=str(getattr(payload, "command_type", "unknown")),
            )
        else:
            if event.type not in RUN_EVENT_TYPES:
                self.stats.other_types += 1
                return None
            key = run_key(event.session_id, event.run_id)
            old = self._facts.get(key)
            new = evolve_run(old if isinstance(old, RunFacts) else None, event, partition)
            if new is None:
                self.stats.repeats += 1
                return None
            fact = new
        self.stats.folded += 1
        self._index(key, fact)
        return self._put(key, fact)

    def _put(self, key: str, fact: Fact) -> Write:
        self._facts[key] = fact
        return Write(key, encode_fact(fact))

    def _index(self, key: str, fact: Fact) -> None:
        if isinstance(fact, (RunFacts, Rejection)) and fact.expires_at is not None:
            heapq.heappush(self._expiry.setdefault(fact.partition, []), (fact.expires_at, key))

    def _expire(self, partition: int, horizon: int) -> list[Write]:
        heap = self._expiry.get(partition)
        out: list[Write] = []
        while heap and heap[0][0] < horizon:
            at, key = heapq.heappop(heap)
            fact = self._facts.get(key)
            if isinstance(fact, (RunFacts, Rejection)) and fact.expires_at == at:
                del self._facts[key]
                self.stats.expired += 1
                out.append(Write(key, None))
        return out


def _partition_of(key: str, fact: Fact) -> int:
    if isinstance(fact, Cursor):
        return int(key.removeprefix(CURSOR_PREFIX))
    return fact.partition


def _floor_minute(ms: int) -> int:
    return max(0, ms - ms % _MINUTE)
