"""Per-session state folded from events: the active run, its lease and generation, its
pending inputs, the queue of waiting work, the session's clock.

Frozen structs. Everything here is rebuilt by `evolve` from the event log alone, so the state
table is a cache of the log, never a source. Every collection is bounded by `DeciderConfig`
(queue, pending inputs, held text bytes, actions per run, finished runs remembered), so no
producer can grow a session's record without limit.

The state is the processor's own, never on the wire as these types (the changelog holds
`sessionstream.core.state_codec`'s record), so it is made of msgspec structs rather than pydantic
models: the decider builds a new state for every event it emits, and a struct is built or
copied with one field changed ten times faster (docs/decisions/0005-processor-profile.md).
They are not tracked by the garbage collector (`gc=False`: they hold no cycles), so a
processor's cache of many thousand states costs no collector time. `validate_state` checks
every field's type and literal, which the unit tests apply to each state the decider makes.
"""

from __future__ import annotations

import hashlib
from typing import Literal

import msgspec

from sessionstream.schemas.events import InputKind, RunStatus, TerminalStatus

__all__ = [
    "ActionRecord",
    "FinishedRun",
    "OpenCall",
    "PendingInput",
    "QuestionRecord",
    "QueueEntry",
    "RemovedTask",
    "RunState",
    "Schedule",
    "SessionState",
    "StepRecord",
    "command_hash",
    "evolved",
    "state_from_json",
    "state_to_json",
    "validate_state",
]


class _State(msgspec.Struct, frozen=True, gc=False, rename="camel", forbid_unknown_fields=True):
    """Base of the state structs: untracked by the collector, camelCase in JSON, unknown
    fields refused (a record of another version is rebuilt from the log, never half read).
    Each says `frozen` and `kw_only` itself (type checkers and msgspec do not inherit them
    alike)."""


class QueueEntry(_State, frozen=True, kw_only=True):
    """A prompt (or a follow-up that will start its own run) waiting for the session."""

    source_command_id: str
    kind: Literal["prompt", "follow_up"]
    text: str
    context_ref: str | None = None
    timeout_ms: int | None = None
    actor: str | None = None
    retry_of: str | None = None
    #: a prompt's typed input, its compact JSON text (held as text: the decider never
    #: parses it)
    input_json: str | None = None
    #: action kinds the prompt said need approval in its run (at most 16)
    approval_kinds: tuple[str, ...] = ()
    #: the prompt's labels (bounded by `MAX_LABELS` and the key / value lengths)
    metadata: dict[str, str] = {}


class RemovedTask(_State, frozen=True, kw_only=True):
    """A task removed from the queue before it started, remembered (the last
    `finished_window`) to tell a late `dequeue` what became of it."""

    source_command_id: str
    reason: Literal["dequeued", "cleared"]
    actor: str | None = None


class PendingInput(_State, frozen=True, kw_only=True):
    """A steer or follow-up accepted for the active run and not consumed yet."""

    source_command_id: str
    kind: InputKind
    text: str
    #: follow-ups only: what happens if the run ends without consuming it
    on_run_end: Literal["drop", "queue"] = "drop"
    actor: str | None = None


class ActionRecord(_State, frozen=True, kw_only=True):
    """The gate's decision for an idempotency key; never decided twice. A key whose kind
    needs approval is `pending` until a person decides, it expires, or the run's holder,
    status or end resolves it; one denied `lease_lost` may be asked again by the next
    holder (same digest, same `expires_at`)."""

    kind: str
    decision: Literal["approved", "denied", "pending"]
    completed: bool = False
    #: keys that needed approval: the arguments' digest asked for, and when the person's
    #: window closes (None: the key needed no approval)
    args_digest: str | None = None
    expires_at: int | None = None
    #: the generation whose request is (or was last) pending
    generation: int | None = None
    #: a denial's reason (`lease_lost`: the next holder may ask again)
    reason: str | None = None

    @property
    def needed_approval(self) -> bool:
        return self.expires_at is not None


class QuestionRecord(_State, frozen=True, kw_only=True):
    """A question the run asked a person; answered at most once. `open` until a person
    answers, it expires, or the run's holder, status or end closes it; one closed
    `lease_lost` may be asked again by the next holder (same `expires_at`)."""

    status: Literal["open", "answered", "closed"]
    #: when the person's window closes (the decider's clock)
    expires_at: int
    #: the generation whose ask is (or was last) open
    generation: int
    #: the answer's compact JSON text, and who gave it
    answer: str | None = None
    answered_by: str | None = None
    #: why it closed (`lease_lost`: the next holder may ask again)
    reason: str | None = None


