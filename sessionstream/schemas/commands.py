"""Commands: what producers (UI, scheduler, workers, the processor's timers) ask of a session.

A command is an envelope (`commandId`, `sessionId`, `tenantId`, `type`, `ts`, `actor`,
`runId`, worker fields) around a payload whose model is chosen by `type`. `commandId` is the
producer's idempotency key. `ts` is the producer's clock in epoch milliseconds, kept as
information only: the decider's "now" is the broker's append time of the command record.
"""

from __future__ import annotations

import builtins
from typing import Any, Final, Literal, TypeVar

from pydantic import (
    Field,
    SerializeAsAny,
    model_validator,
)

from sessionstream.schemas._base import Payload, WireModel, check_text, validate_payload
from sessionstream.schemas.inputs import MAX_INPUT_DEPTH, JsonInput, json_text
from sessionstream.schemas.inputs import is_absent as _absent
from sessionstream.schemas.inputs import is_empty as _empty
from sessionstream.schemas.labels import Labels
from sessionstream.schemas.questions import QuestionAnswerPayload, QuestionAskPayload
from sessionstream.schemas.schedules import (
    MAX_SCHEDULE_ID_CHARS,
    ScheduleCreatePayload,
    ScheduleDeletePayload,
    ScheduleUpdatePayload,
)
from sessionstream.schemas.sessions import MAX_SESSION_ID_CHARS, session_id_problem

__all__ = [
    "ADMIN_COMMAND_TYPES",
    "COMMAND_CLASSES",
    "COMMAND_PAYLOADS",
    "LATEST_CHECKPOINT_REF",
    "MAX_APPROVAL_KINDS",
    "MAX_DENY_REASON_CHARS",
    "MAX_ID_CHARS",
    "MAX_INPUT_DEPTH",
    "MAX_REF_CHARS",
    "MAX_WIRE_INT",
    "PRODUCER_COMMAND_TYPES",
    "RUN_SCOPED_PRODUCER_TYPES",
    "SCHEDULE_COMMAND_TYPES",
    "TIMER_COMMAND_TYPES",
    "WORKER_COMMAND_TYPES",
    "AbortPayload",
    "ActionApprovePayload",
    "ActionDenyPayload",
    "ActionRequestPayload",
    "ActionResultPayload",
    "CancelAckPayload",
    "ClearQueuePayload",
    "Command",
    "CommandClass",
    "CommandType",
    "CompactFinishPayload",
    "CompactStartPayload",
    "DequeuePayload",
    "FollowUpPayload",
    "JsonInput",
    "LeaseAcquirePayload",
    "LeaseReleasePayload",
    "LeaseRenewPayload",
    "PromptPayload",
    "PromptPolicy",
    "RunCompletePayload",
    "RunFailPayload",
    "RunProgressPayload",
    "ScheduleCreatePayload",
    "ScheduleDeletePayload",
    "ScheduleUpdatePayload",
    "SendPayload",
    "SessionErasePayload",
    "SteerPayload",
    "StepKind",
    "StepRecordPayload",
    "TimerFiredPayload",
    "TimerKind",
    "command_class",
    "json_text",
]

#: longest id on the wire (command, session, tenant, run, worker ids, actors, idempotency keys)
MAX_ID_CHARS: Final = 200

#: longest pointer (context refs, checkpoint URIs): a pointer, never the content
MAX_REF_CHARS: Final = 2048

#: a prompt's `contextRef` that asks for the session's latest `context.checkpointed`,
#: resolved when the run starts (a pointer to a pointer: no new command field, so the
#: digests of the prompts decided before stay what they were)
LATEST_CHECKPOINT_REF: Final = "sessionstream:checkpoint/latest"

#: bound of every integer in a command: the largest integer JSON producers (JavaScript) hold
#: exactly, and small enough that `ts + leaseMs` and the like stay an Avro `long`
MAX_WIRE_INT: Final = 2**53 - 1

#: longest reason a person gives when denying an action
MAX_DENY_REASON_CHARS: Final = 500

#: how many action kinds a prompt may add to its run's approval policy
MAX_APPROVAL_KINDS: Final = 16

