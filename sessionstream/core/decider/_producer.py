"""Producer commands: prompt, send, steer, follow_up, abort."""

from __future__ import annotations

from sessionstream.core.decider._emit import _Emitter
from sessionstream.core.decider._runs import (
    _enqueue,
    _no_room,
    _request_cancel,
    _resolve_pending,
    _room_for,
    _start_run,
)
from sessionstream.schemas._base import make
from sessionstream.schemas.commands import (
    AbortPayload,
    Command,
    FollowUpPayload,
    PromptPayload,
    PromptPolicy,
    SendPayload,
    SteerPayload,
    json_text,
)
from sessionstream.schemas.events import (
    FollowUpQueued,
    RejectionReason,
    Steered,
)


def _prompt(em: _Emitter, cmd: Command) -> None:
    p = cmd.payload_as(PromptPayload)
    if p.retry_of is not None and not _retryable(em, p.retry_of):
        return
    # the input travels and is held as its compact JSON text: nothing after this parses it
    # (a retry carries its own: the session keeps nothing of a finished run's prompt)
    _ask(
        em,
        text=p.text,
        policy=p.policy,
        context_ref=p.context_ref,
        timeout_ms=p.timeout_ms,
        input=None if p.input is None else json_text(p.input),
        actor=cmd.actor,
        retry_of=p.retry_of,
        approval_kinds=p.approval_kinds,
        metadata=p.metadata,
    )


def _ask(
    em: _Emitter,
    *,
    text: str,
    policy: PromptPolicy,
    context_ref: str | None,
    timeout_ms: int | None,
    input: str | None,
    actor: str | None,
    retry_of: str | None = None,
    approval_kinds: list[str] | None = None,
    metadata: dict[str, str] | None = None,
) -> None:
    """A prompt's task: started when idle, else by `policy` (a schedule's firing too)."""
    kinds = approval_kinds or []
    run = em.state.active
    if run is None:
        _start_run(
            em,
            text=text,
            origin="prompt",
            source_command_id=em.cmd.command_id,
            context_ref=context_ref,
            timeout_ms=timeout_ms,
            actor=actor,
            retry_of=retry_of,
            input=input,
            approval_kinds=kinds,
            metadata=metadata,
        )
    elif policy == "reject":
        reason: RejectionReason = (
            "session_compacting" if run.status == "compacting" else "session_busy"
        )
        em.reject(reason, f"run {run.run_id} is {run.status}")
    elif policy == "enqueue":
        _enqueue(
            em,
            "prompt",
            text,
            context_ref=context_ref,
            timeout_ms=timeout_ms,
            retry_of=retry_of,
            input=input,
            approval_kinds=kinds,
            metadata=metadata,
        )
    else:  # interrupt: queue in front, then cancel the active run
        if run.status != "cancelling" and _no_room(em, text, queue=True, input=input) is None:
            # the cancel's refusals of pending approvals come before all else it decides
            _resolve_pending(em, "cancelling")
        queued = _enqueue(
            em,
            "prompt",
            text,
            front=True,
            context_ref=context_ref,
            timeout_ms=timeout_ms,
            retry_of=retry_of,
            input=input,
            approval_kinds=kinds,
            metadata=metadata,
        )
        if queued and run.status != "cancelling":
            _request_cancel(em, "interrupted")


def _retryable(em: _Emitter, run_id: str) -> bool:
    done = em.state.finished_run(run_id)
    if done is None:
        em.reject(
            "unknown_run",
            f"retryOf {run_id} is not a recent finished run of this session",
            target_status="unknown",
        )
        return False
    if not done.retryable:
        em.reject(
            "not_retryable",
            f"run {run_id} ended {done.status}, not retryable",
            target_status=done.status,
        )
        return False
    return True


def _send(em: _Emitter, cmd: Command) -> None:
    p = cmd.payload_as(SendPayload)
    run = em.state.active
    if run is None:
        _start_run(
            em,
            text=p.text,
            origin="send",
            source_command_id=cmd.command_id,
            context_ref=p.context_ref,
            timeout_ms=p.timeout_ms,
            actor=cmd.actor,
        )
    elif run.status == "cancelling":
        _enqueue(em, "prompt", p.text, context_ref=p.context_ref, timeout_ms=p.timeout_ms)
    else:
        _accept_follow_up(em, p.text, "drop")


def _accept_follow_up(em: _Emitter, text: str, on_run_end: str) -> None:
    if not _room_for(em, text, queue=False):
        return
    em.on_run(
        "run.follow_up_queued",
        make(
            FollowUpQueued,
            text=text,
            source_command_id=em.cmd.command_id,
            actor=em.cmd.actor,
            on_run_end=on_run_end,
        ),
    )


def _steer(em: _Emitter, cmd: Command) -> None:
    p = cmd.payload_as(SteerPayload)
    run = em.state.active
    if run is None:
        em.reject("no_active_run")
    elif run.status == "cancelling":
        em.reject("run_cancelling", f"run {run.run_id} is cancelling")
    elif _room_for(em, p.text, queue=False):
        em.on_run(
            "run.steered",
            make(Steered, text=p.text, source_command_id=cmd.command_id, actor=cmd.actor),
        )


def _follow_up(em: _Emitter, cmd: Command) -> None:
    p = cmd.payload_as(FollowUpPayload)
    run = em.state.active
    if run is None:
        if p.when_idle == "reject":
            em.reject("no_active_run")
        else:
            _start_run(
                em,
                text=p.text,
                origin="follow_up",
                source_command_id=cmd.command_id,
                context_ref=None,
                timeout_ms=None,
                actor=cmd.actor,
            )
    elif run.status == "cancelling":
        # the cancelled run will never take it: by `whenIdle` it waits as a task of its
        # own (in arrival order, explicitly queued) or is refused
        if p.when_idle == "reject":
            em.reject("run_cancelling", f"run {run.run_id} is cancelling")
        else:
            _enqueue(em, "follow_up", p.text)
    else:
        _accept_follow_up(em, p.text, p.on_run_end)


def _abort(em: _Emitter, cmd: Command) -> None:
    run = em.state.active
    if run is None:
        em.reject("no_active_run")
    elif run.status == "cancelling":
        em.reject("already_cancelling", f"run {run.run_id} is cancelling")
    else:
        _request_cancel(em, cmd.payload_as(AbortPayload).reason)
