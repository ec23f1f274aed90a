"""What one assigned partition holds: its sessions' states and the command ids they
remember (in its local store, the hot states cached), and their timers."""

from __future__ import annotations

from collections.abc import Iterable

from sessionstream.core.state import SessionState
from sessionstream.core.step import DedupRecord, dedup_key, encode_dedup
from sessionstream.core.timers import next_due
from sessionstream.errors import SingleWriterViolation
from sessionstream.runtimes.processor.store import Checkpoint, PartitionStore, remove_private
from sessionstream.runtimes.processor.timer_wheel import TimerWheel

__all__ = ["PartitionState", "co_partitioned"]

_DEDUP_VALUE_BYTES = 16


class PartitionState:
    """The sessions of one commands partition, as its changelogs say."""

    def __init__(
        self,
        partition: int,
        store: PartitionStore,
        *,
        state_topic_id: str,
        outcomes_topic_id: str,
        private: bool = False,
        retention_ms: int | None = None,
    ) -> None:
        self.partition = partition
        self.store = store
        self.state_topic_id = state_topic_id
        #: the dedup records' changelog is the outcomes topic (`CommandOutcome.dedup`)
        self.outcomes_topic_id = outcomes_topic_id
        self.private = private
        self.timers = TimerWheel(retention_ms=retention_ms)
        #: sessions with an active run
        self.active = 0

    def state(self, session_id: str) -> SessionState | None:
        return self.store.state(session_id)

    def seen(self, session_id: str, id_hash: int) -> tuple[int, int] | None:
        raw = self.store.seen(dedup_key(session_id, id_hash))
        if raw is None or len(raw) != _DEDUP_VALUE_BYTES:
            return None
        return (int.from_bytes(raw[:8], "big"), int.from_bytes(raw[8:], "big"))

    def remembered_ids(self, session_id: str) -> list[int]:
        """The command id hashes the store remembers for `session_id`."""
        return self.store.dedup_ids(session_id)

    def load_timers(self) -> None:
        """The timer wheel and the active count from the store's deadline index."""
        self.active = 0
        for due, sid, active in self.store.deadlines():
            self.timers.push(due, sid)
            self.active += int(active)

    def commit(
        self,
        states: Iterable[tuple[SessionState, bytes]],
        remembered: Iterable[DedupRecord],
        state_offset: int | None,
        dedup_offset: int | None,
        forgotten: Iterable[tuple[str, int]] = (),
    ) -> int:
        """A transaction committed: its states and dedup records go to the store with where
        the changelogs now are; the wheel watches the new deadlines. Returns the change in
        the number of active runs."""
        delta = 0
        rows = []
        for state, raw in states:
            before = self.store.state(state.session_id)
            was = before is not None and before.active is not None
            delta += int(state.active is not None) - int(was)
            rows.append((state, state.session_id, raw, next_due(state, self.timers.retention_ms)))
            self.timers.schedule(state)
        self.store.write_states(
            rows,
            None if state_offset is None else Checkpoint(self.state_topic_id, state_offset),
        )
        self.store.write_dedup(
            [
                *((dedup_key(sid, h), None) for sid, h in forgotten),
                *((dedup_key(r.session_id, r.id_hash), encode_dedup(r)) for r in remembered),
            ],
            None if dedup_offset is None else Checkpoint(self.outcomes_topic_id, dedup_offset),
        )
        self.active += delta
        return delta

    def close(self) -> None:
        if self.private:
            remove_private(self.store)
        else:
            self.store.close()


def co_partitioned(assigned: Iterable[tuple[str, int]], topics: Iterable[str]) -> list[int]:
    """The partition numbers assigned, the same for every input topic. Not so (a member
    subscribed to other topics, or another assignor: a rolling upgrade across the
    worker-commands change) would give a session two writers: refused."""
    topics = list(topics)
    by_topic: dict[str, set[int]] = {t: set() for t in topics}
    for topic, partition in assigned:
        by_topic.setdefault(topic, set()).add(partition)
    numbers = set().union(*by_topic.values())
    if any(got != numbers for got in by_topic.values()):
        raise SingleWriterViolation(
            "the assignment is not co-partitioned ("
            + "; ".join(f"{t}: {sorted(ps)}" for t, ps in sorted(by_topic.items()))
            + "): every processor of the group must subscribe to "
            + ", ".join(topics)
            + " with partition.assignment.strategy=range (stop older processors first)"
        )
    return sorted(numbers)