PromptPolicy = Literal["reject", "enqueue", "interrupt"]
TimerKind = Literal[
    "lease_expiry",
    "run_deadline",
    "cancel_deadline",
    "approval_expiry",
    "retention",
    "schedule",
]
#: a durable step: a model call or a tool call
StepKind = Literal["model", "tool"]
ProgressKind = Literal[
    "model.request.started",
    "model.request.finished",
    "tool.started",
    "tool.finished",
    "subtask.started",
    "subtask.finished",
]


class PromptPayload(Payload):
    """A new task. `policy` says what happens while a run is active. `retryOf` names a
    recent run that ended retryable (`timed_out`, or `failed` with `retryable`). `input` is
    the task's typed input, any JSON value, validated by the worker against the type its
    handler declares."""

    text: str
    policy: PromptPolicy = "reject"
    context_ref: str | None = Field(default=None, max_length=MAX_REF_CHARS)
    timeout_ms: int | None = Field(default=None, gt=0, le=MAX_WIRE_INT)
    retry_of: str | None = Field(default=None, min_length=1, max_length=MAX_ID_CHARS)
    #: left out of the payload's JSON when null, so the digest of every prompt decided
    #: before the field existed stays what it was (a re-send is still a duplicate)
    input: JsonInput = Field(default=None, exclude_if=_absent)
    #: action kinds this run's actions need a person's approval for, on top of the
    #: settings' (`*`: every kind); left out of the payload's JSON when empty (digests)
    approval_kinds: list[str] = Field(
        default_factory=list, max_length=MAX_APPROVAL_KINDS, exclude_if=_empty
    )
    #: the run's labels (bounded; `{}` is none), carried on `run.started` / `run.queued`;
    #: left out of the payload's JSON when none (earlier prompts' digests stay)
    metadata: Labels = Field(default=None, exclude_if=_absent)

    @model_validator(mode="after")
    def _kinds_are_names(self) -> PromptPayload:
        for k in self.approval_kinds:
            if not 1 <= len(k) <= MAX_ID_CHARS:
                raise ValueError(f"an approval kind is 1-{MAX_ID_CHARS} characters")
        return self


class SteerPayload(Payload):
    """Change the current run's reasoning; delivered to its worker at the next step."""

    text: str


class FollowUpPayload(Payload):
    """Extra information: pending for the active run, or starts a run when idle (by policy).
    `onRunEnd` says what becomes of it if its run ends without consuming it."""

    text: str
    when_idle: Literal["start", "reject"] = "start"
    on_run_end: Literal["drop", "queue"] = "drop"


class SendPayload(Payload):
    """The single 'send' button: the runtime picks prompt / follow-up / queue by state."""

    text: str
    context_ref: str | None = Field(default=None, max_length=MAX_REF_CHARS)
    timeout_ms: int | None = Field(default=None, gt=0, le=MAX_WIRE_INT)


class AbortPayload(Payload):
    """Cancel the active run."""

    reason: str = "user"


class DequeuePayload(Payload):
    """Remove one waiting task from the session's queue: the one its `run.queued` named by
    `commandId` (the command that queued it)."""

    command_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)


class ClearQueuePayload(Payload):
    """Remove every waiting task from the session's queue."""


class CompactStartPayload(Payload):
    """The lease holder starts compacting the run's context."""


class CompactFinishPayload(Payload):
    """Compaction done; the checkpoint lives elsewhere, only its pointer travels."""

    checkpoint_uri: str = Field(max_length=MAX_REF_CHARS)
    tokens: int | None = Field(default=None, ge=-MAX_WIRE_INT, le=MAX_WIRE_INT)


class LeaseAcquirePayload(Payload):
    """A worker asks to execute the run."""

    lease_ms: int = Field(default=30_000, gt=0, le=MAX_WIRE_INT)


class LeaseRenewPayload(Payload):
    """Heartbeat of the lease holder."""

    lease_ms: int = Field(default=30_000, gt=0, le=MAX_WIRE_INT)


class LeaseReleasePayload(Payload):
    """The holder gives the run up (another worker may take it)."""


