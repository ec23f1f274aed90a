"""Events: what the session processor decided, in order, per run.

The envelope is the seed's (`sessionId, runId, seq, type, payload`) plus `generation`,
`commandId` (the causing command), `ts` (the decider's clock when it decided: the broker's
append time of the causing command, never earlier than the session's previous event),
`producerTs` (the causing command's own `ts`, information only) and `tenantId`.
Events that belong to no run (rejections, queued prompts) go to the session's own log,
whose run id is `SESSION_LOG`.
"""

from __future__ import annotations

import builtins
from typing import Any, Final, Literal, TypeVar, get_args

from pydantic import Field, SerializeAsAny, model_validator

import sessionstream.schemas.questions as _questions
from sessionstream.schemas._base import Payload, WireModel, validate_payload
from sessionstream.schemas.labels import Labels
from sessionstream.schemas.schedules import ScheduleDefined, ScheduleDeleted, ScheduleFired

__all__ = [
    "ACTIVE_STATUSES",
    "EVENT_PAYLOADS",
    "EVENT_TYPES",
    "REJECTION_REASONS",
    "SESSION_LOG",
    "TERMINAL_STATUSES",
    "ActionCompleted",
    "ActionDecision",
    "ActionDecisionReplayed",
    "ActionPending",
    "CancelAcknowledged",
    "CancelRequested",
    "CommandRejected",
    "CompactionAbandoned",
    "CompactionFinished",
    "CompactionStarted",
    "ContextCheckpointed",
    "Event",
    "EventType",
    "FollowUpDelivered",
    "FollowUpQueued",
    "InputConsumed",
    "InputDelivered",
    "InputDropped",
    "InputKind",
    "InputRequeued",
    "LeaseExpired",
    "LeaseGranted",
    "LeaseReleased",
    "LeaseRenewed",
    "Progress",
    "RejectionReason",
    "RoundCompleted",
    "RunDequeued",
    "RunFinished",
    "RunQueued",
    "RunStarted",
    "RunStatus",
    "ScheduleDefined",
    "ScheduleDeleted",
    "ScheduleFired",
    "SessionErased",
    "StaleWriteRecorded",
    "Steered",
    "StepDelivered",
    "StepRecorded",
    "TerminalStatus",
    "event_key",
]

#: run id of a session's own log (rejections, queued prompts): not a uuid, so never a run's
SESSION_LOG: Final = "_session"

RunStatus = Literal[
    "running", "compacting", "cancelling", "completed", "cancelled", "failed", "timed_out"
]
TerminalStatus = Literal["completed", "cancelled", "failed", "timed_out"]
ACTIVE_STATUSES: Final[frozenset[str]] = frozenset({"running", "compacting", "cancelling"})
TERMINAL_STATUSES: Final[frozenset[str]] = frozenset(
    {"completed", "cancelled", "failed", "timed_out"}
)
#: a steer or a follow-up: what a producer hands to the active run
InputKind = Literal["steer", "follow_up"]

#: every reason a `command.rejected` event can carry (docs/protocol.md#rejection-reasons)
RejectionReason = Literal[
    "tenant_mismatch",
    "command_id_reused",
    "payload_too_large",
    "run_not_active",
    "session_busy",
    "session_compacting",
    "queue_full",
    "no_active_run",
    "run_cancelling",
    "already_cancelling",
    "not_retryable",
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
    "not_allowed_here",
    "step_already_recorded",
    "step_too_large",
    "too_many_steps",
    "action_not_pending",
    "approval_stale",
    "digest_mismatch",
    "approval_expired",
    _questions.QuestionRejection,
    "invalid_schedule",
    "too_many_schedules",
    "schedule_exists",
    "unknown_schedule",
    "not_queued",
    "queue_empty",
]
REJECTION_REASONS: Final[frozenset[str]] = frozenset(get_args(RejectionReason))


