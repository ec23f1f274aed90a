"""The session decider: `decide(state, command) -> events`, `evolve(state, event) -> state`.

Pure and deterministic: no clock, no randomness, no I/O. Time comes in `command.ts`, run ids
are uuid5 of the session, the causing command and the session's run counter, so the same
commands in the same order give byte-identical events. Every command gets exactly one
visible outcome: the events it caused, one `command.rejected` (with its reason), or nothing
for a `commandId` already seen within the dedup window.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Final

from schemas._base import Payload
from schemas.commands import (
    AbortPayload,
    ActionRequestPayload,
    ActionResultPayload,
    CancelAckPayload,
    Command,
    CompactFinishPayload,
    FollowUpPayload,
    LeaseAcquirePayload,
    LeaseRenewPayload,
    PromptPayload,
    RunCompletePayload,
    RunFailPayload,
    RunProgressPayload,
    SendPayload,
    SteerPayload,
    TimerFiredPayload,
)
from schemas.events import (
    SESSION_LOG,
    ActionCompleted,
    ActionDecision,
    ActionDecisionReplayed,
    CancelAcknowledged,
    CancelRequested,
    CommandRejected,
    CompactionFinished,
    CompactionStarted,
    ContextCheckpointed,
    Event,
    FollowUpDelivered,
    FollowUpQueued,
    LeaseExpired,
    LeaseGranted,
    LeaseReleased,
    LeaseRenewed,
    Progress,
    RunFinished,
    RunQueued,
    RunStarted,
    StaleWriteRecorded,
    Steered,
)
from streams.state import (
    ActionRecord,
    FinishedRun,
    QueueEntry,
    RunState,
    SessionState,
    command_hash,
)

__all__ = [
    "DEFAULT_CONFIG",
    "REJECTION_REASONS",
    "RUN_ID_NAMESPACE",
    "DeciderConfig",
    "apply",
    "decide",
    "evolve",
    "fold",
]

#: namespace of run ids: uuid5(RUN_ID_NAMESPACE, "{session}/{command}/{n}")
RUN_ID_NAMESPACE: Final = uuid.UUID("6f0c2d4e-5b1a-5c8e-9a57-0d1f2e3c4b5a")

#: every reason a `command.rejected` event can carry
REJECTION_REASONS: Final[frozenset[str]] = frozenset(
    {
        "tenant_mismatch",
        "payload_too_large",
        "session_busy",
        "session_compacting",
        "queue_full",
        "no_active_run",
        "run_cancelling",
        "already_cancelling",
        "stale_generation",
        "not_lease_holder",
        "unknown_run",
        "run_finished",
        "lease_held",
        "invalid_state",
        "unknown_action",
        "action_already_completed",
        "not_cancelling",
        "timer_stale",
    }
)


@dataclass(frozen=True)
class DeciderConfig:
    """Limits and defaults. Part of the decider's input: change it and replay changes too."""

    #: a payload larger than this (as JSON) is rejected with `payload_too_large`
    max_payload_bytes: int = 256 * 1024
    #: run deadline when the prompt names none, and the most a prompt may ask for
    default_run_timeout_ms: int = 10 * 60 * 1000
    max_run_timeout_ms: int = 24 * 60 * 60 * 1000
    #: how long a holder has to acknowledge a cancel before its lease is taken away
    cancel_grace_ms: int = 30 * 1000
    #: command ids remembered per session for duplicate detection (64-bit digests)
    dedup_window: int = 512
    #: prompts / follow-ups that may wait per session
    max_queue: int = 100
    #: terminal runs remembered per session, to answer their late writers precisely
    finished_window: int = 16


DEFAULT_CONFIG: Final = DeciderConfig()


# ------------------------------------------------------------------------------------------
# evolve
# ------------------------------------------------------------------------------------------