class RunProgressPayload(Payload):
    """Model / tool / sub-task progress, reported by the lease holder."""

    kind: ProgressKind
    name: str | None = None
    call_id: str | None = None
    detail: str | None = None
    #: `model.request.finished` only, each when the worker knows it: the model that
    #: answered, tokens in and out, time to the first token and to the end, why it
    #: stopped, and its cost in US dollars when prices are configured
    model: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    input_tokens: int | None = Field(default=None, ge=0)
    output_tokens: int | None = Field(default=None, ge=0)
    first_token_ms: int | None = Field(default=None, ge=0)
    duration_ms: int | None = Field(default=None, ge=0)
    finish_reason: str | None = Field(default=None, max_length=64)
    cost_usd: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _usage_ends_a_model_request(self) -> RunProgressPayload:
        usage = (
            self.model,
            self.input_tokens,
            self.output_tokens,
            self.first_token_ms,
            self.duration_ms,
            self.finish_reason,
            self.cost_usd,
        )
        if self.kind != "model.request.finished" and any(u is not None for u in usage):
            raise ValueError(
                f"model usage is reported with model.request.finished, not {self.kind}"
            )
        return self


class ActionRequestPayload(Payload):
    """Ask the gate for permission to perform an external action (email, write, ...).
    `argsDigest` names the action's arguments (the SDK: `sha256:` + hex of their canonical
    JSON): what a person approves, and what a repeat of the key must carry again."""

    idempotency_key: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    kind: str = Field(max_length=MAX_ID_CHARS)
    detail: str | None = None
    #: left out of the payload's JSON when null, so requests decided before the field
    #: existed digest as they did
    args_digest: str | None = Field(default=None, max_length=MAX_ID_CHARS, exclude_if=_absent)


class ActionApprovePayload(Payload):
    """A person approves a pending action of the run the envelope names: the key and the
    digest of the arguments they saw; `generation`, when given, the request's generation."""

    idempotency_key: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    args_digest: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    generation: int | None = Field(default=None, ge=1, le=MAX_WIRE_INT)


class ActionDenyPayload(Payload):
    """A person denies a pending action; `reason` is theirs, in their words."""

    idempotency_key: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    args_digest: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    generation: int | None = Field(default=None, ge=1, le=MAX_WIRE_INT)
    reason: str | None = Field(default=None, max_length=MAX_DENY_REASON_CHARS)


class ActionResultPayload(Payload):
    """Outcome of an approved external action."""

    idempotency_key: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    ok: bool = True
    result: str | None = None


class CancelAckPayload(Payload):
    """The holder confirms cancellation and lists what it aborted."""

    model_request_aborted: bool = False
    tools_aborted: list[str] = Field(default_factory=list)
    subtasks_cancelled: list[str] = Field(default_factory=list)
    actions_blocked: list[str] = Field(default_factory=list)
    #: approved actions already executing when the cancel came (they run to their end)
    actions_executing: list[str] = Field(default_factory=list)


class RunCompletePayload(Payload):
    """The holder finished the run. `consumedFollowUps` / `consumedSteers` name the inputs
    (by their command ids) its answer took into account."""

    result: str | None = None
    consumed_follow_ups: list[str] = Field(default_factory=list)
    consumed_steers: list[str] = Field(default_factory=list)


class RunFailPayload(Payload):
    """The holder gives up with an error."""

    error: str
    retryable: bool = False


class StepRecordPayload(Payload):
    """A finished step's result, recorded by the holder so that no later holder or round
    calls the model or the tool again. `input` and `result` are JSON text; a result over
    the inline bound travels as `resultRef`, a pointer to object storage (never both)."""

    step_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    kind: StepKind
    name: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    input_digest: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    input: str | None = None
    result: str | None = None
    result_ref: str | None = Field(default=None, max_length=MAX_REF_CHARS)

    @model_validator(mode="after")
    def _result_or_ref(self) -> StepRecordPayload:
        if self.result is not None and self.result_ref is not None:
            raise ValueError("a step carries result or resultRef, not both")
        return self


class SessionErasePayload(Payload):
    """An administrator erases the session: every record of it goes (docs/protocol.md,
    erasure). `reason` is recorded on the erasure (no personal data belongs in it)."""

    reason: str | None = Field(default=None, max_length=MAX_DENY_REASON_CHARS)


class TimerFiredPayload(Payload):
    """Sent by the processor's timer; the decision happens when it is processed in order."""

    kind: TimerKind
    due_at: int = Field(ge=-MAX_WIRE_INT, le=MAX_WIRE_INT)
    #: kind `schedule` only: the schedule that fires (left out of the JSON when null, so
    #: the digests of the timers decided before it existed stay what they were)
    schedule_id: str | None = Field(
        default=None, max_length=MAX_SCHEDULE_ID_CHARS, exclude_if=_absent
    )


