"""What one assigned partition holds: its sessions' states, the command ids they remember,
and their timers."""

from __future__ import annotations

from streams.processor.timer_wheel import TimerWheel
from streams.state import SessionState
from streams.step import DedupRecord

__all__ = ["PartitionState"]


class PartitionState:
    """The sessions of one commands partition, as its changelogs say."""

    def __init__(self) -> None:
        self.states: dict[str, SessionState] = {}
        self.dedup: dict[tuple[str, int], tuple[int, int]] = {}
        #: the latest decision time on this partition (to expire dedup records)
        self.clock = 0
        self.timers = TimerWheel()

    def state(self, session_id: str) -> SessionState | None:
        return self.states.get(session_id)

    def put(self, state: SessionState) -> None:
        self.states[state.session_id] = state
        self.timers.schedule(state)

    def seen(self, session_id: str, id_hash: int) -> tuple[int, int] | None:
        return self.dedup.get((session_id, id_hash))

    def remember(self, r: DedupRecord) -> None:
        self.dedup[(r.session_id, r.id_hash)] = (r.digest, r.at)
        if r.at > self.clock:
            self.clock = r.at

    def forget_expired(self, ttl_ms: int) -> None:
        """Drop dedup records the decider would no longer look at (older than the TTL by
        the partition's latest decision time; a session's own clock is never behind it by
        more than its idle time, so nothing still inside a session's window goes)."""
        if self.dedup:
            self.clock = max(self.clock, max(at for _d, at in self.dedup.values()))
        horizon = self.clock - ttl_ms
        self.dedup = {k: v for k, v in self.dedup.items() if v[1] >= horizon}

    def active_runs(self) -> int:
        return sum(1 for st in self.states.values() if st.active is not None)