class RunStarted(Payload):
    """`actor` asked for the run (the starting command's, also for a queued one); `retryOf`
    is the retryable run this one retries; `input` is the prompt's typed input as its
    compact JSON text (null: none)."""

    prompt: str
    origin: Literal["prompt", "follow_up", "send", "queued"]
    source_command_id: str
    timeout_at: int
    context_ref: str | None = None
    actor: str | None = None
    retry_of: str | None = None
    #: the task asked for the session's latest checkpoint (`contextRef` is what it was)
    from_checkpoint: bool = False
    input: str | None = None
    #: action kinds the prompt said need approval in this run (beyond the settings')
    approval_kinds: list[str] = Field(default_factory=list)
    #: the prompt's labels (`metadata`; null: none), what run search filters on
    metadata: Labels = None


class RunQueued(Payload):
    """A prompt or follow-up waiting for the session to be free (session log).

    A queued prompt keeps its typed `input` (compact JSON text) until it starts."""

    source_command_id: str
    kind: Literal["prompt", "follow_up"]
    text: str
    front: bool = False
    context_ref: str | None = None
    timeout_ms: int | None = None
    actor: str | None = None
    retry_of: str | None = None
    input: str | None = None
    approval_kinds: list[str] = Field(default_factory=list)
    #: a prompt's labels (null: none), kept until it starts
    metadata: Labels = None


class RunDequeued(Payload):
    """A waiting task left the queue without starting (session log): `dequeue` named it
    (`reason: dequeued`) or `clear_queue` emptied the queue (`cleared`). `actor` removed
    it; `queuedBy` had queued it."""

    source_command_id: str
    kind: Literal["prompt", "follow_up"]
    reason: Literal["dequeued", "cleared"]
    actor: str | None = None
    queued_by: str | None = None


class LeaseGranted(Payload):
    """`leaseMs` is what was granted: the asked length, or `maxLeaseMs` when `capped`.
    `checkpointRef` is the run's latest checkpoint for the new holder to start from;
    `stepsDelivered` says how many `step.delivered` follow the grant."""

    worker_id: str
    lease_expires_at: int
    lease_ms: int | None = None
    capped: bool = False
    checkpoint_ref: str | None = None
    steps_delivered: int = 0


class LeaseRenewed(Payload):
    worker_id: str
    lease_expires_at: int
    lease_ms: int | None = None
    capped: bool = False


class LeaseReleased(Payload):
    worker_id: str


class LeaseExpired(Payload):
    """The holder's lease is gone; the generation was bumped, fencing its writes."""

    worker_id: str
    reason: Literal["lease_expiry", "cancel_deadline"]


class Steered(Payload):
    """A steer accepted for the run: pending until the holder consumes it."""

    text: str
    source_command_id: str | None = None
    actor: str | None = None


class FollowUpQueued(Payload):
    """A follow-up accepted for the run: pending until the holder consumes it."""

    text: str
    source_command_id: str
    actor: str | None = None
    on_run_end: Literal["drop", "queue"] = "drop"


class RoundCompleted(Payload):
    """A round of the run ended with this result while follow-ups were pending: the run goes
    on to take them (`run.follow_up_delivered` follow). The last round's result is
    `run.finished`'s; each earlier one is kept here."""

    result: str | None = None


class FollowUpDelivered(Payload):
    """`run.complete` came while this follow-up was pending: the run goes on to take it."""

    text: str
    source_command_id: str


class InputDelivered(Payload):
    """A pending steer or follow-up, handed to a new lease holder right after its grant."""

    source_command_id: str
    kind: InputKind
    text: str


class InputConsumed(Payload):
    """Fate: the holder's `run.complete` took the input into account."""

    source_command_id: str
    kind: InputKind


class InputDropped(Payload):
    """Fate: the run ended (`terminalStatus`) without consuming the input."""

    source_command_id: str
    kind: InputKind
    reason: str
    terminal_status: TerminalStatus


class InputRequeued(Payload):
    """Fate: a follow-up with `onRunEnd: queue` whose run ended without it waits as a task."""

    source_command_id: str
    kind: InputKind
    terminal_status: TerminalStatus


class Progress(Payload):
    """model.request.* / tool.* / subtask.* as reported by the lease holder; a
    `model.request.finished` carries the request's usage."""

    worker_id: str
    name: str | None = None
    call_id: str | None = None
    detail: str | None = None
    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    first_token_ms: int | None = None
    duration_ms: int | None = None
    finish_reason: str | None = None
    cost_usd: float | None = None