def evolve(
    state: SessionState, event: Event, config: DeciderConfig = DEFAULT_CONFIG
) -> SessionState:
    """Apply one event. One branch per event type; unknown types cannot reach here."""
    h = command_hash(event.command_id)
    recent = state.recent_commands
    if not recent or recent[-1] != h:
        recent = (*recent, h)[-config.dedup_window :]
    update: dict[str, Any] = {"recent_commands": recent}

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
            )
            update["queue"] = (entry, *state.queue) if q.front else (*state.queue, entry)
        # command.rejected, run.stale_write_recorded, action.denied / action.decision_replayed
        # for finished runs: recorded outcomes that change nothing else
        return state.model_copy(update=update)

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
        )
        update["runs_started"] = state.runs_started + 1
        update["queue"] = tuple(
            q for q in state.queue if q.source_command_id != p.source_command_id
        )
        if state.tenant_id is None:
            update["tenant_id"] = event.tenant_id
        return state.model_copy(update=update)

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
        r.update(lease_owner=None, lease_expires_at=None)
    elif t == "run.follow_up_queued":
        f = event.payload_as(FollowUpQueued)
        entry = QueueEntry(
            source_command_id=f.source_command_id, kind="follow_up", text=f.text, run_id=run.run_id
        )
        update["queue"] = (*state.queue, entry)
    elif t == "run.follow_up_delivered":
        src = event.payload_as(FollowUpDelivered).source_command_id
        update["queue"] = tuple(q for q in state.queue if q.source_command_id != src)
    elif t == "run.compaction_started":
        r["status"] = "compacting"
    elif t == "run.compaction_finished":
        r["status"] = "running"
    elif t in ("action.approved", "action.denied") and (
        event.payload_as(ActionDecision).idempotency_key not in run.actions
    ):
        # only a key's first decision is recorded (a retry refused while cancelling is not)
        d = event.payload_as(ActionDecision)
        decision = "approved" if t == "action.approved" else "denied"
        r["actions"] = {
            **run.actions,
            d.idempotency_key: ActionRecord(kind=d.kind, decision=decision),
        }
    elif t == "action.completed":
        key = event.payload_as(ActionCompleted).idempotency_key
        r["actions"] = {**run.actions, key: run.actions[key].model_copy(update={"completed": True})}
    elif t == "run.cancel_requested":
        c = event.payload_as(CancelRequested)
        r.update(
            status="cancelling",
            cancel_requested_at=event.ts,
            cancel_deadline_at=c.cancel_deadline_at,
        )
    elif t == "run.finished":
        status = event.payload_as(RunFinished).terminal_status
        done = FinishedRun(run_id=run.run_id, status=status, generation=event.generation)
        update["active"] = None
        update["finished"] = (*state.finished, done)[-config.finished_window :]
        # follow-ups the run never got become ordinary waiting entries, in their order
        update["queue"] = tuple(
            q.model_copy(update={"run_id": None}) if q.run_id == run.run_id else q
            for q in state.queue
        )
        return state.model_copy(update=update)
    # run.steered, model.*, tool.*, subtask.*, context.checkpointed, action.decision_replayed,
    # run.cancel_acknowledged, run.stale_write_recorded: appended to the run, seq advances
    update["active"] = run.model_copy(update=r)
    return state.model_copy(update=update)


def fold(
    events: list[Event], session_id: str, config: DeciderConfig = DEFAULT_CONFIG
) -> SessionState:
    """The state a log of one session's events implies."""
    state = SessionState.initial(session_id)
    for e in events:
        state = evolve(state, e, config)
    return state


# ------------------------------------------------------------------------------------------
# decide
# ------------------------------------------------------------------------------------------


