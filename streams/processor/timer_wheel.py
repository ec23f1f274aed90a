"""When each session's deadlines come due, and which `timer.fired` commands to send. Pure.

The processor schedules a session whenever its state changes; `due(now)` pops the sessions
whose earliest deadline has passed and turns their due timers into commands. A timer fired
and not decided yet is not fired again for `refire_ms` (its command is on its way through
the commands topic); when its session is scheduled again after that (its command was
rejected as not due by the log's clock, which is a state change) it is fired again.
`unfire` is for the timers of an aborted transaction: they never went out, so they are
due again at once.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from schemas.commands import Command
from streams.state import SessionState
from streams.timers import due_timers, timer_command

__all__ = ["REFIRE_MS", "TimerWheel"]

#: a fired timer is fired again only if its command has not been decided after this long
REFIRE_MS = 5_000
#: beyond this many remembered fired timers, those past their refire window are dropped
_FIRED_CAP = 10_000


@dataclass
class TimerWheel:
    """The due times of one partition's sessions."""

    refire_ms: int = REFIRE_MS
    _heap: list[tuple[int, str]] = field(default_factory=list)  # (due at, session id)
    _fired: dict[str, int] = field(default_factory=dict)  # timer command id -> fired at

    def schedule(self, state: SessionState) -> None:
        """`state` changed: its deadlines (an idle session has none) are watched."""
        for t in due_timers(state):
            heapq.heappush(self._heap, (t.due_at, state.session_id))

    def push(self, due_at: int, session_id: str) -> None:
        """A session's earliest deadline, known without its state (from the store's
        deadline index at restore); the state is read when the deadline comes."""
        heapq.heappush(self._heap, (due_at, session_id))

    def due(self, now: int, state_of: Callable[[str], SessionState | None]) -> list[Command]:
        """The `timer.fired` commands due at `now` (ms), each fired once per refire window."""
        if len(self._fired) > _FIRED_CAP:
            self._fired = {k: v for k, v in self._fired.items() if now - v < self.refire_ms}
        out: list[Command] = []
        while self._heap and self._heap[0][0] <= now:
            _due, sid = heapq.heappop(self._heap)
            state = state_of(sid)
            if state is None:
                continue
            for t in due_timers(state):
                if t.due_at > now:
                    heapq.heappush(self._heap, (t.due_at, sid))
                    continue
                cmd = timer_command(state, t, now)
                fired = self._fired.get(cmd.command_id)
                if fired is not None and now - fired < self.refire_ms:
                    heapq.heappush(self._heap, (fired + self.refire_ms, sid))
                    continue
                self._fired[cmd.command_id] = now
                out.append(cmd)
        return out

    def unfire(self, cmd: Command, state: SessionState | None) -> None:
        """`cmd` was never sent (its transaction aborted): due again at once. (Its heap
        entry is gone; without this it came back only with the session's next state
        change, so a run whose worker had gone quiet kept an expired lease.)"""
        self._fired.pop(cmd.command_id, None)
        if state is not None:
            self.schedule(state)

    @property
    def pending(self) -> int:
        return len(self._heap)
