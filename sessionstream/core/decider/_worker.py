"""Worker commands: leases, progress, compaction, cancel acknowledgements, the end of a run."""

from __future__ import annotations

from sessionstream.core.decider._actions import _action_request, _action_result
from sessionstream.core.decider._emit import _Emitter
from sessionstream.core.decider._questions import _question_ask
from sessionstream.core.decider._runs import _finish, _lose_lease, _resolve_pending
from sessionstream.core.state import (
    RunState,
    StepRecord,
)
from sessionstream.schemas._base import make
from sessionstream.schemas.commands import (
    ActionRequestPayload,
    CancelAckPayload,
    Command,
    CompactFinishPayload,
    LeaseAcquirePayload,
    LeaseRenewPayload,
    RunCompletePayload,
    RunFailPayload,
    RunProgressPayload,
    StepRecordPayload,
)
from sessionstream.schemas.events import (
    SESSION_LOG,
    ActionDecision,
    CancelAcknowledged,
    CompactionFinished,
    CompactionStarted,
    ContextCheckpointed,
    FollowUpDelivered,
    InputConsumed,
    InputDelivered,
    LeaseGranted,
    LeaseReleased,
    LeaseRenewed,
    Progress,
    RejectionReason,
    RoundCompleted,
    StaleWriteRecorded,
    StepDelivered,
    StepRecorded,
)


def _worker(em: _Emitter, cmd: Command) -> None:
    state = em.state
    run = state.active
    if run is None or run.run_id != cmd.run_id:
        done = state.finished_run(cmd.run_id or "")
        if done is None:
            em.reject("unknown_run", f"run {cmd.run_id} is neither active nor recent")
        elif cmd.generation is not None and cmd.generation != done.generation:
            em.reject("stale_generation", f"generation {cmd.generation} != {done.generation}")
        elif cmd.type == "action.request":
            a = cmd.payload_as(ActionRequestPayload)
            em.emit(
                SESSION_LOG,
                "action.denied",
                make(
                    ActionDecision,
                    idempotency_key=a.idempotency_key,
                    kind=a.kind,
                    reason="run_finished",
                    detail=f"run {done.run_id} is {done.status}",
                ),
            )
        else:
            em.reject(
                "run_finished", f"run {done.run_id} is {done.status}", target_status=done.status
            )
        return
    if cmd.type == "lease.acquire":
        _acquire(em, cmd, run)
        return
    if cmd.generation != run.generation:
        _stale(em, cmd, run)
        return
    if cmd.worker_id != run.lease_owner:
        em.reject(
            "not_lease_holder", f"lease of generation {run.generation} is held by {run.lease_owner}"
        )
        return
    _WORKER_HANDLERS[cmd.type](em, cmd, run)


def _stale(em: _Emitter, cmd: Command, run: RunState) -> None:
    """Fence a write from another generation: rejected, and kept in the run's trail."""
    em.reject("stale_generation", f"generation {cmd.generation} != current {run.generation}")
    em.on_run(
        "run.stale_write_recorded",
        make(
            StaleWriteRecorded,
            worker_id=cmd.worker_id,
            command_type=cmd.type,
            stale_generation=cmd.generation,
            current_generation=run.generation,
        ),
    )


def _lease_length(em: _Emitter, asked: int) -> tuple[int, bool]:
    cap = em.config.max_lease_ms
    return (cap, True) if asked > cap else (asked, False)


