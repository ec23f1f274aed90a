"""The session decider: `decide(state, command, at=..., seen=...) -> Decision`, and
`evolve(state, event) -> state`.

Pure and deterministic: no clock, no randomness, no I/O. "Now" comes in as `at`, the
broker's append time of the command record (`LogAppendTime`), folded monotonically per
session: the decider's clock is `max(state.clock, at)`, so producer clocks (`command.ts`)
never decide anything and a replay of the same log decides the same. Run ids are uuid5 of
the session, the causing command and the session's run counter, so the same commands in the
same order give byte-identical events.

Every command gets exactly one visible outcome: the events it caused, one
`command.rejected` (with its reason), or nothing for an exact re-send of a command id the
session has already decided. Checks run in this order: authorization (tenant) →
duplicates (`seen`: the content digest recorded for this command id, looked up by the
caller) → size → the run the command names → the type's own rules.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Any, Final, Literal

from sessionstream.core.approvals import needs_approval
from sessionstream.core.state import (
    ActionRecord,
    FinishedRun,
    OpenCall,
    PendingInput,
    QueueEntry,
    RunState,
    SessionState,
    StepRecord,
    evolved,
)
from sessionstream.schemas._base import Payload, construct, make
from sessionstream.schemas.commands import (
    COMMAND_CLASSES,
    LATEST_CHECKPOINT_REF,
    PRODUCER_COMMAND_TYPES,
    AbortPayload,
    ActionApprovePayload,
    ActionDenyPayload,
    ActionRequestPayload,
    ActionResultPayload,
    CancelAckPayload,
    Command,
    CommandClass,
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
    StepRecordPayload,
    TimerFiredPayload,
    json_text,
)
from sessionstream.schemas.events import (
    REJECTION_REASONS,
    SESSION_LOG,
    ActionCompleted,
    ActionDecision,
    ActionDecisionReplayed,
    ActionPending,
    CancelAcknowledged,
    CancelRequested,
    CommandRejected,
    CompactionAbandoned,
    CompactionFinished,
    CompactionStarted,
    ContextCheckpointed,
    Event,
    FollowUpDelivered,
    FollowUpQueued,
    InputConsumed,
    InputDelivered,
    InputDropped,
    InputRequeued,
    LeaseExpired,
    LeaseGranted,
    LeaseReleased,
    LeaseRenewed,
    Progress,
    RejectionReason,
    RoundCompleted,
    RunFinished,
    RunQueued,
    RunStarted,
    StaleWriteRecorded,
    Steered,
    StepDelivered,
    StepRecorded,
    TerminalStatus,
)

__all__ = [
    "DEFAULT_CONFIG",
    "REJECTION_REASONS",
    "RUN_ID_NAMESPACE",
    "DeciderConfig",
    "Decision",
    "apply",
    "command_digest",
    "decide",
    "evolve",
    "fold",
    "run_id_for",
]

#: namespace of run ids: uuid5(RUN_ID_NAMESPACE, "{session}/{command}/{n}")
RUN_ID_NAMESPACE: Final = uuid.UUID("6f0c2d4e-5b1a-5c8e-9a57-0d1f2e3c4b5a")
_NS: Final = RUN_ID_NAMESPACE.bytes


def run_id_for(name: str) -> str:
    """`str(uuid.uuid5(RUN_ID_NAMESPACE, name))`, without the UUID object (a fifth of the
    cost; a unit test holds the two equal)."""
    h = bytearray(hashlib.sha1(_NS + name.encode()).digest()[:16])
    h[6] = (h[6] & 0x0F) | 0x50  # version 5
    h[8] = (h[8] & 0x3F) | 0x80  # RFC 4122 variant
    x = h.hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


#: the gate's refusal once a run has asked for `max_actions` keys; not recorded per key
_TOO_MANY_ACTIONS: Final = "too_many_actions"
#: a repeat of a key that needed approval, with other arguments; not recorded either
_DIGEST_MISMATCH: Final = "digest_mismatch"
_UNRECORDED: Final = frozenset({_TOO_MANY_ACTIONS, _DIGEST_MISMATCH})
#: a pending key whose holder lost the lease: the next holder may ask for it again
_LEASE_LOST: Final = "lease_lost"


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
    #: the longest lease a worker is granted (a longer ask is capped, and the grant says so)
    max_lease_ms: int = 5 * 60 * 1000
    #: how long a command id is remembered for duplicate detection (by the decider's clock);
    #: the caller's dedup store forgets records older than this
    dedup_ttl_ms: int = 24 * 60 * 60 * 1000
    #: waiting prompts / follow-ups per session
    max_queue: int = 32
    #: steers and follow-ups pending for the active run
    max_inputs: int = 32
    #: producer text the session's state may hold (active prompt + inputs + queue), UTF-8
    max_held_bytes: int = 512 * 1024
    #: idempotency keys the gate decides per run
    max_actions: int = 64
    #: terminal runs remembered per session, to answer their late writers precisely
    finished_window: int = 16
    #: a step's result held inline (UTF-8 of `result` + `resultRef`); beyond: a pointer
    max_step_result_bytes: int = 8 * 1024
    #: recorded steps the active run holds, and their held bytes (`StepRecord.held_bytes`)
    max_steps: int = 128
    max_run_step_bytes: int = 128 * 1024
    #: calls started and not finished the run tracks, to close them when the lease is lost
    max_open_calls: int = 32
    #: (tenant, kind) pairs whose actions wait for a person (`*`: any), from
    #: `SESSIONSTREAM_APPROVAL_KINDS` (`sessionstream.core.approvals`); empty: none do
    approval_policy: tuple[tuple[str, str], ...] = ()
    #: how long a pending approval waits for a person (by the decider's clock)
    approval_ttl_ms: int = 15 * 60 * 1000


DEFAULT_CONFIG: Final = DeciderConfig()


@dataclass(frozen=True)
class Decision:
    """What one command decided."""

    events: list[Event]
    #: the session's state after the events
    state: SessionState
    #: the content digest the caller records for this command id (see `command_digest`),
    #: with `state.clock` as its time; or None: nothing to record (a duplicate, a reused
    #: id, a command from another tenant, a timer that was not due)
    remember: int | None

    @property
    def duplicate(self) -> bool:
        return not self.events


def command_digest(command: Command, payload_json: bytes | None = None) -> int:
    """64-bit digest of what a command asks (not when): an exact re-send has the same one,
    the same id with another type, target or payload does not. The digested bytes: each of
    type, tenant, run, worker, generation, actor as `\x01{value}\x1f` (`\x00\x1f` when
    absent), then the payload's JSON."""
    if payload_json is None:
        payload_json = command.payload.__pydantic_serializer__.to_json(command.payload)
    c = command
    text = (
        f"\x01{c.type}\x1f\x01{c.tenant_id}\x1f"
        + ("\x00\x1f" if c.run_id is None else f"\x01{c.run_id}\x1f")
        + ("\x00\x1f" if c.worker_id is None else f"\x01{c.worker_id}\x1f")
        + ("\x00\x1f" if c.generation is None else f"\x01{c.generation}\x1f")
        + ("\x00\x1f" if c.actor is None else f"\x01{c.actor}\x1f")
    )
    return int.from_bytes(
        hashlib.blake2b(text.encode() + payload_json, digest_size=8).digest(), "big"
    )


