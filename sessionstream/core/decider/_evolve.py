"""`evolve(state, event) -> state` and `fold`: the one place events change the state."""

from __future__ import annotations

from typing import Any, Final, Literal

from sessionstream.core.decider._base import (
    _LEASE_LOST,
    _UNRECORDED,
    DEFAULT_CONFIG,
    TOO_MANY_QUESTIONS,
    DeciderConfig,
)
from sessionstream.core.state import (
    ActionRecord,
    FinishedRun,
    OpenCall,
    PendingInput,
    QuestionRecord,
    QueueEntry,
    RemovedTask,
    RunState,
    Schedule,
    SessionState,
    StepRecord,
    evolved,
)
from sessionstream.schemas.events import (
    SESSION_LOG,
    ActionCompleted,
    ActionDecision,
    ActionPending,
    CancelRequested,
    ContextCheckpointed,
    Event,
    FollowUpQueued,
    InputConsumed,
    InputDropped,
    InputRequeued,
    LeaseGranted,
    LeaseRenewed,
    Progress,
    RunDequeued,
    RunFinished,
    RunQueued,
    RunStarted,
    ScheduleDefined,
    ScheduleDeleted,
    ScheduleFired,
    Steered,
    StepRecorded,
)
from sessionstream.schemas.questions import QuestionAnswered, QuestionAsked, QuestionClosed