class _Emitter:
    """Builds events for one command, folding each into the state as it goes."""

    def __init__(self, state: SessionState, command: Command, config: DeciderConfig) -> None:
        self.state = state
        self.cmd = command
        self.config = config
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
        event = Event(
            session_id=self.cmd.session_id,
            run_id=run_id,
            seq=seq,
            type=type_,
            payload=payload,
            generation=gen if generation is None else generation,
            command_id=self.cmd.command_id,
            ts=self.cmd.ts,
            tenant_id=self.state.tenant_id or self.cmd.tenant_id,
        )
        self.events.append(event)
        self.state = evolve(self.state, event, self.config)

    def on_run(self, type_: str, payload: Payload, *, generation: int | None = None) -> None:
        run = self.state.active
        assert run is not None
        self.emit(run.run_id, type_, payload, generation=generation)

    def reject(self, reason: str, detail: str | None = None) -> None:
        assert reason in REJECTION_REASONS, reason
        self.emit(
            SESSION_LOG,
            "command.rejected",
            CommandRejected(
                reason=reason,
                command_type=self.cmd.type,
                target_run_id=self.cmd.run_id,
                detail=detail,
            ),
        )


def decide(
    state: SessionState | None, command: Command, config: DeciderConfig = DEFAULT_CONFIG
) -> list[Event]:
    """The events `command` causes in `state` (empty for a duplicate `commandId`)."""
    return apply(state, command, config)[0]


def apply(
    state: SessionState | None, command: Command, config: DeciderConfig = DEFAULT_CONFIG
) -> tuple[list[Event], SessionState]:
    """`decide` and the state after folding its events, in one pass."""
    if state is None:
        state = SessionState.initial(command.session_id)
    if state.session_id != command.session_id:
        raise ValueError(f"command for {command.session_id} given state of {state.session_id}")
    if command_hash(command.command_id) in state.recent_commands:
        return [], state
    em = _Emitter(state, command, config)
    _route(em, command)
    return em.events, em.state


def _route(em: _Emitter, cmd: Command) -> None:
    state = em.state
    if state.tenant_id is not None and cmd.tenant_id != state.tenant_id:
        em.reject("tenant_mismatch", f"session belongs to another tenant than {cmd.tenant_id!r}")
        return
    size = len(cmd.payload.__pydantic_serializer__.to_json(cmd.payload))
    if size > em.config.max_payload_bytes:
        em.reject("payload_too_large", f"{size} bytes > {em.config.max_payload_bytes}")
        return
    handler = _HANDLERS.get(cmd.type)
    if handler is not None:
        handler(em, cmd)
    else:
        _worker(em, cmd)


# -- runs starting and ending -----------------------------------------------------------------


def _start_run(
    em: _Emitter,
    *,
    text: str,
    origin: str,
    source_command_id: str,
    context_ref: str | None,
    timeout_ms: int | None,
) -> None:
    state = em.state
    run_id = str(
        uuid.uuid5(RUN_ID_NAMESPACE, f"{state.session_id}/{source_command_id}/{state.runs_started}")
    )
    timeout = min(timeout_ms or em.config.default_run_timeout_ms, em.config.max_run_timeout_ms)
    em.emit(
        run_id,
        "run.started",
        RunStarted(
            prompt=text,
            origin=origin,
            source_command_id=source_command_id,
            timeout_at=em.cmd.ts + timeout,
            context_ref=context_ref,
        ),
    )


def _finish(
    em: _Emitter, status: str, *, result: str | None = None, error: str | None = None
) -> None:
    """Write the terminal event, then start the next waiting prompt or follow-up, in order."""
    em.on_run("run.finished", RunFinished(terminal_status=status, result=result, error=error))
    waiting = em.state.waiting()
    if waiting:
        nxt = waiting[0]
        _start_run(
            em,
            text=nxt.text,
            origin="queued",
            source_command_id=nxt.source_command_id,
            context_ref=nxt.context_ref,
            timeout_ms=nxt.timeout_ms,
        )


def _enqueue(
    em: _Emitter,
    kind: str,
    text: str,
    *,
    front: bool = False,
    context_ref: str | None = None,
    timeout_ms: int | None = None,
) -> None:
    if len(em.state.queue) >= em.config.max_queue:
        em.reject("queue_full", f"{len(em.state.queue)} entries waiting")
        return
    em.emit(
        SESSION_LOG,
        "run.queued",
        RunQueued(
            source_command_id=em.cmd.command_id,
            kind=kind,
            text=text,
            front=front,
            context_ref=context_ref,
            timeout_ms=timeout_ms,
        ),
    )