# ------------------------------------------------------------------------------------------
# evolve
# ------------------------------------------------------------------------------------------


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
            )
            update["queue"] = (entry, *state.queue) if q.front else (*state.queue, entry)
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
        )
        update["active"] = None
        update["finished"] = (*state.finished, done)[-config.finished_window :]
        return evolved(state, **update)
    # model.*, tool.*, subtask.*, step.delivered, action.decision_replayed,
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


# ------------------------------------------------------------------------------------------
# decide
# ------------------------------------------------------------------------------------------


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


def decide(
    state: SessionState | None,
    command: Command,
    config: DeciderConfig = DEFAULT_CONFIG,
    *,
    at: int | None = None,
    seen: tuple[int, int] | None = None,
    via: CommandClass | None = None,
) -> Decision:
    """Decide `command` in `state`.

    `at` is the broker's append time of the command record (the processor always passes
    it; tests and tools that have no log fall back to the command's `ts`). `seen` is what
    the caller's dedup store holds for this command id: (content digest, decided at), or
    None. A record older than `dedup_ttl_ms` is not looked at. Whatever `Decision.remember`
    says is to be stored as (`remember`, `Decision.state.clock`). `via` is the class of
    the topic the command arrived on (None: tools and tests that have no topic); a command
    of another class is rejected `not_allowed_here` and changes nothing else.
    """
    if state is None:
        state = SessionState.initial(command.session_id)
    if state.session_id != command.session_id:
        raise ValueError(f"command for {command.session_id} given state of {state.session_id}")
    now = max(state.clock, command.ts if at is None else at)
    em = _Emitter(state, command, config, now)
    # Step 1: authorization, before anything is remembered of the command: a command on
    # a topic its writer may not use (a producer's lease, anyone's timer) and a foreign
    # tenant's command must never take an id from the session's owner
    if via is not None and command.type not in COMMAND_CLASSES[via]:
        em.reject("not_allowed_here", f"{command.type} is not a {via} command")
        return Decision(em.events, em.state, None)
    if state.tenant_id is not None and command.tenant_id != state.tenant_id:
        em.reject(
            "tenant_mismatch", f"session belongs to another tenant than {command.tenant_id!r}"
        )
        return Decision(em.events, em.state, None)
    # Step 2: duplicates compare content: an exact re-send decides nothing, another
    # command under a used id is refused (the id keeps its first meaning)
    payload_json = command.payload.__pydantic_serializer__.to_json(command.payload)
    digest = command_digest(command, payload_json)
    if seen is not None and now - seen[1] <= config.dedup_ttl_ms:
        if seen[0] == digest:
            return Decision([], state, None)
        em.reject("command_id_reused", "this commandId was used before for another command")
        return Decision(em.events, em.state, None)
    # Step 3: size, then the command's own rules
    if len(payload_json) > config.max_payload_bytes:
        em.reject("payload_too_large", f"{len(payload_json)} bytes > {config.max_payload_bytes}")
    elif command.type in PRODUCER_COMMAND_TYPES and not _names_active_run(em):
        pass
    else:
        handler = _HANDLERS.get(command.type)
        if handler is not None:
            handler(em, command)
        else:
            _worker(em, command)
    remember: int | None = digest
    if command.type == "timer.fired" and em.events[0].type == "command.rejected":
        remember = None  # a timer that was not due (yet) may come again and decide then
    return Decision(em.events, em.state, remember)