class StepRecord(_State, frozen=True, kw_only=True):
    """A recorded step of the active run, handed to each new holder (its input stays in
    the log only). Bounded by `DeciderConfig.max_steps` and `max_run_step_bytes`."""

    step_id: str
    kind: Literal["model", "tool"]
    name: str | None = None
    input_digest: str | None = None
    result: str | None = None
    result_ref: str | None = None
    #: the generation that recorded it
    generation: int

    def held_bytes(self) -> int:
        """UTF-8 bytes this record holds in the state (what `maxRunStepBytes` counts)."""
        return sum(
            len(v.encode())
            for v in (self.step_id, self.name, self.input_digest, self.result, self.result_ref)
            if v is not None
        )


class OpenCall(_State, frozen=True, kw_only=True):
    """A model request, tool call or sub-task the holder reported started (with a call id)
    and not finished: closed as abandoned if its holder loses the lease."""

    kind: Literal["model", "tool", "subtask"]
    name: str | None = None
    call_id: str


class RunState(_State, frozen=True, kw_only=True):
    """The active run. Generation starts at 1 and is bumped whenever a holder loses the lease."""

    run_id: str
    status: RunStatus
    seq: int
    generation: int = 1
    lease_owner: str | None = None
    lease_expires_at: int | None = None
    #: the holder whose lease was lost last (released or expired)
    last_holder: str | None = None
    started_at: int
    timeout_at: int
    cancel_requested_at: int | None = None
    cancel_deadline_at: int | None = None
    prompt: str
    context_ref: str | None = None
    source_command_id: str
    actions: dict[str, ActionRecord] = {}
    inputs: tuple[PendingInput, ...] = ()
    #: the latest `context.checkpointed` pointer of the run, handed to each new holder
    checkpoint_ref: str | None = None
    #: recorded steps, in record order
    steps: tuple[StepRecord, ...] = ()
    #: calls started and not finished, in start order (at most `max_open_calls`)
    open_calls: tuple[OpenCall, ...] = ()
    #: who asked for the run (the starting command's actor), handed to every holder
    actor: str | None = None
    #: the prompt's typed input, compact JSON text, handed to every holder (not one of
    #: the pending `inputs`: those are steers and follow-ups)
    input_json: str | None = None
    #: action kinds the run's prompt said need approval (at most 16)
    approval_kinds: tuple[str, ...] = ()
    #: questions asked of a person, by question id, in the order first asked (at most
    #: `max_questions`)
    questions: dict[str, QuestionRecord] = {}

    def step(self, step_id: str) -> StepRecord | None:
        for st in self.steps:
            if st.step_id == step_id:
                return st
        return None

    def input(self, source_command_id: str) -> PendingInput | None:
        for i in self.inputs:
            if i.source_command_id == source_command_id:
                return i
        return None

    def pending_actions(self) -> list[tuple[str, ActionRecord]]:
        """Keys waiting for a person, in the order they were first asked."""
        return [(k, r) for k, r in self.actions.items() if r.decision == "pending"]

    def open_questions(self) -> list[tuple[str, QuestionRecord]]:
        """Questions waiting for a person, in the order they were first asked."""
        return [(k, q) for k, q in self.questions.items() if q.status == "open"]


class FinishedRun(_State, frozen=True, kw_only=True):
    """What we remember of a recent terminal run, to answer late writes precisely."""

    run_id: str
    status: TerminalStatus
    generation: int
    retryable: bool = False
    #: the command that started it (a late `dequeue` naming it learns the run's fate)
    source_command_id: str | None = None


