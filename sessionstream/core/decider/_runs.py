"""Runs starting and ending: start, finish, the queue, cancel requests, lease loss."""

from __future__ import annotations

from sessionstream.core.decider._base import _LEASE_LOST, run_id_for
from sessionstream.core.decider._emit import _Emitter
from sessionstream.core.decider._evolve import _FINISHED_TYPE
from sessionstream.core.decider._questions import close_open_questions
from sessionstream.core.state import (
    PendingInput,
    RunState,
)
from sessionstream.schemas._base import Payload, make
from sessionstream.schemas.commands import (
    LATEST_CHECKPOINT_REF,
)
from sessionstream.schemas.events import (
    SESSION_LOG,
    ActionDecision,
    CancelRequested,
    CompactionAbandoned,
    InputDropped,
    InputRequeued,
    Progress,
    RunFinished,
    RunQueued,
    RunStarted,
    TerminalStatus,
)


def _start_run(
    em: _Emitter,
    *,
    text: str,
    origin: str,
    source_command_id: str,
    context_ref: str | None,
    timeout_ms: int | None,
    actor: str | None,
    retry_of: str | None = None,
    input: str | None = None,
    approval_kinds: tuple[str, ...] | list[str] = (),
    metadata: dict[str, str] | None = None,
) -> None:
    state = em.state
    from_checkpoint = context_ref == LATEST_CHECKPOINT_REF
    if from_checkpoint:
        # resolved when the run starts (a queued task gets what its predecessors wrote)
        context_ref = state.last_checkpoint
    run_id = run_id_for(f"{state.session_id}/{source_command_id}/{state.runs_started}")
    timeout = min(timeout_ms or em.config.default_run_timeout_ms, em.config.max_run_timeout_ms)
    em.emit(
        run_id,
        "run.started",
        make(
            RunStarted,
            prompt=text,
            origin=origin,
            source_command_id=source_command_id,
            timeout_at=em.now + timeout,
            context_ref=context_ref,
            actor=actor,
            retry_of=retry_of,
            from_checkpoint=from_checkpoint,
            input=input,
            approval_kinds=list(approval_kinds),
            metadata=metadata or None,
        ),
    )


def _finish(
    em: _Emitter,
    status: TerminalStatus,
    *,
    result: str | None = None,
    error: str | None = None,
    retryable: bool = False,
) -> None:
    """Give every pending input its fate, write the terminal event, then start the next
    waiting task, in order."""
    _resolve_pending(em, "run_finished")
    run = em.state.active
    assert run is not None
    requeue: list[PendingInput] = []
    room = em.config.max_queue - len(em.state.queue)
    for i in run.inputs:
        if i.kind == "follow_up" and i.on_run_end == "queue" and len(requeue) < room:
            em.on_run(
                "run.input_requeued",
                make(
                    InputRequeued,
                    source_command_id=i.source_command_id,
                    kind=i.kind,
                    terminal_status=status,
                ),
            )
            requeue.append(i)
        else:
            em.on_run(
                "run.input_dropped",
                make(
                    InputDropped,
                    source_command_id=i.source_command_id,
                    kind=i.kind,
                    reason="run_ended",
                    terminal_status=status,
                ),
            )
    em.on_run(
        "run.finished",
        make(RunFinished, terminal_status=status, result=result, error=error, retryable=retryable),
    )
    for i in requeue:  # their text was already held: the bytes bound still holds
        em.emit(
            SESSION_LOG,
            "run.queued",
            make(
                RunQueued,
                source_command_id=i.source_command_id,
                kind="follow_up",
                text=i.text,
                actor=i.actor,
            ),
        )
    waiting = em.state.queue
    if waiting:
        nxt = waiting[0]
        _start_run(
            em,
            text=nxt.text,
            origin="queued",
            source_command_id=nxt.source_command_id,
            context_ref=nxt.context_ref,
            timeout_ms=nxt.timeout_ms,
            actor=nxt.actor,
            retry_of=nxt.retry_of,
            input=nxt.input_json,
            approval_kinds=nxt.approval_kinds,
            metadata=nxt.metadata,
        )


