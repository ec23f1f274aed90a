"""The session state record: a compact positional binary form, and the JSON of old versions.

The state table (`session.state` and the processor's local store) holds one record per
session, written on every batch that changes the session. The record is MessagePack
(msgspec) of the state's fields **by position**, behind a one-byte format tag:

    0x09 | msgpack [session_id, tenant_id, active, queue, log_seq, runs_started, clock,
                    finished, last_checkpoint, idle_since, erased_at, schedules, removed]

(Still read: 0x08, the same without the active run's questions to a person at its end;
0x07, also without queue control and labels: the `removed` tasks at the
end, each finished run's source command id, each queued task's and each schedule's
metadata; 0x06, also without
the schedules; 0x05, also without erasure and retention's `idle_since` and `erased_at`;
0x04, also without approvals: each action key's digest, expiry, generation and reason, and
the approval kinds of the active run and of each queued task; 0x03, also without the typed
`input` at the end of the active run and of each queued task; 0x02, also without the
active run's `actor`; 0x01, also without the fields durable steps added: the active run's
`checkpoint_ref`, `steps` and `open_calls`, and the session's `last_checkpoint`.)

Field names are not written; statuses and kinds are small integers (their index in the
`Literal` they come from); run ids that are canonical UUIDs (every run id the decider makes)
are their 16 bytes. Chosen by measurement (`bench/results/state-encoding.md`): a busy
session's record is ~3.5x smaller than its JSON, and encoding it costs about the same.

Evolution: a change of the fields is a new format tag, and the decoder keeps reading the
old tags. A record that starts with `{` is the JSON of earlier versions and is still read.
A unit test fails when a model gains a field the codec does not write.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Final, get_args, get_type_hints

import msgspec

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
    state_from_json,
)
from sessionstream.schemas.events import InputKind, RunStatus, TerminalStatus

__all__ = [
    "FORMAT_V1",
    "FORMAT_V2",
    "FORMAT_V3",
    "FORMAT_V4",
    "FORMAT_V5",
    "FORMAT_V6",
    "FORMAT_V7",
    "FORMAT_V8",
    "FORMAT_V9",
    "STATE_FIELDS",
    "decode_if_active",
    "decode_state",
    "encode_state",
    "is_current",
]

FORMAT_V1: Final = 0x01
#: v1 + the active run's checkpoint pointer and recorded steps
FORMAT_V2: Final = 0x02
#: v2 + the active run's actor
FORMAT_V3: Final = 0x03
#: v3 + the typed input of the active run and of each queued task
FORMAT_V4: Final = 0x04
#: v4 + approvals: each action record's digest, expiry, generation and reason; the approval
#: kinds of the active run and of each queued task
FORMAT_V5: Final = 0x05
#: v5 + erasure and retention: when the session went idle, when it was erased
FORMAT_V6: Final = 0x06
#: v6 + the session's schedules
FORMAT_V7: Final = 0x07
#: v7 + queue control and labels: the tasks removed from the queue, each finished run's
#: source command id, each queued task's and each schedule's metadata
FORMAT_V8: Final = 0x08
#: v8 + the active run's questions to a person (status, window, generation, answer, reason)
FORMAT_V9: Final = 0x09
_TAG: Final = bytes([FORMAT_V9])
_READABLE: Final = frozenset(
    {
        bytes([FORMAT_V1]),
        bytes([FORMAT_V2]),
        bytes([FORMAT_V3]),
        bytes([FORMAT_V4]),
        bytes([FORMAT_V5]),
        bytes([FORMAT_V6]),
        bytes([FORMAT_V7]),
        bytes([FORMAT_V8]),
        _TAG,
    }
)

#: the fields each tuple holds, in order: what a unit test holds the models to
STATE_FIELDS: Final[dict[type, tuple[str, ...]]] = {
    SessionState: (
        "session_id",
        "tenant_id",
        "active",
        "queue",
        "log_seq",
        "runs_started",
        "clock",
        "finished",
        "last_checkpoint",
        "idle_since",
        "erased_at",
        "schedules",
        "removed",
    ),
    Schedule: (
        "schedule_id",
        "revision",
        "cron",
        "timezone",
        "interval_ms",
        "anchor_at",
        "text",
        "input_json",
        "timeout_ms",
        "context_ref",
        "overlap",
        "catch_up",
        "max_catch_up",
        "jitter_ms",
        "next_nominal_at",
        "next_at",
        "caught_up",
        "actor",
        "metadata",
    ),
    RunState: (
        "run_id",
        "status",
        "seq",
        "generation",
        "lease_owner",
        "lease_expires_at",
        "last_holder",
        "started_at",
        "timeout_at",
        "cancel_requested_at",
        "cancel_deadline_at",
        "prompt",
        "context_ref",
        "source_command_id",
        "actions",
        "inputs",
        "checkpoint_ref",
        "steps",
        "open_calls",
        "actor",
        "input_json",
        "approval_kinds",
        "questions",
    ),
    OpenCall: ("kind", "name", "call_id"),
    StepRecord: (
        "step_id",
        "kind",
        "name",
        "input_digest",
        "result",
        "result_ref",
        "generation",
    ),
    ActionRecord: (
        "kind",
        "decision",
        "completed",
        "args_digest",
        "expires_at",
        "generation",
        "reason",
    ),
    QuestionRecord: ("status", "expires_at", "generation", "answer", "answered_by", "reason"),
    PendingInput: ("source_command_id", "kind", "text", "on_run_end", "actor"),
    QueueEntry: (
        "source_command_id",
        "kind",
        "text",
        "context_ref",
        "timeout_ms",
        "actor",
        "retry_of",
        "input_json",
        "approval_kinds",
        "metadata",
    ),
    FinishedRun: ("run_id", "status", "generation", "retryable", "source_command_id"),
    RemovedTask: ("source_command_id", "reason", "actor"),
}


def _field_type(cls: type[msgspec.Struct], name: str) -> Any:
    return get_type_hints(cls)[name]


def _vocab(*words: str) -> tuple[tuple[str, ...], dict[str, int]]:
    return words, {w: i for i, w in enumerate(words)}


_RUN_STATUS, _RUN_STATUS_I = _vocab(*get_args(RunStatus))
_TERMINAL, _TERMINAL_I = _vocab(*get_args(TerminalStatus))
_INPUT_KIND, _INPUT_KIND_I = _vocab(*get_args(InputKind))
_ON_END, _ON_END_I = _vocab(*get_args(_field_type(PendingInput, "on_run_end")))
_QUEUE_KIND, _QUEUE_KIND_I = _vocab(*get_args(_field_type(QueueEntry, "kind")))
_DECISION, _DECISION_I = _vocab(*get_args(_field_type(ActionRecord, "decision")))
_STEP_KIND, _STEP_KIND_I = _vocab(*get_args(_field_type(StepRecord, "kind")))
_CALL_KIND, _CALL_KIND_I = _vocab(*get_args(_field_type(OpenCall, "kind")))
_QSTATUS, _QSTATUS_I = _vocab(*get_args(_field_type(QuestionRecord, "status")))
_OVERLAP, _OVERLAP_I = _vocab(*get_args(_field_type(Schedule, "overlap")))
_CATCH_UP, _CATCH_UP_I = _vocab(*get_args(_field_type(Schedule, "catch_up")))
_REMOVED, _REMOVED_I = _vocab(*get_args(_field_type(RemovedTask, "reason")))

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


@lru_cache(maxsize=1 << 16)
def _uuid_or_str(s: str) -> bytes | str:
    """A canonical (lower-case, hyphenated) UUID as its 16 bytes; any other id as is."""
    if len(s) == 36 and s[8] == s[13] == s[18] == s[23] == "-":
        try:
            b = bytes.fromhex(s.replace("-", ""))
        except ValueError:
            return s
        if _uuid_text(b) == s:
            return b
    return s


def _uuid_text(b: bytes) -> str:
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@lru_cache(maxsize=1 << 16)
def _id(v: bytes | str) -> str:
    return _uuid_text(v) if isinstance(v, bytes) else v


def encode_state(state: SessionState) -> bytes:
    """The state table / changelog value of `state`."""
    a = state.active
    active: Any = None
    if a is not None:
        active = (
            _uuid_or_str(a.run_id),
            _RUN_STATUS_I[a.status],
            a.seq,
            a.generation,
            a.lease_owner,
            a.lease_expires_at,
            a.last_holder,
            a.started_at,
            a.timeout_at,
            a.cancel_requested_at,
            a.cancel_deadline_at,
            a.prompt,
            a.context_ref,
            a.source_command_id,
            [
                (
                    k,
                    r.kind,
                    _DECISION_I[r.decision],
                    r.completed,
                    r.args_digest,
                    r.expires_at,
                    r.generation,
                    r.reason,
                )
                for k, r in a.actions.items()
            ],
            [
                (
                    i.source_command_id,
                    _INPUT_KIND_I[i.kind],
                    i.text,
                    _ON_END_I[i.on_run_end],
                    i.actor,
                )
                for i in a.inputs
            ],
            a.checkpoint_ref,
            [
                (
                    st.step_id,
                    _STEP_KIND_I[st.kind],
                    st.name,
                    st.input_digest,
                    st.result,
                    st.result_ref,
                    st.generation,
                )
                for st in a.steps
            ],
            [(_CALL_KIND_I[c.kind], c.name, c.call_id) for c in a.open_calls],
            a.actor,
            a.input_json,
            a.approval_kinds,
            [
                (
                    k,
                    _QSTATUS_I[q.status],
                    q.expires_at,
                    q.generation,
                    q.answer,
                    q.answered_by,
                    q.reason,
                )
                for k, q in a.questions.items()
            ],
        )
    return _TAG + _encoder.encode(
        (
            state.session_id,
            state.tenant_id,
            active,
            [
                (
                    q.source_command_id,
                    _QUEUE_KIND_I[q.kind],
                    q.text,
                    q.context_ref,
                    q.timeout_ms,
                    q.actor,
                    q.retry_of,
                    q.input_json,
                    q.approval_kinds,
                    q.metadata,
                )
                for q in state.queue
            ],
            state.log_seq,
            state.runs_started,
            state.clock,
            [
                (
                    _uuid_or_str(f.run_id),
                    _TERMINAL_I[f.status],
                    f.generation,
                    f.retryable,
                    f.source_command_id,
                )
                for f in state.finished
            ],
            state.last_checkpoint,
            state.idle_since,
            state.erased_at,
            [
                (
                    sc.schedule_id,
                    sc.revision,
                    sc.cron,
                    sc.timezone,
                    sc.interval_ms,
                    sc.anchor_at,
                    sc.text,
                    sc.input_json,
                    sc.timeout_ms,
                    sc.context_ref,
                    _OVERLAP_I[sc.overlap],
                    _CATCH_UP_I[sc.catch_up],
                    sc.max_catch_up,
                    sc.jitter_ms,
                    sc.next_nominal_at,
                    sc.next_at,
                    sc.caught_up,
                    sc.actor,
                    sc.metadata,
                )
                for sc in state.schedules
            ],
            [(r.source_command_id, _REMOVED_I[r.reason], r.actor) for r in state.removed],
        )
    )


def decode_state(data: bytes) -> SessionState:
    """A state record of this version (or JSON of an earlier one). Raises ValueError for
    anything else (the processor then folds the session again from the events log)."""
    if data[:1] == b"{":
        try:
            return state_from_json(data)
        except msgspec.DecodeError as e:  # ValidationError is one too
            raise ValueError(f"unreadable JSON state record: {e}") from e
    if data[:1] not in _READABLE:
        raise ValueError(f"unknown state record format {data[:1]!r}")
    try:
        return _session(_decoder.decode(memoryview(data)[1:]))
    except (msgspec.DecodeError, TypeError, ValueError, IndexError, KeyError) as e:
        raise ValueError(f"unreadable state record: {e}") from e


def is_current(data: bytes) -> bool:
    """Whether `data` is a record of this version's format (stored as is)."""
    return data[:1] == _TAG