class Schedule(_State, frozen=True, kw_only=True):
    """A schedule the session keeps: its definition and its next firing, as the events of
    its definition and of its last firing recorded them (never computed by the fold)."""

    schedule_id: str
    #: the log position of the event that defined it (created / updated): its timers carry
    #: it as their generation, so a timer of an older definition is stale
    revision: int
    cron: str | None = None
    timezone: str = "UTC"
    interval_ms: int | None = None
    anchor_at: int = 0
    # the prompt it sends
    text: str
    input_json: str | None = None
    timeout_ms: int | None = None
    context_ref: str | None = None
    overlap: Literal["reject", "enqueue", "interrupt", "skip"] = "skip"
    catch_up: Literal["once", "all", "skip"] = "once"
    max_catch_up: int = 10
    jitter_ms: int = 0
    #: the next time by the cron or the interval, and the instant it fires (with jitter)
    next_nominal_at: int
    next_at: int
    #: late firings in a row so far (catch-up `all` stops at `max_catch_up`)
    caught_up: int = 0
    actor: str | None = None
    #: the labels of each run it starts (a prompt's `metadata`)
    metadata: dict[str, str] = {}

    def held_bytes(self) -> int:
        return len(self.text.encode()) + (
            0 if self.input_json is None else len(self.input_json.encode())
        )


class SessionState(_State, frozen=True, kw_only=True):
    """Everything the decider needs about one session."""

    session_id: str
    tenant_id: str | None = None
    active: RunState | None = None
    queue: tuple[QueueEntry, ...] = ()
    log_seq: int = 0
    runs_started: int = 0
    #: the decider's clock: the latest time any of the session's events was decided at
    clock: int = 0
    finished: tuple[FinishedRun, ...] = ()
    #: the latest `context.checkpointed` of any of the session's runs
    last_checkpoint: str | None = None
    #: tasks removed from the queue, the last `finished_window` of them
    removed: tuple[RemovedTask, ...] = ()
    #: when the session's last run finished and nothing started after it (the retention
    #: timer counts from it); None while a run is active, before the first run, after an
    #: erasure
    idle_since: int | None = None
    #: when the session was last erased (`session.erased`): the state then holds nothing
    #: but its id, tenant, clock and counters, so later keys never repeat an erased one
    erased_at: int | None = None
    #: the session's schedules, in the order they were created (at most `max_schedules`)
    schedules: tuple[Schedule, ...] = ()

    @classmethod
    def initial(cls, session_id: str) -> SessionState:
        return cls(session_id=session_id)

    def finished_run(self, run_id: str) -> FinishedRun | None:
        for f in self.finished:
            if f.run_id == run_id:
                return f
        return None

    def schedule(self, schedule_id: str) -> Schedule | None:
        for sc in self.schedules:
            if sc.schedule_id == schedule_id:
                return sc
        return None

    def queued(self, source_command_id: str) -> QueueEntry | None:
        for q in self.queue:
            if q.source_command_id == source_command_id:
                return q
        return None

    def held_bytes(self) -> int:
        """UTF-8 bytes of producer text the state holds: the active prompt and its typed
        input, its pending inputs, the queue's texts and typed inputs, and the schedules'
        prompts. Bounded by `DeciderConfig.max_held_bytes`."""
        n = sum(sc.held_bytes() for sc in self.schedules)
        for q in self.queue:
            n += len(q.text.encode())
            if q.input_json is not None:
                n += len(q.input_json.encode())
        a = self.active
        if a is not None:
            n += len(a.prompt.encode())
            if a.input_json is not None:
                n += len(a.input_json.encode())
            n += sum(len(i.text.encode()) for i in a.inputs)
        return n


def command_hash(command_id: str, tenant_id: str = "") -> int:
    """64-bit digest of a tenant's command id: dedup records are keyed by these, not by the
    ids. The tenant is part of it, so another tenant's command (refused, or decided before
    the session had an owner) never takes an id from the owner."""
    key = f"{tenant_id}\x00{command_id}".encode() if tenant_id else command_id.encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


#: a copy of a state struct with some fields changed (no validation: the decider's values
#: are typed where they are made)
evolved = msgspec.structs.replace


def validate_state(state: SessionState) -> SessionState:
    """The state rebuilt through msgspec's validation: raises `msgspec.ValidationError` if
    any field holds a value its type (or literal) does not admit."""
    return msgspec.convert(msgspec.to_builtins(state), SessionState)


def state_to_json(state: SessionState) -> bytes:
    """The state as JSON (camelCase), as the state table's first record format held it."""
    return msgspec.json.encode(state)


def state_from_json(data: bytes | str) -> SessionState:
    """A state from its JSON (camelCase), validated."""
    return msgspec.json.decode(data, type=SessionState)
