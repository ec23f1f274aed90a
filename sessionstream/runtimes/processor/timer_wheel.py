"""When each session's deadlines come due, and which `timer.fired` commands to send. Pure.

The processor schedules a session whenever its state changes; `due(now)` pops the sessions
whose earliest deadline has passed and turns their due timers into commands. A timer fired
and not decided yet is not fired again for `refire_ms` (its command is on its way through
the timers topic); still due after that (its command was lost, or rejected as not due by
the log's clock) it is fired again. `unfire` is for the timers of an aborted transaction:
they never went out, so they are due again at once.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from sessionstream.core.state import SessionState
from sessionstream.core.timers import due_timers, timer_command
from sessionstream.schemas.commands import Command

__all__ = ["REFIRE_MS", "TimerWheel"]

#: a fired timer is fired again only if its command has not been decided after this long
REFIRE_MS = 5_000
#: beyond this many remembered fired timers, those past their refire window are dropped
_FIRED_CAP = 10_000


@dataclass
class TimerWheel:
    """The due times of one partition's sessions.

    Each session has at most one live entry in the heap, at the earliest time it must be
    looked at again (`_next`); entries it left behind are skipped when they come up. (The
    wheel once pushed an entry per state change and re-pushed every not-yet-due deadline
    on each pop: a busy run's entries multiplied, and under load one `due` call took tens
    of seconds of the processor's only thread.)"""

    refire_ms: int = REFIRE_MS
    #: an idle session's retention deadline (`DeciderConfig.retention_ms`); None: none
    retention_ms: int | None = None
    _heap: list[tuple[int, str]] = field(default_factory=list)  # (due at, session id)
    _next: dict[str, int] = field(default_factory=dict)  # session id -> its live entry's time
    _fired: dict[str, int] = field(default_factory=dict)  # timer command id -> fired at

    def schedule(self, state: SessionState) -> None:
        """`state` changed: its deadlines (an idle session has none) are watched."""
        timers = due_timers(state, self.retention_ms)
        if timers:
            self.push(timers[0].due_at, state.session_id)

    def push(self, due_at: int, session_id: str) -> None:
        """Look at `session_id` at `due_at` (or earlier, if it is already due then); from
        `schedule`, or from the store's deadline index at restore, without its state."""
        live = self._next.get(session_id)
        if live is not None and live <= due_at:
            return  # looked at by then anyway: what is due later is pushed at that look
        self._next[session_id] = due_at
        heapq.heappush(self._heap, (due_at, session_id))

    def due(self, now: int, state_of: Callable[[str], SessionState | None]) -> list[Command]:
        """The `timer.fired` commands due at `now` (ms), each fired once per refire window:
        a fired timer whose command changed nothing by then (lost with its transaction, or
        still on its way) is fired again."""
        if len(self._fired) > _FIRED_CAP:
            self._fired = {k: v for k, v in self._fired.items() if now - v < self.refire_ms}
        out: list[Command] = []
        while self._heap and self._heap[0][0] <= now:
            at, sid = heapq.heappop(self._heap)
            if self._next.get(sid) != at:
                continue  # left behind by an earlier push
            del self._next[sid]
            state = state_of(sid)
            if state is None:
                continue
            again: int | None = None  # when the session must be looked at next
            for t in due_timers(state, self.retention_ms):
                if t.due_at > now:
                    again = t.due_at if again is None else min(again, t.due_at)
                    continue
                cmd = timer_command(state, t, now)
                fired = self._fired.get(cmd.command_id)
                if fired is None or now - fired >= self.refire_ms:
                    self._fired[cmd.command_id] = fired = now
                    out.append(cmd)
                retry = fired + self.refire_ms
                again = retry if again is None else min(again, retry)
            if again is not None:
                self.push(again, sid)
        return out

    def unfire(self, cmd: Command, state: SessionState | None) -> None:
        """`cmd` was never sent (its transaction aborted): due again at once. (Without this
        it came back only after the refire window.)"""
        self._fired.pop(cmd.command_id, None)
        if state is not None:
            self.schedule(state)

    @property
    def pending(self) -> int:
        """Sessions watched."""
        return len(self._next)