def apply(
    state: SessionState | None,
    command: Command,
    config: DeciderConfig = DEFAULT_CONFIG,
    *,
    at: int | None = None,
    seen: tuple[int, int] | None = None,
    via: CommandClass | None = None,
) -> tuple[list[Event], SessionState]:
    """`decide`, as (events, state after them)."""
    d = decide(state, command, config, at=at, seen=seen, via=via)
    return d.events, d.state


def _names_active_run(em: _Emitter) -> bool:
    """A producer command naming a run acts on that run only; False (and rejected) if that
    run is not the active one."""
    target = em.cmd.run_id
    run = em.state.active
    if target is None or (run is not None and run.run_id == target):
        return True
    done = em.state.finished_run(target)
    status = done.status if done is not None else None
    what = f"has finished: {status}" if status else "is not a run of this session we know"
    em.reject("run_not_active", f"run {target} {what}", target_status=status or "unknown")
    return False


# -- runs starting and ending -----------------------------------------------------------------


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


# -- producer commands ------------------------------------------------------------------------


def _prompt(em: _Emitter, cmd: Command) -> None:
    p = cmd.payload_as(PromptPayload)
    if p.retry_of is not None and not _retryable(em, p.retry_of):
        return
    # the input travels and is held as its compact JSON text: nothing after this parses it
    # (a retry carries its own: the session keeps nothing of a finished run's prompt)
    input = None if p.input is None else json_text(p.input)
    run = em.state.active
    if run is None:
        _start_run(
            em,
            text=p.text,
            origin="prompt",
            source_command_id=cmd.command_id,
            context_ref=p.context_ref,
            timeout_ms=p.timeout_ms,
            actor=cmd.actor,
            retry_of=p.retry_of,
            input=input,
            approval_kinds=p.approval_kinds,
        )
    elif p.policy == "reject":
        reason: RejectionReason = (
            "session_compacting" if run.status == "compacting" else "session_busy"
        )
        em.reject(reason, f"run {run.run_id} is {run.status}")
    elif p.policy == "enqueue":
        _enqueue(
            em,
            "prompt",
            p.text,
            context_ref=p.context_ref,
            timeout_ms=p.timeout_ms,
            retry_of=p.retry_of,
            input=input,
            approval_kinds=p.approval_kinds,
        )
    else:  # interrupt: queue in front, then cancel the active run
        if run.status != "cancelling" and _no_room(em, p.text, queue=True, input=input) is None:
            # the cancel's refusals of pending approvals come before all else it decides
            _resolve_pending(em, "cancelling")
        queued = _enqueue(
            em,
            "prompt",
            p.text,
            front=True,
            context_ref=p.context_ref,
            timeout_ms=p.timeout_ms,
            retry_of=p.retry_of,
            input=input,
            approval_kinds=p.approval_kinds,
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


# -- timers -------------------------------------------------------------------------------------


def _timer(em: _Emitter, cmd: Command) -> None:
    """A timer is honoured only if it is due by the decider's own clock, for the active run
    at its current generation: a forged or early one changes nothing."""
    p = cmd.payload_as(TimerFiredPayload)
    run = em.state.active
    if run is None or run.run_id != cmd.run_id:
        em.reject("timer_stale", f"run {cmd.run_id} is not active")
        return
    if cmd.generation != run.generation:
        em.reject("timer_stale", f"generation {cmd.generation} != current {run.generation}")
        return
    now = em.now
    if p.kind == "lease_expiry":
        if run.lease_owner is None or run.lease_expires_at is None or run.lease_expires_at > now:
            em.reject("timer_stale", f"lease renewed, released or not expired at {now}")
            return
        _lose_lease(
            em,
            run,
            "run.lease_expired",
            make(LeaseExpired, worker_id=run.lease_owner, reason="lease_expiry"),
        )
        if run.status == "cancelling":
            _finish(em, "cancelled")
    elif p.kind == "approval_expiry":
        due = [(k, a) for k, a in run.pending_actions() if (a.expires_at or 0) <= now]
        if not due:
            em.reject("timer_stale", f"no pending approval has expired at {now}")
            return
        for key, a in due:
            em.on_run(
                "action.denied",
                make(
                    ActionDecision,
                    idempotency_key=key,
                    kind=a.kind,
                    reason="approval_expired",
                    detail=f"no decision by {a.expires_at}",
                ),
            )
    elif p.kind == "run_deadline":
        if run.timeout_at > now:
            em.reject("timer_stale", f"deadline {run.timeout_at} not reached at {now}")
            return
        _finish(em, "timed_out", error=f"deadline {run.timeout_at} passed", retryable=True)
    else:  # cancel_deadline
        if (
            run.status != "cancelling"
            or run.cancel_deadline_at is None
            or run.cancel_deadline_at > now
        ):
            em.reject("timer_stale", f"run not cancelling or cancel deadline not reached at {now}")
            return
        if run.lease_owner is not None:
            _resolve_pending(em, _LEASE_LOST)
            em.on_run(
                "run.lease_expired",
                make(LeaseExpired, worker_id=run.lease_owner, reason="cancel_deadline"),
                generation=run.generation + 1,
            )
            _close_open_calls(em, run)
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
    keys were first asked: before anything else the cancel, the loss or the end decides."""
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


def _action_request(em: _Emitter, cmd: Command, run: RunState) -> None:
    p = cmd.payload_as(ActionRequestPayload)
    key = p.idempotency_key
    first = run.actions.get(key)
    if (
        first is not None
        and run.status == "cancelling"
        and first.decision == "approved"
        and (not first.completed)
    ):
        # a worker retrying an approved action it has not finished (it crashed, or lost the
        # result) must not act once the run is being cancelled: the email that arrives
        # minutes after the user pressed stop is what the gate exists to prevent
        _deny(em, key, first.kind, "cancelling", "approved before the cancel; not retried")
    elif first is not None and first.needed_approval and p.args_digest != first.args_digest:
        # a person approved (or is asked to approve) these arguments, not others
        _deny(
            em,
            key,
            first.kind,
            _DIGEST_MISMATCH,
            f"argsDigest {p.args_digest!r} is not the key's {first.args_digest!r}",
        )
    elif first is not None and first.decision == "denied" and first.reason == _LEASE_LOST:
        _ask_again(em, run, key, first, p.detail)
    elif first is not None:
        em.on_run(
            "action.decision_replayed",
            make(
                ActionDecisionReplayed,
                idempotency_key=key,
                kind=first.kind,
                decision=first.decision,
            ),
        )
    elif len(run.actions) >= em.config.max_actions:
        _deny(
            em,
            key,
            p.kind,
            _TOO_MANY_ACTIONS,
            f"the run has asked for {len(run.actions)} keys (maxActions)",
        )
    elif run.status == "running":
        cfg = em.config
        if needs_approval(cfg.approval_policy, em.state.tenant_id, p.kind, run.approval_kinds):
            _pending(em, key, p.kind, p.args_digest, p.detail, em.now + cfg.approval_ttl_ms)
        else:
            em.on_run(
                "action.approved",
                make(ActionDecision, idempotency_key=key, kind=p.kind, detail=p.detail),
            )
    else:
        _deny(em, key, p.kind, run.status, p.detail)


def _ask_again(
    em: _Emitter, run: RunState, key: str, first: ActionRecord, detail: str | None
) -> None:
    """The next holder asks for a key its predecessor was waiting on when it lost the
    lease: pending again, for the new generation, within the same window (a takeover never
    extends a person's time)."""
    expires_at = first.expires_at or 0
    if run.status != "running":
        _deny(em, key, first.kind, run.status, detail)
    elif em.now >= expires_at:
        _deny(em, key, first.kind, "approval_expired", f"no decision by {expires_at}")
    else:
        _pending(em, key, first.kind, first.args_digest, detail, expires_at)


def _pending(
    em: _Emitter,
    key: str,
    kind: str,
    args_digest: str | None,
    detail: str | None,
    expires_at: int,
) -> None:
    em.on_run(
        "action.pending",
        make(
            ActionPending,
            idempotency_key=key,
            kind=kind,
            args_digest=args_digest,
            detail=detail,
            expires_at=expires_at,
        ),
    )


def _deny(
    em: _Emitter,
    key: str,
    kind: str,
    reason: str,
    detail: str | None,
    decided_by: str | None = None,
) -> None:
    em.on_run(
        "action.denied",
        make(
            ActionDecision,
            idempotency_key=key,
            kind=kind,
            reason=reason,
            detail=detail,
            decided_by=decided_by,
        ),
    )


def _decide_action(em: _Emitter, cmd: Command) -> None:
    """`action.approve` / `action.deny`: a person decides a key of the run the command
    names (checked active already) that is waiting for them, for the request they saw."""
    p = cmd.payload
    assert isinstance(p, ActionApprovePayload | ActionDenyPayload)
    run = em.state.active
    assert run is not None
    key = p.idempotency_key
    rec = run.actions.get(key)
    if rec is None:
        em.reject("unknown_action", f"run {run.run_id} never asked for {key!r}")
    elif rec.decision != "pending":
        why = f"{rec.decision} ({rec.reason})" if rec.reason else rec.decision
        em.reject("action_not_pending", f"{key!r} is {why}")
    elif p.generation is not None and p.generation != rec.generation:
        em.reject(
            "approval_stale",
            f"the pending request of {key!r} is generation {rec.generation}, not {p.generation}",
        )
    elif p.args_digest != rec.args_digest:
        em.reject("digest_mismatch", f"argsDigest {p.args_digest!r} is not the pending request's")
    elif em.now >= (rec.expires_at or 0):
        # the state is the timer's to change: it denies every expired key at once
        em.reject("approval_expired", f"the approval window closed at {rec.expires_at}")
    elif isinstance(p, ActionApprovePayload):
        em.on_run(
            "action.approved",
            make(ActionDecision, idempotency_key=key, kind=rec.kind, decided_by=cmd.actor),
        )
    else:
        _deny(em, key, rec.kind, "denied", p.reason, decided_by=cmd.actor)


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
            make(ActionCompleted, idempotency_key=p.idempotency_key, ok=p.ok, result=p.result),
        )


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


_HANDLERS = {
    "prompt": _prompt,
    "send": _send,
    "steer": _steer,
    "follow_up": _follow_up,
    "abort": _abort,
    "action.approve": _decide_action,
    "action.deny": _decide_action,
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
    "step.record": _step_record,
}