def _request_cancel(em: _Emitter, reason: str) -> None:
    run = em.state.active
    assert run is not None
    em.on_run(
        "run.cancel_requested",
        CancelRequested(reason=reason, cancel_deadline_at=em.cmd.ts + em.config.cancel_grace_ms),
    )
    if run.lease_owner is None:
        # nobody executes it: nothing to propagate, cancelled at once
        _finish(em, "cancelled")


# -- producer commands ------------------------------------------------------------------------


def _prompt(em: _Emitter, cmd: Command) -> None:
    p = cmd.payload_as(PromptPayload)
    run = em.state.active
    if run is None:
        _start_run(
            em,
            text=p.text,
            origin="prompt",
            source_command_id=cmd.command_id,
            context_ref=p.context_ref,
            timeout_ms=p.timeout_ms,
        )
    elif p.policy == "reject":
        reason = "session_compacting" if run.status == "compacting" else "session_busy"
        em.reject(reason, f"run {run.run_id} is {run.status}")
    elif p.policy == "enqueue":
        _enqueue(em, "prompt", p.text, context_ref=p.context_ref, timeout_ms=p.timeout_ms)
    else:  # interrupt: queue in front, then cancel the active run
        _enqueue(
            em, "prompt", p.text, front=True, context_ref=p.context_ref, timeout_ms=p.timeout_ms
        )
        if em.events[-1].type == "run.queued" and run.status != "cancelling":
            _request_cancel(em, "interrupted")


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
        )
    elif run.status == "cancelling":
        _enqueue(em, "prompt", p.text, context_ref=p.context_ref, timeout_ms=p.timeout_ms)
    else:
        _queue_follow_up(em, p.text)


def _queue_follow_up(em: _Emitter, text: str) -> None:
    if len(em.state.queue) >= em.config.max_queue:
        em.reject("queue_full", f"{len(em.state.queue)} entries waiting")
        return
    em.on_run(
        "run.follow_up_queued", FollowUpQueued(text=text, source_command_id=em.cmd.command_id)
    )


def _steer(em: _Emitter, cmd: Command) -> None:
    p = cmd.payload_as(SteerPayload)
    run = em.state.active
    if run is None:
        em.reject("no_active_run")
    elif run.status == "cancelling":
        em.reject("run_cancelling", f"run {run.run_id} is cancelling")
    else:
        em.on_run("run.steered", Steered(text=p.text))


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
            )
    elif run.status == "cancelling":
        # the cancelled run will never take it: it waits for the next run
        _enqueue(em, "follow_up", p.text)
    else:
        _queue_follow_up(em, p.text)


def _abort(em: _Emitter, cmd: Command) -> None:
    run = em.state.active
    if run is None:
        em.reject("no_active_run")
    elif run.status == "cancelling":
        em.reject("already_cancelling", f"run {run.run_id} is cancelling")
    else:
        _request_cancel(em, cmd.payload_as(AbortPayload).reason)


# -- timers -------------------------------------------------------------------------------------


def _timer(em: _Emitter, cmd: Command) -> None:
    p = cmd.payload_as(TimerFiredPayload)
    run = em.state.active
    if run is None or run.run_id != cmd.run_id:
        em.reject("timer_stale", f"run {cmd.run_id} is not active")
        return
    now = cmd.ts
    if p.kind == "lease_expiry":
        fresh = cmd.generation is None or cmd.generation == run.generation
        if (
            run.lease_owner is None
            or run.lease_expires_at is None
            or run.lease_expires_at > now
            or not fresh
        ):
            em.reject("timer_stale", "lease renewed, released or already expired")
            return
        em.on_run(
            "run.lease_expired",
            LeaseExpired(worker_id=run.lease_owner, reason="lease_expiry"),
            generation=run.generation + 1,
        )
        if run.status == "cancelling":
            _finish(em, "cancelled")
    elif p.kind == "run_deadline":
        if run.timeout_at > now:
            em.reject("timer_stale", f"deadline {run.timeout_at} not reached at {now}")
            return
        _finish(em, "timed_out", error=f"deadline {run.timeout_at} passed")
    else:  # cancel_deadline
        if (
            run.status != "cancelling"
            or run.cancel_deadline_at is None
            or run.cancel_deadline_at > now
        ):
            em.reject("timer_stale", "run not cancelling or cancel deadline not reached")
            return
        if run.lease_owner is not None:
            em.on_run(
                "run.lease_expired",
                LeaseExpired(worker_id=run.lease_owner, reason="cancel_deadline"),
                generation=run.generation + 1,
            )
        _finish(em, "cancelled")