CommandType = Literal[
    "prompt",
    "steer",
    "follow_up",
    "send",
    "abort",
    "action.approve",
    "action.deny",
    "question.answer",
    "dequeue",
    "clear_queue",
    "compact.start",
    "compact.finish",
    "lease.acquire",
    "lease.renew",
    "lease.release",
    "run.progress",
    "action.request",
    "action.result",
    "question.ask",
    "cancel.ack",
    "run.complete",
    "run.fail",
    "step.record",
    "timer.fired",
    "session.erase",
    "schedule.create",
    "schedule.update",
    "schedule.delete",
]

#: type -> payload model; the single source of the command vocabulary
COMMAND_PAYLOADS: Final[dict[str, type[Payload]]] = {
    "prompt": PromptPayload,
    "steer": SteerPayload,
    "follow_up": FollowUpPayload,
    "send": SendPayload,
    "abort": AbortPayload,
    "action.approve": ActionApprovePayload,
    "action.deny": ActionDenyPayload,
    "question.answer": QuestionAnswerPayload,
    "dequeue": DequeuePayload,
    "clear_queue": ClearQueuePayload,
    "compact.start": CompactStartPayload,
    "compact.finish": CompactFinishPayload,
    "lease.acquire": LeaseAcquirePayload,
    "lease.renew": LeaseRenewPayload,
    "lease.release": LeaseReleasePayload,
    "run.progress": RunProgressPayload,
    "action.request": ActionRequestPayload,
    "action.result": ActionResultPayload,
    "question.ask": QuestionAskPayload,
    "cancel.ack": CancelAckPayload,
    "run.complete": RunCompletePayload,
    "run.fail": RunFailPayload,
    "step.record": StepRecordPayload,
    "timer.fired": TimerFiredPayload,
    "session.erase": SessionErasePayload,
    "schedule.create": ScheduleCreatePayload,
    "schedule.update": ScheduleUpdatePayload,
    "schedule.delete": ScheduleDeletePayload,
}

#: producer commands that act on one run only: without `runId` they are refused (dead
#: letter `schema_violation`), since a person decides an action (or answers a question)
#: they saw on a run
RUN_SCOPED_PRODUCER_TYPES: Final[frozenset[str]] = frozenset(
    {"action.approve", "action.deny", "question.answer"}
)

#: commands written by producers (UI, scheduler, gateway, ...); `runId` on one of these names
#: the run it is meant for, and it is rejected `run_not_active` if that run is not active
PRODUCER_COMMAND_TYPES: Final[frozenset[str]] = frozenset(
    {
        "prompt",
        "steer",
        "follow_up",
        "send",
        "abort",
        "action.approve",
        "action.deny",
        "question.answer",
        "schedule.create",
        "schedule.update",
        "schedule.delete",
        "dequeue",
        "clear_queue",
    }
)

#: the producer commands that keep a session's schedules (docs/protocol.md#schedules)
SCHEDULE_COMMAND_TYPES: Final[frozenset[str]] = frozenset(
    {"schedule.create", "schedule.update", "schedule.delete"}
)

#: commands written by the worker that holds (or asks for) a run's lease
WORKER_COMMAND_TYPES: Final[frozenset[str]] = frozenset(
    {
        "compact.start",
        "compact.finish",
        "lease.acquire",
        "lease.renew",
        "lease.release",
        "run.progress",
        "action.request",
        "action.result",
        "question.ask",
        "cancel.ack",
        "run.complete",
        "run.fail",
        "step.record",
    }
)

#: the processor's own commands: it fires them on its timers topic, no one else may
TIMER_COMMAND_TYPES: Final[frozenset[str]] = frozenset({"timer.fired"})

#: an administrator's commands: written to the control topic (the timers topic), which
#: only the processor and administrators may write (Kafka ACLs); on the producers' topic
#: they are rejected `not_allowed_here`
ADMIN_COMMAND_TYPES: Final[frozenset[str]] = frozenset({"session.erase"})

#: who may write a command, by the topic it arrives on: producers on the commands topic,
#: workers on the worker-commands topic, the processor alone on the timers topic
CommandClass = Literal["producer", "worker", "timer"]
COMMAND_CLASSES: Final[dict[str, frozenset[str]]] = {
    "producer": PRODUCER_COMMAND_TYPES,
    "worker": WORKER_COMMAND_TYPES,
    "timer": TIMER_COMMAND_TYPES | ADMIN_COMMAND_TYPES,
}


