"""Which timers a session's state implies, and the `timer.fired` command each one becomes.

Timers never change state: when one is due the processor sends a `timer.fired` command to
`session.timers`, and the decider rules on it in partition order like any other command.
Timer command ids are derived from (kind, run, generation, due time), so a timer fired twice
(e.g. after a processor restart) is a duplicate and decides nothing twice.
"""

from __future__ import annotations

from dataclasses import dataclass

from sessionstream.core.state import SessionState
from sessionstream.schemas.commands import Command, TimerFiredPayload, TimerKind
from sessionstream.schemas.events import SESSION_LOG

__all__ = ["DueTimer", "due_timers", "next_due", "timer_command"]


@dataclass(frozen=True, order=True)
class DueTimer:
    due_at: int
    kind: TimerKind
    run_id: str
    generation: int


def due_timers(state: SessionState, retention_ms: int | None = None) -> list[DueTimer]:
    """Every deadline the active run has, earliest first; an idle session's retention
    deadline when `retention_ms` is set (`DeciderConfig.retention_ms`)."""
    run = state.active
    if run is None:
        due = state.idle_since
        if due is None or retention_ms is None:
            return []
        return [DueTimer(due + retention_ms, "retention", SESSION_LOG, 0)]
    out = [DueTimer(run.timeout_at, "run_deadline", run.run_id, run.generation)]
    if run.lease_owner is not None and run.lease_expires_at is not None:
        out.append(DueTimer(run.lease_expires_at, "lease_expiry", run.run_id, run.generation))
    if run.status == "cancelling" and run.cancel_deadline_at is not None:
        out.append(DueTimer(run.cancel_deadline_at, "cancel_deadline", run.run_id, run.generation))
    # the earliest window of an approval waiting for a person: one timer denies every
    # key expired by then, the next one is set for the next window
    waits = [a.expires_at for _k, a in run.pending_actions() if a.expires_at is not None]
    if waits:
        out.append(DueTimer(min(waits), "approval_expiry", run.run_id, run.generation))
    return sorted(out)


def next_due(state: SessionState, retention_ms: int | None = None) -> int | None:
    timers = due_timers(state, retention_ms)
    return timers[0].due_at if timers else None


def timer_command(state: SessionState, timer: DueTimer, now: int) -> Command:
    """The `timer.fired` command for a due timer; `now` is the processor's clock."""
    return Command(
        command_id=f"timer:{timer.kind}:{timer.run_id}:{timer.generation}:{timer.due_at}",
        session_id=state.session_id,
        tenant_id=state.tenant_id or "",
        type="timer.fired",
        ts=max(now, timer.due_at),
        run_id=timer.run_id,
        generation=timer.generation,
        payload=TimerFiredPayload(kind=timer.kind, due_at=timer.due_at),
    )