class StepRecorded(Payload):
    """A finished model or tool step, recorded by the holder: what it got (`input`, JSON
    text) and returned (`result`, JSON text, or `resultRef` beyond the inline bound)."""

    worker_id: str
    step_id: str
    kind: Literal["model", "tool"]
    name: str | None = None
    input_digest: str | None = None
    input: str | None = None
    result: str | None = None
    result_ref: str | None = None


class StepDelivered(Payload):
    """A recorded step handed to a new holder right after its grant; `generation` is the
    one that recorded it."""

    step_id: str
    kind: Literal["model", "tool"]
    name: str | None = None
    input_digest: str | None = None
    result: str | None = None
    result_ref: str | None = None
    generation: int


class CompactionStarted(Payload):
    worker_id: str


class ContextCheckpointed(Payload):
    """A pointer to the checkpoint (object storage URI), never the blob."""

    uri: str
    tokens: int | None = None


class CompactionFinished(Payload):
    uri: str


class CompactionAbandoned(Payload):
    """The holder lost the lease mid-compaction: the run is `running` again, compaction to
    be redone by the next holder."""

    worker_id: str
    reason: str


class ActionDecision(Payload):
    """action.approved / action.denied. `decidedBy` is the person (the approving or
    denying command's actor) when one decided; null when the gate did."""

    idempotency_key: str
    kind: str
    reason: str | None = None
    detail: str | None = None
    decided_by: str | None = None


class ActionPending(Payload):
    """The action's kind needs a person: it waits for `action.approve` / `action.deny`
    until `expiresAt` (the decider's clock). `argsDigest` is what the person approves."""

    idempotency_key: str
    kind: str
    args_digest: str | None = None
    detail: str | None = None
    expires_at: int


class ActionDecisionReplayed(Payload):
    """A repeated idempotency key: the first decision, again — never a second approval
    (`pending`: still waiting for a person)."""

    idempotency_key: str
    kind: str
    decision: Literal["approved", "denied", "pending"]


class ActionCompleted(Payload):
    idempotency_key: str
    ok: bool
    result: str | None = None


class CancelRequested(Payload):
    reason: str
    cancel_deadline_at: int
    actor: str | None = None


class CancelAcknowledged(Payload):
    worker_id: str
    model_request_aborted: bool = False
    tools_aborted: list[str] = Field(default_factory=list)
    subtasks_cancelled: list[str] = Field(default_factory=list)
    actions_blocked: list[str] = Field(default_factory=list)
    actions_executing: list[str] = Field(default_factory=list)


class RunFinished(Payload):
    """`retryable`: the caller may start the task again (`retryOf`): `timed_out` always is,
    `failed` when the worker said so."""

    terminal_status: TerminalStatus
    result: str | None = None
    error: str | None = None
    retryable: bool = False


class CommandRejected(Payload):
    """The one visible outcome of a command that was not applied. `targetStatus` is the
    named run's status when it is known (e.g. the terminal status of a finished run)."""

    reason: RejectionReason
    command_type: str
    target_run_id: str | None = None
    detail: str | None = None
    actor: str | None = None
    target_status: str | None = None


class SessionErased(Payload):
    """The session was erased: every record of it before this event goes (the sink
    tombstones its event keys and deletes its rows). What stays of it is `sessionHash`
    (SHA-256 of the session id), the time, who and why: no content."""

    session_hash: str
    trigger: Literal["admin", "retention"]
    reason: str | None = None
    actor: str | None = None
    #: how many runs the session had started (its run counter, kept so later ids differ)
    runs_started: int = 0


class StaleWriteRecorded(Payload):
    """A write from a fenced (older) generation, kept for diagnosis; never applied."""

    worker_id: str | None
    command_type: str
    stale_generation: int | None
    current_generation: int