# -- worker commands ----------------------------------------------------------------------------


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
                ActionDecision(
                    idempotency_key=a.idempotency_key,
                    kind=a.kind,
                    reason="run_finished",
                    detail=f"run {done.run_id} is {done.status}",
                ),
            )
        else:
            em.reject("run_finished", f"run {done.run_id} is {done.status}")
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
        StaleWriteRecorded(
            worker_id=cmd.worker_id,
            command_type=cmd.type,
            stale_generation=cmd.generation,
            current_generation=run.generation,
        ),
    )


def _acquire(em: _Emitter, cmd: Command, run: RunState) -> None:
    p = cmd.payload_as(LeaseAcquirePayload)
    worker = cmd.worker_id or ""
    if cmd.generation is not None and cmd.generation != run.generation:
        # an old holder coming back asks with the generation it had: fenced, and recorded
        _stale(em, cmd, run)
    elif run.status == "cancelling":
        em.reject("run_cancelling", f"run {run.run_id} is cancelling")
    elif run.lease_owner is None:
        em.on_run(
            "run.lease_granted",
            LeaseGranted(worker_id=worker, lease_expires_at=cmd.ts + p.lease_ms),
        )
    elif run.lease_owner == worker:
        em.on_run(
            "run.lease_renewed",
            LeaseRenewed(worker_id=worker, lease_expires_at=cmd.ts + p.lease_ms),
        )
    else:
        em.reject("lease_held", f"held by {run.lease_owner} until {run.lease_expires_at}")


def _renew(em: _Emitter, cmd: Command, run: RunState) -> None:
    p = cmd.payload_as(LeaseRenewPayload)
    em.on_run(
        "run.lease_renewed",
        LeaseRenewed(worker_id=cmd.worker_id or "", lease_expires_at=cmd.ts + p.lease_ms),
    )


def _release(em: _Emitter, cmd: Command, run: RunState) -> None:
    em.on_run(
        "run.lease_released",
        LeaseReleased(worker_id=cmd.worker_id or ""),
        generation=run.generation + 1,
    )
    if run.status == "cancelling":
        _finish(em, "cancelled")


def _progress(em: _Emitter, cmd: Command, run: RunState) -> None:
    p = cmd.payload_as(RunProgressPayload)
    em.on_run(
        p.kind,
        Progress(worker_id=cmd.worker_id or "", name=p.name, call_id=p.call_id, detail=p.detail),
    )


def _compact_start(em: _Emitter, cmd: Command, run: RunState) -> None:
    if run.status != "running":
        em.reject("invalid_state", f"compact.start while {run.status}")
        return
    em.on_run("run.compaction_started", CompactionStarted(worker_id=cmd.worker_id or ""))


def _compact_finish(em: _Emitter, cmd: Command, run: RunState) -> None:
    p = cmd.payload_as(CompactFinishPayload)
    if run.status != "compacting":
        em.reject("invalid_state", f"compact.finish while {run.status}")
        return
    em.on_run("context.checkpointed", ContextCheckpointed(uri=p.checkpoint_uri, tokens=p.tokens))
    em.on_run("run.compaction_finished", CompactionFinished(uri=p.checkpoint_uri))


