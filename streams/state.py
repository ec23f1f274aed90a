"""Per-session state folded from events: the active run, its lease and generation, the queue.

Frozen models, serialisable as JSON for the state table. Everything here is rebuilt by
`evolve` from the event log alone, so the table is a cache of the log, never a source.
"""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import Field

from schemas._base import WireModel
from schemas.events import RunStatus, TerminalStatus

__all__ = [
    "ActionRecord",
    "FinishedRun",
    "QueueEntry",
    "RunState",
    "SessionState",
    "command_hash",
]


class QueueEntry(WireModel):
    """A prompt or follow-up waiting. `runId` set: a follow-up pending for that active run."""

    source_command_id: str
    kind: Literal["prompt", "follow_up"]
    text: str
    context_ref: str | None = None
    timeout_ms: int | None = None
    run_id: str | None = None


class ActionRecord(WireModel):
    """The gate's first decision for an idempotency key; never decided twice."""

    kind: str
    decision: Literal["approved", "denied"]
    completed: bool = False


class RunState(WireModel):
    """The active run. Generation starts at 1 and is bumped whenever a holder loses the lease."""

    run_id: str
    status: RunStatus
    seq: int
    generation: int = 1
    lease_owner: str | None = None
    lease_expires_at: int | None = None
    started_at: int
    timeout_at: int
    cancel_requested_at: int | None = None
    cancel_deadline_at: int | None = None
    prompt: str
    context_ref: str | None = None
    source_command_id: str
    actions: dict[str, ActionRecord] = Field(default_factory=dict)


class FinishedRun(WireModel):
    """What we remember of a recent terminal run, to answer late writes precisely."""

    run_id: str
    status: TerminalStatus
    generation: int


class SessionState(WireModel):
    """Everything the decider needs about one session."""

    session_id: str
    tenant_id: str | None = None
    active: RunState | None = None
    queue: tuple[QueueEntry, ...] = ()
    log_seq: int = 0
    runs_started: int = 0
    recent_commands: tuple[int, ...] = ()
    finished: tuple[FinishedRun, ...] = ()

    @classmethod
    def initial(cls, session_id: str) -> SessionState:
        return cls(session_id=session_id)

    def finished_run(self, run_id: str) -> FinishedRun | None:
        for f in self.finished:
            if f.run_id == run_id:
                return f
        return None

    def pending_follow_ups(self, run_id: str) -> list[QueueEntry]:
        return [q for q in self.queue if q.run_id == run_id]

    def waiting(self) -> list[QueueEntry]:
        """Entries that will start runs, in order (not follow-ups pending for the active run)."""
        return [q for q in self.queue if q.run_id is None]


def command_hash(command_id: str) -> int:
    """64-bit digest of a command id: the dedup window stores these, not the ids."""
    return int.from_bytes(hashlib.blake2b(command_id.encode(), digest_size=8).digest(), "big")