def _acquire(em: _Emitter, cmd: Command, run: RunState) -> None:
    p = cmd.payload_as(LeaseAcquirePayload)
    worker = cmd.worker_id or ""
    ms, capped = _lease_length(em, p.lease_ms)
    if cmd.generation is not None and cmd.generation != run.generation:
        # an old holder coming back asks with the generation it had: fenced, and recorded
        _stale(em, cmd, run)
    elif run.status == "cancelling":
        em.reject("run_cancelling", f"run {run.run_id} is cancelling")
    elif run.lease_owner is None:
        em.on_run(
            "run.lease_granted",
            make(
                LeaseGranted,
                worker_id=worker,
                lease_expires_at=em.now + ms,
                lease_ms=ms,
                capped=capped,
                checkpoint_ref=run.checkpoint_ref,
                steps_delivered=len(run.steps),
            ),
        )
        # what earlier holders never consumed goes to the new one, in arrival order
        for i in run.inputs:
            em.on_run(
                "run.input_delivered",
                make(
                    InputDelivered, source_command_id=i.source_command_id, kind=i.kind, text=i.text
                ),
            )
        # and what they recorded, so that no model or tool step is called again
        for st in run.steps:
            em.on_run(
                "step.delivered",
                make(
                    StepDelivered,
                    step_id=st.step_id,
                    kind=st.kind,
                    name=st.name,
                    input_digest=st.input_digest,
                    result=st.result,
                    result_ref=st.result_ref,
                    generation=st.generation,
                ),
            )
    elif run.lease_owner == worker:
        em.on_run(
            "run.lease_renewed",
            make(
                LeaseRenewed,
                worker_id=worker,
                lease_expires_at=em.now + ms,
                lease_ms=ms,
                capped=capped,
            ),
        )
    else:
        em.reject("lease_held", f"held by {run.lease_owner} until {run.lease_expires_at}")


def _renew(em: _Emitter, cmd: Command, run: RunState) -> None:
    ms, capped = _lease_length(em, cmd.payload_as(LeaseRenewPayload).lease_ms)
    em.on_run(
        "run.lease_renewed",
        make(
            LeaseRenewed,
            worker_id=cmd.worker_id or "",
            lease_expires_at=em.now + ms,
            lease_ms=ms,
            capped=capped,
        ),
    )


def _release(em: _Emitter, cmd: Command, run: RunState) -> None:
    _lose_lease(em, run, "run.lease_released", make(LeaseReleased, worker_id=cmd.worker_id or ""))
    if run.status == "cancelling":
        _finish(em, "cancelled")


def _progress(em: _Emitter, cmd: Command, run: RunState) -> None:
    p = cmd.payload_as(RunProgressPayload)
    em.on_run(
        p.kind,
        make(
            Progress,
            worker_id=cmd.worker_id or "",
            name=p.name,
            call_id=p.call_id,
            detail=p.detail,
            model=p.model,
            input_tokens=p.input_tokens,
            output_tokens=p.output_tokens,
            first_token_ms=p.first_token_ms,
            duration_ms=p.duration_ms,
            finish_reason=p.finish_reason,
            cost_usd=p.cost_usd,
        ),
    )


def _compact_start(em: _Emitter, cmd: Command, run: RunState) -> None:
    if run.status != "running":
        em.reject("invalid_state", f"compact.start while {run.status}")
        return
    em.on_run("run.compaction_started", make(CompactionStarted, worker_id=cmd.worker_id or ""))


def _compact_finish(em: _Emitter, cmd: Command, run: RunState) -> None:
    p = cmd.payload_as(CompactFinishPayload)
    if run.status != "compacting":
        em.reject("invalid_state", f"compact.finish while {run.status}")
        return
    em.on_run(
        "context.checkpointed", make(ContextCheckpointed, uri=p.checkpoint_uri, tokens=p.tokens)
    )
    em.on_run("run.compaction_finished", make(CompactionFinished, uri=p.checkpoint_uri))


def _cancel_ack(em: _Emitter, cmd: Command, run: RunState) -> None:
    p = cmd.payload_as(CancelAckPayload)
    if run.status != "cancelling":
        em.reject("not_cancelling", f"run {run.run_id} is {run.status}")
        return
    em.on_run(
        "run.cancel_acknowledged",
        make(
            CancelAcknowledged,
            worker_id=cmd.worker_id or "",
            model_request_aborted=p.model_request_aborted,
            tools_aborted=p.tools_aborted,
            subtasks_cancelled=p.subtasks_cancelled,
            actions_blocked=p.actions_blocked,
            actions_executing=p.actions_executing,
        ),
    )
    _finish(em, "cancelled")