def _room_for(em: _Emitter, text: str, *, queue: bool, input: str | None = None) -> bool:
    """The bounds of what producers may make the session hold (a prompt's typed input is
    held text too); rejects `queue_full`."""
    problem = _no_room(em, text, queue=queue, input=input)
    if problem is not None:
        em.reject("queue_full", problem)
        return False
    return True


def _no_room(em: _Emitter, text: str, *, queue: bool, input: str | None = None) -> str | None:
    """Why the session cannot hold this text (None: it can)."""
    state, cfg = em.state, em.config
    if queue and len(state.queue) >= cfg.max_queue:
        return f"{len(state.queue)} tasks waiting (maxQueue {cfg.max_queue})"
    if not queue and state.active is not None and len(state.active.inputs) >= cfg.max_inputs:
        return f"{len(state.active.inputs)} steers/follow-ups pending (maxInputs {cfg.max_inputs})"
    held = state.held_bytes() + len(text.encode())
    if input is not None:
        held += len(input.encode())
    if held > cfg.max_held_bytes:
        return f"{held} bytes of text held > maxHeldBytes {cfg.max_held_bytes}"
    return None


def _enqueue(
    em: _Emitter,
    kind: str,
    text: str,
    *,
    front: bool = False,
    context_ref: str | None = None,
    timeout_ms: int | None = None,
    retry_of: str | None = None,
    input: str | None = None,
    approval_kinds: list[str] | None = None,
    metadata: dict[str, str] | None = None,
) -> bool:
    if not _room_for(em, text, queue=True, input=input):
        return False
    em.emit(
        SESSION_LOG,
        "run.queued",
        make(
            RunQueued,
            source_command_id=em.cmd.command_id,
            kind=kind,
            text=text,
            front=front,
            context_ref=context_ref,
            timeout_ms=timeout_ms,
            actor=em.cmd.actor,
            retry_of=retry_of,
            input=input,
            approval_kinds=approval_kinds or [],
            metadata=metadata or None,
        ),
    )
    return True


def _request_cancel(em: _Emitter, reason: str) -> None:
    # every approval still waiting for a person is refused first: nothing of a run being
    # cancelled may be approved later
    _resolve_pending(em, "cancelling")
    run = em.state.active
    assert run is not None
    em.on_run(
        "run.cancel_requested",
        make(
            CancelRequested,
            reason=reason,
            cancel_deadline_at=em.now + em.config.cancel_grace_ms,
            actor=em.cmd.actor,
        ),
    )
    if run.lease_owner is None:
        # nobody executes it: nothing to propagate, cancelled at once
        _finish(em, "cancelled")


def _lose_lease(em: _Emitter, run: RunState, type_: str, payload: Payload) -> None:
    """The holder is gone (released or expired): the generation moves on, fencing it. A
    compaction it had begun is abandoned, so the next holder finds the run `running`. Its
    approvals still waiting are refused first (`lease_lost`): the next holder asks again."""
    _resolve_pending(em, _LEASE_LOST)
    em.on_run(type_, payload, generation=run.generation + 1)
    if run.status == "compacting":
        em.on_run(
            "run.compaction_abandoned",
            make(CompactionAbandoned, worker_id=run.lease_owner or "", reason="lease_lost"),
        )
    _close_open_calls(em, run)


def _resolve_pending(em: _Emitter, reason: str) -> None:
    """Every key of the active run still waiting for a person is denied, in the order the
    keys were first asked, then every open question is closed likewise: before anything
    else the cancel, the loss or the end decides."""
    run = em.state.active
    assert run is not None
    for key, a in run.pending_actions():
        em.on_run(
            "action.denied",
            make(
                ActionDecision,
                idempotency_key=key,
                kind=a.kind,
                reason=reason,
                detail=f"pending approval resolved: {reason}",
            ),
        )
    close_open_questions(em, reason)


def _close_open_calls(em: _Emitter, run: RunState) -> None:
    """Every call the lost holder left open ends, as abandoned: no `tool.started` waits
    forever for a finish its dead worker will never send (a fenced one's would be stale)."""
    for c in run.open_calls:
        em.on_run(
            _FINISHED_TYPE[c.kind],
            make(
                Progress,
                worker_id=run.lease_owner or "",
                name=c.name,
                call_id=c.call_id,
                detail="abandoned: lease_lost",
            ),
        )