def command_class(command_type: str) -> CommandClass:
    """The class of a command type (which topic it belongs on)."""
    if command_type in PRODUCER_COMMAND_TYPES:
        return "producer"
    if command_type in WORKER_COMMAND_TYPES:
        return "worker"
    if command_type in TIMER_COMMAND_TYPES or command_type in ADMIN_COMMAND_TYPES:
        return "timer"
    raise ValueError(f"unknown command type {command_type!r}")


P = TypeVar("P", bound=Payload)


#: the envelope's text fields, and the containers a payload field may be
_ENVELOPE_TEXT: Final = ("command_id", "session_id", "tenant_id", "run_id", "worker_id", "actor")
_CONTAINERS: Final = frozenset({list, tuple, dict})


class Command(WireModel):
    """The command envelope. Worker commands also carry `runId`, `workerId`, `generation`;
    a producer command may carry `runId` to address one run only."""

    command_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    #: full id: `tenant:own-id` when namespaced (sessionstream.schemas.sessions), at most 401
    #: characters
    session_id: str = Field(min_length=1, max_length=MAX_SESSION_ID_CHARS)
    tenant_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    type: CommandType
    ts: int = Field(ge=0, le=MAX_WIRE_INT)
    run_id: str | None = Field(default=None, min_length=1, max_length=MAX_ID_CHARS)
    worker_id: str | None = Field(default=None, min_length=1, max_length=MAX_ID_CHARS)
    generation: int | None = Field(default=None, ge=-MAX_WIRE_INT, le=MAX_WIRE_INT)
    #: who asked (a user or service id); the gateway sets it from the caller's credentials
    actor: str | None = Field(default=None, min_length=1, max_length=MAX_ID_CHARS)
    payload: SerializeAsAny[Payload]

    @model_validator(mode="before")
    @classmethod
    def _payload_by_type(cls, data: Any) -> Any:
        return validate_payload(COMMAND_PAYLOADS, data, "command")

    @model_validator(mode="after")
    def _worker_fields(self) -> Command:
        # every string is text PostgreSQL and UTF-8 can hold: no NUL (a jsonb or text
        # column refuses it, and one such event stopped the sink for every tenant) and no
        # lone surrogate (it cannot be encoded: the gateway failed its whole round on one)
        d = self.__dict__
        for name in _ENVELOPE_TEXT:
            v = d[name]
            if v is not None and ("\x00" in v or not v.isascii()):
                check_text(name, v)
        for field, v in self.payload.__dict__.items():
            if v.__class__ is str:
                if "\x00" in v or not v.isascii():
                    check_text(f"payload.{field}", v)
            elif v.__class__ in _CONTAINERS:
                check_text(f"payload.{field}", v)
        if self.type in PRODUCER_COMMAND_TYPES or self.type in ADMIN_COMMAND_TYPES:
            # only producers and administrators name sessions: worker and timer commands
            # copy the id from the log, and a run of a session named before these rules
            # must still end
            problem = session_id_problem(self.tenant_id, self.session_id)
            if problem is not None:
                raise ValueError(problem)
            if self.type in RUN_SCOPED_PRODUCER_TYPES and not self.run_id:
                raise ValueError(f"{self.type} needs runId: the run whose action it decides")
        elif self.type in WORKER_COMMAND_TYPES:
            if not self.run_id or not self.worker_id:
                raise ValueError(f"{self.type} needs runId and workerId")
            if self.type != "lease.acquire" and self.generation is None:
                raise ValueError(f"{self.type} needs generation")
        if self.type == "timer.fired":
            # a schedule's timer names its schedule; every other timer names its run
            if getattr(self.payload, "kind", None) == "schedule":
                if not getattr(self.payload, "schedule_id", None):
                    raise ValueError("timer.fired of kind schedule needs payload.scheduleId")
            elif not self.run_id:
                raise ValueError("timer.fired needs runId")
        return self

    def payload_as(self, model: builtins.type[P]) -> P:
        """The payload, typed; raises TypeError if `type` and payload disagree."""
        if not isinstance(self.payload, model):
            raise TypeError(f"{self.type} carries {type(self.payload).__name__}")
        return self.payload