def _complete(em: _Emitter, cmd: Command, run: RunState) -> None:
    p = cmd.payload_as(RunCompletePayload)
    if run.status != "running":
        reason: RejectionReason = (
            "run_cancelling" if run.status == "cancelling" else "invalid_state"
        )
        em.reject(reason, f"run.complete while {run.status}")
        return
    consumed = {*p.consumed_follow_ups, *p.consumed_steers}
    if not any(i.kind == "follow_up" and i.source_command_id not in consumed for i in run.inputs):
        # the run ends with this completion: its approvals still waiting go first
        _resolve_pending(em, "run_finished")
    for i in run.inputs:
        if i.source_command_id in consumed:
            em.on_run(
                "run.input_consumed",
                make(InputConsumed, source_command_id=i.source_command_id, kind=i.kind),
            )
    active = em.state.active
    assert active is not None
    missed = [i for i in active.inputs if i.kind == "follow_up"]
    if missed:
        # follow-ups arrive before the run would finish: the run goes on to take them, and
        # this round's result is kept on the log
        em.on_run("run.round_completed", make(RoundCompleted, result=p.result))
        for i in missed:
            em.on_run(
                "run.follow_up_delivered",
                make(FollowUpDelivered, text=i.text, source_command_id=i.source_command_id),
            )
        return
    _finish(em, "completed", result=p.result)


def _fail(em: _Emitter, cmd: Command, run: RunState) -> None:
    p = cmd.payload_as(RunFailPayload)
    if run.status == "cancelling":
        em.reject("run_cancelling", "a cancelling run ends with cancel.ack")
        return
    _finish(em, "failed", error=p.error, retryable=p.retryable)


def _step_record(em: _Emitter, cmd: Command, run: RunState) -> None:
    """Record a finished step once: the first record of a step id stands, and the run's
    records stay within their bounds (the state holds them for the next holder)."""
    p = cmd.payload_as(StepRecordPayload)
    cfg = em.config
    if run.step(p.step_id) is not None:
        em.reject("step_already_recorded", f"step {p.step_id!r} is recorded; the first stands")
        return
    rec = StepRecord(
        step_id=p.step_id,
        kind=p.kind,
        name=p.name,
        input_digest=p.input_digest,
        result=p.result,
        result_ref=p.result_ref,
        generation=run.generation,
    )
    inline = len((p.result or "").encode()) + len((p.result_ref or "").encode())
    if inline > cfg.max_step_result_bytes:
        em.reject(
            "step_too_large",
            f"{inline} bytes of result > maxStepResultBytes {cfg.max_step_result_bytes}: "
            "record a resultRef",
        )
        return
    if len(run.steps) >= cfg.max_steps:
        em.reject("too_many_steps", f"{len(run.steps)} steps recorded (maxSteps {cfg.max_steps})")
        return
    held = sum(st.held_bytes() for st in run.steps) + rec.held_bytes()
    if held > cfg.max_run_step_bytes:
        em.reject(
            "too_many_steps",
            f"{held} bytes of steps held > maxRunStepBytes {cfg.max_run_step_bytes}",
        )
        return
    em.on_run(
        "step.recorded",
        make(
            StepRecorded,
            worker_id=cmd.worker_id or "",
            step_id=p.step_id,
            kind=p.kind,
            name=p.name,
            input_digest=p.input_digest,
            input=p.input,
            result=p.result,
            result_ref=p.result_ref,
        ),
    )


_WORKER_HANDLERS = {
    "lease.renew": _renew,
    "lease.release": _release,
    "run.progress": _progress,
    "compact.start": _compact_start,
    "compact.finish": _compact_finish,
    "action.request": _action_request,
    "action.result": _action_result,
    "question.ask": _question_ask,
    "cancel.ack": _cancel_ack,
    "run.complete": _complete,
    "run.fail": _fail,
    "step.record": _step_record,
}
