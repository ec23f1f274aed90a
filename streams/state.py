"""Per-session state folded from events: the active run, its lease and generation, its
pending inputs, the queue of waiting work, the session's clock.

Frozen models. Everything here is rebuilt by `evolve` from the event log alone, so the state
table is a cache of the log, never a source. Every collection is bounded by `DeciderConfig`
(queue, pending inputs, held text bytes, actions per run, finished runs remembered), so no
producer can grow a session's record without limit.
"""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import Field

from schemas._base import WireModel
from schemas.events import InputKind, RunStatus, TerminalStatus

__all__ = [
    "ActionRecord",
    "FinishedRun",
    "PendingInput",
    "QueueEntry",
    "RunState",
    "SessionState",
    "command_hash",
]


class QueueEntry(WireModel):
    """A prompt (or a follow-up that will start its own run) waiting for the session."""

    source_command_id: str
    kind: Literal["prompt", "follow_up"]
    text: str
    context_ref: str | None = None
    timeout_ms: int | None = None
    actor: str | None = None
    retry_of: str | None = None


class PendingInput(WireModel):
    """A steer or follow-up accepted for the active run and not consumed yet."""

    source_command_id: str
    kind: InputKind
    text: str
    #: follow-ups only: what happens if the run ends without consuming it
    on_run_end: Literal["drop", "queue"] = "drop"
    actor: str | None = None


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
    #: the holder whose lease was lost last (released or expired)
    last_holder: str | None = None
    started_at: int
    timeout_at: int
    cancel_requested_at: int | None = None
    cancel_deadline_at: int | None = None
    prompt: str
    context_ref: str | None = None
    source_command_id: str
    actions: dict[str, ActionRecord] = Field(default_factory=dict)
    inputs: tuple[PendingInput, ...] = ()

    def input(self, source_command_id: str) -> PendingInput | None:
        for i in self.inputs:
            if i.source_command_id == source_command_id:
                return i
        return None


class FinishedRun(WireModel):
    """What we remember of a recent terminal run, to answer late writes precisely."""

    run_id: str
    status: TerminalStatus
    generation: int
    retryable: bool = False


class SessionState(WireModel):
    """Everything the decider needs about one session."""

    session_id: str
    tenant_id: str | None = None
    active: RunState | None = None
    queue: tuple[QueueEntry, ...] = ()
    log_seq: int = 0
    runs_started: int = 0
    #: the decider's clock: the latest time any of the session's events was decided at
    clock: int = 0
    finished: tuple[FinishedRun, ...] = ()

    @classmethod
    def initial(cls, session_id: str) -> SessionState:
        return cls(session_id=session_id)

    def finished_run(self, run_id: str) -> FinishedRun | None:
        for f in self.finished:
            if f.run_id == run_id:
                return f
        return None

    def held_bytes(self) -> int:
        """UTF-8 bytes of producer text the state holds: the active prompt, its pending
        inputs and the queue. Bounded by `DeciderConfig.max_held_bytes`."""
        n = sum(len(q.text.encode()) for q in self.queue)
        if self.active is not None:
            n += len(self.active.prompt.encode())
            n += sum(len(i.text.encode()) for i in self.active.inputs)
        return n


def command_hash(command_id: str, tenant_id: str = "") -> int:
    """64-bit digest of a tenant's command id: dedup records are keyed by these, not by the
    ids. The tenant is part of it, so another tenant's command (refused, or decided before
    the session had an owner) never takes an id from the owner."""
    key = f"{tenant_id}\x00{command_id}".encode() if tenant_id else command_id.encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")