def evolve(
    state: SessionState, event: Event, config: DeciderConfig = DEFAULT_CONFIG
) -> SessionState:
    """Apply one event. One branch per event type; unknown types cannot reach here."""
    update: dict[str, Any] = {}
    if event.ts > state.clock:
        update["clock"] = event.ts

    if event.run_id == SESSION_LOG:
        update["log_seq"] = event.seq
        if event.type == "run.queued":
            q = event.payload_as(RunQueued)
            entry = QueueEntry(
                source_command_id=q.source_command_id,
                kind=q.kind,
                text=q.text,
                context_ref=q.context_ref,
                timeout_ms=q.timeout_ms,
                actor=q.actor,
                retry_of=q.retry_of,
                input_json=q.input,
                approval_kinds=tuple(q.approval_kinds),
                metadata=q.metadata or {},
            )
            update["queue"] = (entry, *state.queue) if q.front else (*state.queue, entry)
        elif event.type == "run.dequeued":
            out = event.payload_as(RunDequeued)
            gone = RemovedTask(
                source_command_id=out.source_command_id, reason=out.reason, actor=out.actor
            )
            # the first waiting task of that id leaves (ids are unique in the queue while
            # the dedup window holds them)
            queue = list(state.queue)
            for i, w in enumerate(queue):
                if w.source_command_id == out.source_command_id:
                    del queue[i]
                    break
            update["queue"] = tuple(queue)
            update["removed"] = (*state.removed, gone)[-config.finished_window :]
        elif event.type == "session.erased":
            # nothing of the session's content stays: its id, tenant, clock and counters
            # (so a later run or session-log event never gets an erased event's key)
            return SessionState(
                session_id=state.session_id,
                tenant_id=state.tenant_id,
                log_seq=event.seq,
                runs_started=state.runs_started,
                clock=update.get("clock", state.clock),
                erased_at=event.ts,
            )
        elif event.type.startswith("schedule."):
            update["schedules"] = _schedules_after(state, event)
            if state.tenant_id is None:  # a schedule, like a run, gives the session its owner
                update["tenant_id"] = event.tenant_id
        # command.rejected, action.denied for finished runs: recorded outcomes that change
        # nothing else
        return evolved(state, **update)

    if event.type == "run.started":
        p = event.payload_as(RunStarted)
        update["active"] = RunState(
            run_id=event.run_id,
            status="running",
            seq=event.seq,
            generation=event.generation,
            started_at=event.ts,
            timeout_at=p.timeout_at,
            prompt=p.prompt,
            context_ref=p.context_ref,
            source_command_id=p.source_command_id,
            actor=p.actor,
            input_json=p.input,
            approval_kinds=tuple(p.approval_kinds),
        )
        update["runs_started"] = state.runs_started + 1
        update["idle_since"] = None
        update["queue"] = tuple(
            q for q in state.queue if q.source_command_id != p.source_command_id
        )
        if state.tenant_id is None:
            update["tenant_id"] = event.tenant_id
        return evolved(state, **update)

    run = state.active
    if run is None or run.run_id != event.run_id:
        raise ValueError(f"{event.type} for {event.run_id}, which is not the active run")
    r: dict[str, Any] = {"seq": event.seq, "generation": event.generation}
    t = event.type
    if t == "run.lease_granted":
        g = event.payload_as(LeaseGranted)
        r.update(lease_owner=g.worker_id, lease_expires_at=g.lease_expires_at)
    elif t == "run.lease_renewed":
        r["lease_expires_at"] = event.payload_as(LeaseRenewed).lease_expires_at
    elif t in ("run.lease_released", "run.lease_expired"):
        r.update(lease_owner=None, lease_expires_at=None, last_holder=run.lease_owner)
    elif t == "run.steered":
        s = event.payload_as(Steered)
        pending = PendingInput(
            source_command_id=s.source_command_id or event.command_id,
            kind="steer",
            text=s.text,
            actor=s.actor,
        )
        r["inputs"] = (*run.inputs, pending)
    elif t == "run.follow_up_queued":
        f = event.payload_as(FollowUpQueued)
        pending = PendingInput(
            source_command_id=f.source_command_id,
            kind="follow_up",
            text=f.text,
            on_run_end=f.on_run_end,
            actor=f.actor,
        )
        r["inputs"] = (*run.inputs, pending)
    elif t in ("run.input_consumed", "run.input_dropped", "run.input_requeued"):
        fate = event.payload
        assert isinstance(fate, InputConsumed | InputDropped | InputRequeued)
        r["inputs"] = tuple(i for i in run.inputs if i.source_command_id != fate.source_command_id)
    elif t in _CALL_STARTED or t in _CALL_FINISHED:
        p_ = event.payload_as(Progress)
        if p_.call_id is not None:
            r["open_calls"] = _calls_after(run.open_calls, t, p_, config)
    elif t == "step.recorded":
        st = event.payload_as(StepRecorded)
        rec = StepRecord(
            step_id=st.step_id,
            kind=st.kind,
            name=st.name,
            input_digest=st.input_digest,
            result=st.result,
            result_ref=st.result_ref,
            generation=event.generation,
        )
        r["steps"] = (*run.steps, rec)
    elif t == "context.checkpointed":
        r["checkpoint_ref"] = update["last_checkpoint"] = event.payload_as(ContextCheckpointed).uri
    elif t == "run.compaction_started":
        r["status"] = "compacting"
    elif t in ("run.compaction_finished", "run.compaction_abandoned"):
        r["status"] = "running"
    elif t == "action.pending":
        ap = event.payload_as(ActionPending)
        r["actions"] = {
            **run.actions,
            ap.idempotency_key: ActionRecord(
                kind=ap.kind,
                decision="pending",
                args_digest=ap.args_digest,
                expires_at=ap.expires_at,
                generation=event.generation,
            ),
        }
    elif t in ("action.approved", "action.denied"):
        d = event.payload_as(ActionDecision)
        prev = run.actions.get(d.idempotency_key)
        # a key is decided once: its first decision, or the one that ends its wait for a
        # person (a pending key, or one whose holder lost the lease while it was pending).
        # A retry refused while cancelling is not recorded, nor the refusal of a run that
        # asked for too many keys, nor a repeat with other arguments
        if d.reason not in _UNRECORDED and (
            prev is None
            or prev.decision == "pending"
            or (prev.decision == "denied" and prev.reason == _LEASE_LOST)
        ):
            decision: Literal["approved", "denied"] = (
                "approved" if t == "action.approved" else "denied"
            )
            reason = d.reason if decision == "denied" else None
            action = (
                ActionRecord(kind=d.kind, decision=decision, reason=reason)
                if prev is None
                else evolved(prev, decision=decision, reason=reason)
            )
            r["actions"] = {**run.actions, d.idempotency_key: action}
    elif t == "question.asked":
        qa = event.payload_as(QuestionAsked)
        r["questions"] = {
            **run.questions,
            qa.question_id: QuestionRecord(
                status="open", expires_at=qa.expires_at, generation=event.generation
            ),
        }
    elif t == "question.answered":
        an = event.payload_as(QuestionAnswered)
        asked = run.questions[an.question_id]
        r["questions"] = {
            **run.questions,
            an.question_id: evolved(
                asked, status="answered", answer=an.answer, answered_by=an.answered_by
            ),
        }
    elif t == "question.closed":
        qc = event.payload_as(QuestionClosed)
        prev_q = run.questions.get(qc.question_id)
        # a question refused for being one too many is not recorded: its id stays free
        if prev_q is not None:
            r["questions"] = {
                **run.questions,
                qc.question_id: evolved(prev_q, status="closed", reason=qc.reason),
            }
        elif qc.reason != TOO_MANY_QUESTIONS:
            r["questions"] = {
                **run.questions,
                qc.question_id: QuestionRecord(
                    status="closed",
                    expires_at=event.ts,
                    generation=event.generation,
                    reason=qc.reason,
                ),
            }
    elif t == "action.completed":
        key = event.payload_as(ActionCompleted).idempotency_key
        r["actions"] = {**run.actions, key: evolved(run.actions[key], completed=True)}
    elif t == "run.cancel_requested":
        c = event.payload_as(CancelRequested)
        r.update(
            status="cancelling",
            cancel_requested_at=event.ts,
            cancel_deadline_at=c.cancel_deadline_at,
        )
    elif t == "run.finished":
        f_ = event.payload_as(RunFinished)
        done = FinishedRun(
            run_id=run.run_id,
            status=f_.terminal_status,
            generation=event.generation,
            retryable=f_.retryable,
            source_command_id=run.source_command_id,
        )
        update["active"] = None
        update["finished"] = (*state.finished, done)[-config.finished_window :]
        # the session is idle from here (a queued task's run.started clears it again)
        update["idle_since"] = event.ts
        return evolved(state, **update)
    # model.*, tool.*, subtask.*, step.delivered, action.decision_replayed, question.replayed,
    # run.input_delivered, run.round_completed, run.follow_up_delivered,
    # run.cancel_acknowledged,
    # run.stale_write_recorded: appended to the run, seq advances
    update["active"] = evolved(run, **r)
    return evolved(state, **update)