def decode_if_active(data: bytes, *, idle_too: bool = False) -> SessionState | None:
    """A current-format record's state if its session has an active run or a schedule (or,
    with `idle_too`, went idle after a run: it has a retention deadline), else None (what
    the processor's restore needs for the timers; other sessions stay bytes)."""
    try:
        t = _decoder.decode(memoryview(data)[1:])
        scheduled = len(t) > 11 and bool(t[11])
        if t[2] is None and not scheduled and not (idle_too and len(t) > 9 and t[9] is not None):
            return None
        return _session(t)
    except (msgspec.DecodeError, TypeError, ValueError, IndexError, KeyError) as e:
        raise ValueError(f"unreadable state record: {e}") from e


# The records come from the processor itself (its own states, typed when they were
# decided), so they are rebuilt without a second validation.


def _session(t: list[Any]) -> SessionState:
    sid, tenant, active, queue, log_seq, runs_started, clock, finished = t[:8]
    # a v1 record ends with `finished`
    return SessionState(
        session_id=sid,
        tenant_id=tenant,
        active=None if active is None else _run(active),
        queue=tuple(
            QueueEntry(
                source_command_id=q[0],
                kind=_QUEUE_KIND[q[1]],
                text=q[2],
                context_ref=q[3],
                timeout_ms=q[4],
                actor=q[5],
                retry_of=q[6],
                # a task queued before format 4 has no input
                input_json=q[7] if len(q) > 7 else None,
                # nor approval kinds before format 5
                approval_kinds=tuple(q[8]) if len(q) > 8 else (),
                # nor metadata before format 8
                metadata=q[9] if len(q) > 9 else {},
            )
            for q in queue
        ),
        log_seq=log_seq,
        runs_started=runs_started,
        clock=clock,
        finished=tuple(
            FinishedRun(
                run_id=_id(f[0]),
                status=_TERMINAL[f[1]],
                generation=f[2],
                retryable=f[3],
                # before format 8 a finished run's source is not known
                source_command_id=f[4] if len(f) > 4 else None,
            )
            for f in finished
        ),
        last_checkpoint=t[8] if len(t) > 8 else None,
        # neither before format 6
        idle_since=t[9] if len(t) > 9 else None,
        erased_at=t[10] if len(t) > 10 else None,
        # no schedules before format 7
        schedules=tuple(_schedule(x) for x in t[11]) if len(t) > 11 else (),
        # nor the removed tasks before format 8
        removed=tuple(
            RemovedTask(source_command_id=r[0], reason=_REMOVED[r[1]], actor=r[2])
            for r in (t[12] if len(t) > 12 else ())
        ),
    )