def _action_request(em: _Emitter, cmd: Command, run: RunState) -> None:
    p = cmd.payload_as(ActionRequestPayload)
    first = run.actions.get(p.idempotency_key)
    if (
        first is not None
        and run.status == "cancelling"
        and first.decision == "approved"
        and (not first.completed)
    ):
        # a worker retrying an approved action it has not finished (it crashed, or lost the
        # result) must not act once the run is being cancelled: the email that arrives
        # minutes after the user pressed stop is what the gate exists to prevent
        em.on_run(
            "action.denied",
            ActionDecision(
                idempotency_key=p.idempotency_key,
                kind=first.kind,
                reason="cancelling",
                detail="approved before the cancel; not retried",
            ),
        )
    elif first is not None:
        em.on_run(
            "action.decision_replayed",
            ActionDecisionReplayed(
                idempotency_key=p.idempotency_key, kind=first.kind, decision=first.decision
            ),
        )
    elif run.status == "running":
        em.on_run(
            "action.approved",
            ActionDecision(idempotency_key=p.idempotency_key, kind=p.kind, detail=p.detail),
        )
    else:
        em.on_run(
            "action.denied",
            ActionDecision(
                idempotency_key=p.idempotency_key, kind=p.kind, reason=run.status, detail=p.detail
            ),
        )


def _action_result(em: _Emitter, cmd: Command, run: RunState) -> None:
    p = cmd.payload_as(ActionResultPayload)
    first = run.actions.get(p.idempotency_key)
    if first is None or first.decision != "approved":
        em.reject("unknown_action", f"no approved action {p.idempotency_key!r}")
    elif first.completed:
        em.reject("action_already_completed", p.idempotency_key)
    else:
        em.on_run(
            "action.completed",
            ActionCompleted(idempotency_key=p.idempotency_key, ok=p.ok, result=p.result),
        )


def _cancel_ack(em: _Emitter, cmd: Command, run: RunState) -> None:
    p = cmd.payload_as(CancelAckPayload)
    if run.status != "cancelling":
        em.reject("not_cancelling", f"run {run.run_id} is {run.status}")
        return
    em.on_run(
        "run.cancel_acknowledged",
        CancelAcknowledged(
            worker_id=cmd.worker_id or "",
            model_request_aborted=p.model_request_aborted,
            tools_aborted=p.tools_aborted,
            subtasks_cancelled=p.subtasks_cancelled,
            actions_blocked=p.actions_blocked,
        ),
    )
    _finish(em, "cancelled")


def _complete(em: _Emitter, cmd: Command, run: RunState) -> None:
    p = cmd.payload_as(RunCompletePayload)
    if run.status != "running":
        reason = "run_cancelling" if run.status == "cancelling" else "invalid_state"
        em.reject(reason, f"run.complete while {run.status}")
        return
    pending = em.state.pending_follow_ups(run.run_id)
    consumed = set(p.consumed_follow_ups)
    for q in pending:
        em.on_run(
            "run.follow_up_delivered",
            FollowUpDelivered(text=q.text, source_command_id=q.source_command_id),
        )
    if any(q.source_command_id not in consumed for q in pending):
        # follow-ups arrive before the run would finish: the run goes on to handle them
        return
    _finish(em, "completed", result=p.result)


def _fail(em: _Emitter, cmd: Command, run: RunState) -> None:
    p = cmd.payload_as(RunFailPayload)
    if run.status == "cancelling":
        em.reject("run_cancelling", "a cancelling run ends with cancel.ack")
        return
    _finish(em, "failed", error=p.error)


_HANDLERS = {
    "prompt": _prompt,
    "send": _send,
    "steer": _steer,
    "follow_up": _follow_up,
    "abort": _abort,
    "timer.fired": _timer,
}

_WORKER_HANDLERS = {
    "lease.renew": _renew,
    "lease.release": _release,
    "run.progress": _progress,
    "compact.start": _compact_start,
    "compact.finish": _compact_finish,
    "action.request": _action_request,
    "action.result": _action_result,
    "cancel.ack": _cancel_ack,
    "run.complete": _complete,
    "run.fail": _fail,
}