#: progress event type -> the kind of call it starts / ends
_CALL_STARTED: Final = {
    "model.request.started": "model",
    "tool.started": "tool",
    "subtask.started": "subtask",
}


_CALL_FINISHED: Final = {
    "model.request.finished": "model",
    "tool.finished": "tool",
    "subtask.finished": "subtask",
}


_FINISHED_TYPE: Final = {kind: t for t, kind in _CALL_FINISHED.items()}


def _schedules_after(state: SessionState, event: Event) -> tuple[Schedule, ...]:
    """The schedules after a `schedule.*` event: its times are copied, never computed."""
    t = event.type
    if t == "schedule.fired":
        f = event.payload_as(ScheduleFired)
        return tuple(
            evolved(sc, next_nominal_at=f.next_nominal_at, next_at=f.next_at, caught_up=f.caught_up)
            if sc.schedule_id == f.schedule_id
            else sc
            for sc in state.schedules
        )
    if t == "schedule.deleted":
        gone = event.payload_as(ScheduleDeleted).schedule_id
        return tuple(sc for sc in state.schedules if sc.schedule_id != gone)
    d = event.payload_as(ScheduleDefined)  # created / updated
    new = Schedule(
        schedule_id=d.schedule_id,
        revision=event.seq,
        cron=d.cron,
        timezone=d.timezone,
        interval_ms=d.interval_ms,
        anchor_at=d.anchor_at,
        text=d.text,
        input_json=d.input,
        timeout_ms=d.timeout_ms,
        context_ref=d.context_ref,
        overlap=d.overlap,
        catch_up=d.catch_up,
        max_catch_up=d.max_catch_up,
        jitter_ms=d.jitter_ms,
        next_nominal_at=d.next_nominal_at,
        next_at=d.next_at,
        actor=d.actor,
        metadata=d.metadata or {},
    )
    if t == "schedule.created":
        return (*state.schedules, new)
    return tuple(new if sc.schedule_id == d.schedule_id else sc for sc in state.schedules)


def _calls_after(
    calls: tuple[OpenCall, ...], t: str, p: Progress, config: DeciderConfig
) -> tuple[OpenCall, ...]:
    if t in _CALL_STARTED:
        if len(calls) >= config.max_open_calls:
            return calls  # beyond the bound a call is not tracked (nor closed for its holder)
        kind: Any = _CALL_STARTED[t]
        return (*calls, OpenCall(kind=kind, name=p.name, call_id=p.call_id or ""))
    kind = _CALL_FINISHED[t]
    for i, c in enumerate(calls):
        if c.kind == kind and c.call_id == p.call_id:
            return (*calls[:i], *calls[i + 1 :])
    return calls


def fold(
    events: list[Event], session_id: str, config: DeciderConfig = DEFAULT_CONFIG
) -> SessionState:
    """The state a log of one session's events implies."""
    state = SessionState.initial(session_id)
    for e in events:
        state = evolve(state, e, config)
    return state