def _schedule(x: list[Any]) -> Schedule:
    return Schedule(
        schedule_id=x[0],
        revision=x[1],
        cron=x[2],
        timezone=x[3],
        interval_ms=x[4],
        anchor_at=x[5],
        text=x[6],
        input_json=x[7],
        timeout_ms=x[8],
        context_ref=x[9],
        overlap=_OVERLAP[x[10]],
        catch_up=_CATCH_UP[x[11]],
        max_catch_up=x[12],
        jitter_ms=x[13],
        next_nominal_at=x[14],
        next_at=x[15],
        caught_up=x[16],
        actor=x[17],
        # a schedule kept before format 8 has no labels
        metadata=x[18] if len(x) > 18 else {},
    )


def _run(a: list[Any]) -> RunState:
    return RunState(
        run_id=_id(a[0]),
        status=_RUN_STATUS[a[1]],
        seq=a[2],
        generation=a[3],
        lease_owner=a[4],
        lease_expires_at=a[5],
        last_holder=a[6],
        started_at=a[7],
        timeout_at=a[8],
        cancel_requested_at=a[9],
        cancel_deadline_at=a[10],
        prompt=a[11],
        context_ref=a[12],
        source_command_id=a[13],
        actions={r[0]: _action(r) for r in a[14]},
        inputs=tuple(
            PendingInput(
                source_command_id=i[0],
                kind=_INPUT_KIND[i[1]],
                text=i[2],
                on_run_end=_ON_END[i[3]],
                actor=i[4],
            )
            for i in a[15]
        ),
        # a v1 record's run ends here: no checkpoint, no steps
        checkpoint_ref=a[16] if len(a) > 16 else None,
        steps=tuple(
            StepRecord(
                step_id=st[0],
                kind=_STEP_KIND[st[1]],
                name=st[2],
                input_digest=st[3],
                result=st[4],
                result_ref=st[5],
                generation=st[6],
            )
            for st in (a[17] if len(a) > 17 else ())
        ),
        open_calls=tuple(
            OpenCall(kind=_CALL_KIND[c[0]], name=c[1], call_id=c[2])
            for c in (a[18] if len(a) > 18 else ())
        ),
        # a v1 or v2 record's run ends before it: no actor
        actor=a[19] if len(a) > 19 else None,
        # a v1, v2 or v3 record's run ends before it: no input
        input_json=a[20] if len(a) > 20 else None,
        # a record before format 5: no approval kinds
        approval_kinds=tuple(a[21]) if len(a) > 21 else (),
        # a record before format 9: no questions
        questions={
            q[0]: QuestionRecord(
                status=_QSTATUS[q[1]],
                expires_at=q[2],
                generation=q[3],
                answer=q[4],
                answered_by=q[5],
                reason=q[6],
            )
            for q in (a[22] if len(a) > 22 else ())
        },
    )


def _action(r: list[Any]) -> ActionRecord:
    if len(r) == 4:  # before format 5: no approvals
        return ActionRecord(kind=r[1], decision=_DECISION[r[2]], completed=r[3])
    return ActionRecord(
        kind=r[1],
        decision=_DECISION[r[2]],
        completed=r[3],
        args_digest=r[4],
        expires_at=r[5],
        generation=r[6],
        reason=r[7],
    )