EventType = Literal[
    "run.started",
    "run.queued",
    "run.dequeued",
    "run.lease_granted",
    "run.lease_renewed",
    "run.lease_released",
    "run.lease_expired",
    "run.steered",
    "run.follow_up_queued",
    "run.round_completed",
    "run.follow_up_delivered",
    "run.input_delivered",
    "run.input_consumed",
    "run.input_dropped",
    "run.input_requeued",
    "model.request.started",
    "model.request.finished",
    "tool.started",
    "tool.finished",
    "subtask.started",
    "subtask.finished",
    "run.compaction_started",
    "context.checkpointed",
    "run.compaction_finished",
    "run.compaction_abandoned",
    "action.approved",
    "action.denied",
    "action.pending",
    "action.decision_replayed",
    "action.completed",
    _questions.QuestionEventType,
    "run.cancel_requested",
    "run.cancel_acknowledged",
    "run.finished",
    "command.rejected",
    "run.stale_write_recorded",
    "step.recorded",
    "step.delivered",
    "session.erased",
    "schedule.created",
    "schedule.updated",
    "schedule.deleted",
    "schedule.fired",
]

#: type -> payload model; the single source of the event vocabulary
EVENT_PAYLOADS: Final[dict[str, type[Payload]]] = {
    "run.started": RunStarted,
    "run.queued": RunQueued,
    "run.dequeued": RunDequeued,
    "run.lease_granted": LeaseGranted,
    "run.lease_renewed": LeaseRenewed,
    "run.lease_released": LeaseReleased,
    "run.lease_expired": LeaseExpired,
    "run.steered": Steered,
    "run.follow_up_queued": FollowUpQueued,
    "run.round_completed": RoundCompleted,
    "run.follow_up_delivered": FollowUpDelivered,
    "run.input_delivered": InputDelivered,
    "run.input_consumed": InputConsumed,
    "run.input_dropped": InputDropped,
    "run.input_requeued": InputRequeued,
    "model.request.started": Progress,
    "model.request.finished": Progress,
    "tool.started": Progress,
    "tool.finished": Progress,
    "subtask.started": Progress,
    "subtask.finished": Progress,
    "run.compaction_started": CompactionStarted,
    "context.checkpointed": ContextCheckpointed,
    "run.compaction_finished": CompactionFinished,
    "run.compaction_abandoned": CompactionAbandoned,
    "action.approved": ActionDecision,
    "action.denied": ActionDecision,
    "action.pending": ActionPending,
    "action.decision_replayed": ActionDecisionReplayed,
    "action.completed": ActionCompleted,
    **_questions.QUESTION_EVENT_PAYLOADS,
    "run.cancel_requested": CancelRequested,
    "run.cancel_acknowledged": CancelAcknowledged,
    "run.finished": RunFinished,
    "command.rejected": CommandRejected,
    "run.stale_write_recorded": StaleWriteRecorded,
    "step.recorded": StepRecorded,
    "step.delivered": StepDelivered,
    "session.erased": SessionErased,
    "schedule.created": ScheduleDefined,
    "schedule.updated": ScheduleDefined,
    "schedule.deleted": ScheduleDeleted,
    "schedule.fired": ScheduleFired,
}

EVENT_TYPES: Final[frozenset[str]] = frozenset(get_args(EventType))

P = TypeVar("P", bound=Payload)


class Event(WireModel):
    """The event envelope; `(sessionId, runId, seq)` is unique and `seq` contiguous from 1."""

    session_id: str
    run_id: str
    seq: int = Field(ge=1)
    type: EventType
    payload: SerializeAsAny[Payload]
    generation: int = 0
    command_id: str
    ts: int
    tenant_id: str
    producer_ts: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _payload_by_type(cls, data: Any) -> Any:
        return validate_payload(EVENT_PAYLOADS, data, "event")

    @property
    def key(self) -> str:
        """The compacted topic's key: `{session_id}/{run_id}/{seq:010d}`."""
        return event_key(self.session_id, self.run_id, self.seq)

    def payload_as(self, model: builtins.type[P]) -> P:
        if not isinstance(self.payload, model):
            raise TypeError(f"{self.type} carries {type(self.payload).__name__}")
        return self.payload


def event_key(session_id: str, run_id: str, seq: int) -> str:
    """Unique per event, so compaction only ever drops byte-identical re-emissions."""
    return f"{session_id}/{run_id}/{seq:010d}"
