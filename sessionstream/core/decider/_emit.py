"""The emitter: builds one command's events, folding each into the state as it goes."""

from __future__ import annotations

from sessionstream.core.decider._base import DeciderConfig
from sessionstream.core.decider._evolve import evolve
from sessionstream.core.state import (
    SessionState,
)
from sessionstream.schemas._base import Payload, construct, make
from sessionstream.schemas.commands import (
    Command,
)
from sessionstream.schemas.events import (
    SESSION_LOG,
    CommandRejected,
    Event,
    RejectionReason,
)


class _Emitter:
    """Builds events for one command, folding each into the state as it goes."""

    def __init__(
        self, state: SessionState, command: Command, config: DeciderConfig, now: int
    ) -> None:
        self.state = state
        self.cmd = command
        self.config = config
        self.now = now
        self.events: list[Event] = []

    def emit(
        self, run_id: str, type_: str, payload: Payload, *, generation: int | None = None
    ) -> None:
        run = self.state.active
        if run_id == SESSION_LOG:
            seq, gen = self.state.log_seq + 1, 0
        elif run is not None and run.run_id == run_id:
            seq, gen = run.seq + 1, run.generation
        else:  # run.started
            seq, gen = 1, 1
        # built without a second validation: every value is typed here, the payload was
        # validated when its handler made it (the unit tests validate every event emitted)
        event = construct(
            Event,
            {
                "session_id": self.cmd.session_id,
                "run_id": run_id,
                "seq": seq,
                "type": type_,
                "payload": payload,
                "generation": gen if generation is None else generation,
                "command_id": self.cmd.command_id,
                "ts": self.now,
                "tenant_id": self.state.tenant_id or self.cmd.tenant_id,
                "producer_ts": self.cmd.ts,
            },
        )
        self.events.append(event)
        self.state = evolve(self.state, event, self.config)

    def on_run(self, type_: str, payload: Payload, *, generation: int | None = None) -> None:
        run = self.state.active
        assert run is not None
        self.emit(run.run_id, type_, payload, generation=generation)

    def reject(
        self,
        reason: RejectionReason,
        detail: str | None = None,
        *,
        target_status: str | None = None,
    ) -> None:
        self.emit(
            SESSION_LOG,
            "command.rejected",
            make(
                CommandRejected,
                reason=reason,
                command_type=self.cmd.type,
                target_run_id=self.cmd.run_id,
                detail=detail,
                actor=self.cmd.actor,
                target_status=target_status,
            ),
        )
