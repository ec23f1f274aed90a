"""The state record's binary form: every field written, read back equal field for field and
valid, old JSON still read, broken bytes refused, a busy session under 1 KiB."""

from __future__ import annotations

import msgspec
import pytest

from bench.bench_decider import build
from sessionstream.core.decider import decide
from sessionstream.core.state import (
    ActionRecord,
    FinishedRun,
    OpenCall,
    PendingInput,
    QuestionRecord,
    QueueEntry,
    RemovedTask,
    RunState,
    SessionState,
    StepRecord,
    evolved,
    state_to_json,
    validate_state,
)
from sessionstream.core.state_codec import (
    FORMAT_V1,
    FORMAT_V2,
    FORMAT_V3,
    FORMAT_V4,
    FORMAT_V5,
    FORMAT_V6,
    FORMAT_V8,
    STATE_FIELDS,
    decode_if_active,
    decode_state,
    encode_state,
    is_current,
)

RUN = "0f8fad5b-d9cb-469f-a165-70867728950e"


def _full() -> SessionState:
    """A state with every optional field set and every collection non-empty."""
    return SessionState(
        session_id="s-ü",
        tenant_id="acme",
        active=RunState(
            run_id=RUN,
            status="cancelling",
            seq=12,
            generation=3,
            lease_owner="w-1",
            lease_expires_at=1_767_225_630_000,
            last_holder="w-0",
            started_at=1_767_225_600_000,
            timeout_at=1_767_226_200_000,
            cancel_requested_at=1_767_225_610_000,
            cancel_deadline_at=1_767_225_640_000,
            prompt="find flights ✈",
            context_ref="ctx://1",
            source_command_id="c-1",
            actions={
                "k1": ActionRecord(kind="email", decision="approved", completed=True),
                "k2": ActionRecord(kind="pay", decision="denied"),
                "k3": ActionRecord(
                    kind="payment",
                    decision="pending",
                    args_digest="sha256:ab",
                    expires_at=1_767_226_500_000,
                    generation=3,
                ),
                "k4": ActionRecord(
                    kind="payment",
                    decision="denied",
                    args_digest="sha256:cd",
                    expires_at=1_767_226_400_000,
                    generation=2,
                    reason="lease_lost",
                ),
            },
            inputs=(
                PendingInput(source_command_id="c-2", kind="steer", text="direct", actor="ui"),
                PendingInput(
                    source_command_id="c-3", kind="follow_up", text="trains", on_run_end="queue"
                ),
            ),
            checkpoint_ref="s3://ck/7",
            steps=(
                StepRecord(
                    step_id="model-1",
                    kind="model",
                    name="gpt",
                    input_digest="d1",
                    result='"plan ✈"',
                    generation=2,
                ),
                StepRecord(step_id="tool:s-1", kind="tool", result_ref="s3://st/1", generation=3),
            ),
            open_calls=(
                OpenCall(kind="tool", name="search", call_id="tool:search-2"),
                OpenCall(kind="subtask", call_id="s1"),
            ),
            actor="user:ann",
            input_json='{"to":"LIS","nights":3,"note":"é ✈"}',
            approval_kinds=("payment", "*"),
            questions={
                "q-1": QuestionRecord(
                    status="answered",
                    expires_at=9_000,
                    generation=2,
                    answer='{"account":"é"}',
                    answered_by="user:bo",
                ),
                "q-2": QuestionRecord(status="open", expires_at=9_500, generation=3),
                "q-3": QuestionRecord(
                    status="closed", expires_at=9_600, generation=1, reason="lease_lost"
                ),
            },
        ),
        queue=(
            QueueEntry(
                source_command_id="c-4",
                kind="follow_up",
                text="later",
                context_ref="ctx://2",
                timeout_ms=5000,
                actor="sched",
                retry_of="r-0",
            ),
            QueueEntry(
                source_command_id="c-5",
                kind="prompt",
                text="next",
                input_json="[1.5,null]",
                approval_kinds=("send_email",),
                metadata={"team": "growth", "ticket/id": "T-1"},
            ),
        ),
        log_seq=4,
        runs_started=9,
        clock=1_767_225_611_000,
        finished=(
            FinishedRun(run_id="not-a-uuid", status="failed", generation=2, retryable=True),
            FinishedRun(run_id=RUN.upper(), status="timed_out", generation=1),
            FinishedRun(
                run_id=RUN.replace("0f8f", "1f8f"),
                status="completed",
                generation=1,
                source_command_id="c-0",
            ),
        ),
        last_checkpoint="s3://ck/7",
        removed=(
            RemovedTask(source_command_id="c-6", reason="dequeued", actor="user:bo"),
            RemovedTask(source_command_id="c-7", reason="cleared"),
        ),
        # not a state the decider makes beside an active run: here for the codec only
        idle_since=1_767_225_500_000,
        erased_at=1_767_225_400_000,
    )


@pytest.mark.parametrize("model", list(STATE_FIELDS))
def test_the_codec_writes_every_field_of_every_model(model: type) -> None:
    assert set(STATE_FIELDS[model]) == set(model.__struct_fields__), (
        f"{model.__name__} changed: write its new field in sessionstream/core/state_codec.py "
        "(a new "
        "format tag) and read the old tag still"
    )


def test_a_full_state_reads_back_equal_field_for_field() -> None:
    state = _full()
    data = encode_state(state)
    assert is_current(data)
    back = decode_state(data)
    assert back == state
    assert msgspec.to_builtins(back) == msgspec.to_builtins(state)
    assert state_to_json(back) == state_to_json(state)
    assert validate_state(back) == back
    # ids that are not canonical UUIDs (upper case, free text) come back as they were
    assert [f.run_id for f in back.finished] == [f.run_id for f in state.finished]
    # frozen
    with pytest.raises(AttributeError):
        back.clock = 0  # type: ignore[misc]


#: `_full()` as the first format wrote it (pydantic's `model_dump_json(by_alias=True)`)
OLD_JSON = (
    '{"sessionId":"s-ü","tenantId":"acme","active":{"runId":"0f8fad5b-d9cb-469f-a165-7086'
    '7728950e","status":"cancelling","seq":12,"generation":3,"leaseOwner":"w-1","leaseExp'
    'iresAt":1767225630000,"lastHolder":"w-0","startedAt":1767225600000,"timeoutAt":17672'
    '26200000,"cancelRequestedAt":1767225610000,"cancelDeadlineAt":1767225640000,"prompt"'
    ':"find flights ✈","contextRef":"ctx://1","sourceCommandId":"c-1","actions":{"k1":{"k'
    'ind":"email","decision":"approved","completed":true},"k2":{"kind":"pay","decision":"'
    'denied","completed":false}},"inputs":[{"sourceCommandId":"c-2","kind":"steer","text"'
    ':"direct","onRunEnd":"drop","actor":"ui"},{"sourceCommandId":"c-3","kind":"follow_up'
    '","text":"trains","onRunEnd":"queue","actor":null}]},"queue":[{"sourceCommandId":"c-'
    '4","kind":"follow_up","text":"later","contextRef":"ctx://2","timeoutMs":5000,"actor"'
    ':"sched","retryOf":"r-0"},{"sourceCommandId":"c-5","kind":"prompt","text":"next","co'
    'ntextRef":null,"timeoutMs":null,"actor":null,"retryOf":null}],"logSeq":4,"runsStarte'
    'd":9,"clock":1767225611000,"finished":[{"runId":"not-a-uuid","status":"failed","gene'
    'ration":2,"retryable":true},{"runId":"0F8FAD5B-D9CB-469F-A165-70867728950E","status"'
    ':"timed_out","generation":1,"retryable":false},{"runId":"1f8fad5b-d9cb-469f-a165-708'
    '67728950e","status":"completed","generation":1,"retryable":false}]}'
)


def _full_before_questions() -> SessionState:
    """`_full()` without what format 9 added: the active run's questions to a person."""
    full = _full()
    assert full.active is not None
    return evolved(full, active=evolved(full.active, questions={}))


def _full_before_queue_control() -> SessionState:
    """`_full()` without what format 7 added: the removed tasks, the finished runs' source
    command ids, the queued tasks' labels."""
    full = _full_before_questions()
    return evolved(
        full,
        removed=(),
        finished=tuple(evolved(f, source_command_id=None) for f in full.finished),
        queue=tuple(evolved(q, metadata={}) for q in full.queue),
    )


def _full_before_erasure() -> SessionState:
    """`_full()` without what formats 6 and 7 added: when the session went idle, when it
    was erased, and queue control."""
    return evolved(_full_before_queue_control(), idle_since=None, erased_at=None)


def _full_before_approvals() -> SessionState:
    """`_full()` without what format 5 added: approvals (each key's digest, window,
    generation and reason; the approval kinds of the run and the tasks). Format 4 knew
    no pending decision and no approvals: its keys were approved or denied by the gate."""
    full = _full_before_erasure()
    assert full.active is not None
    actions = {
        k: ActionRecord(kind=r.kind, decision=r.decision, completed=r.completed)
        for k, r in full.active.actions.items()
        if not r.needed_approval
    }
    return evolved(
        full,
        active=evolved(full.active, actions=actions, approval_kinds=()),
        queue=tuple(evolved(q, approval_kinds=()) for q in full.queue),
    )


def _full_before_input() -> SessionState:
    """`_full()` without what format 4 added: the typed input of the run and the tasks."""
    full = _full_before_approvals()
    assert full.active is not None
    return evolved(
        full,
        active=evolved(full.active, input_json=None),
        queue=tuple(evolved(q, input_json=None) for q in full.queue),
    )


def _full_before_steps() -> SessionState:
    """`_full()` without what format 2 added: the run's checkpoint pointer and steps, the
    session's latest checkpoint (and what later formats added)."""
    full = _full_before_input()
    assert full.active is not None
    return evolved(
        full,
        active=evolved(full.active, checkpoint_ref=None, steps=(), open_calls=(), actor=None),
        last_checkpoint=None,
    )


def _older(tag: int, run_fields: int, session_fields: int = 9, queue_fields: int = 7) -> bytes:
    """`_full_before_approvals()`'s record cut to what format `tag` wrote: the active
    run's first `run_fields`, each action key's first 4, the queued tasks' first
    `queue_fields` (7 before format 4), the session's first `session_fields`."""
    t = msgspec.msgpack.decode(encode_state(_full_before_approvals())[1:])
    t[2] = t[2][:run_fields]
    t[2][14] = [r[:4] for r in t[2][14]]
    t[3] = [q[:queue_fields] for q in t[3]]
    t[7] = [f[:4] for f in t[7]]
    return bytes([tag]) + msgspec.msgpack.encode(t[:session_fields])


def test_a_format_6_record_is_still_read() -> None:
    """Format 6 is format 7 without queue control and labels: read with no removed tasks,
    finished runs of unknown source, queued tasks without labels; written again in
    format 7."""
    t = msgspec.msgpack.decode(encode_state(_full_before_questions())[1:])
    t[2] = t[2][:22]
    t[3] = [q[:9] for q in t[3]]
    t[7] = [f[:4] for f in t[7]]
    v6 = bytes([FORMAT_V6]) + msgspec.msgpack.encode(t[:11])
    assert not is_current(v6)
    state = decode_state(v6)
    assert state == _full_before_queue_control()
    assert is_current(encode_state(state)) and decode_state(encode_state(state)) == state


def test_the_json_of_earlier_versions_is_still_read() -> None:
    assert decode_state(OLD_JSON.encode()) == _full_before_steps()
    assert decode_state(state_to_json(_full())) == _full()


def test_a_format_8_record_is_still_read() -> None:
    """Format 8 is format 9 without the active run's questions: read with none, written
    again in format 9."""
    t = msgspec.msgpack.decode(encode_state(_full())[1:])
    t[2] = t[2][:22]
    v8 = bytes([FORMAT_V8]) + msgspec.msgpack.encode(t)
    assert not is_current(v8)
    state = decode_state(v8)
    assert state == _full_before_questions()
    assert is_current(encode_state(state)) and decode_state(encode_state(state)) == state


def test_a_format_5_record_is_still_read() -> None:
    """Format 5 is format 6 without the session's idle and erasure times: read with
    none (no retention deadline until its next run ends), written again in format 6."""
    t = msgspec.msgpack.decode(encode_state(_full_before_questions())[1:])
    t[2] = t[2][:22]
    t[3] = [q[:9] for q in t[3]]
    t[7] = [f[:4] for f in t[7]]
    v5 = bytes([FORMAT_V5]) + msgspec.msgpack.encode(t[:9])
    assert not is_current(v5)
    state = decode_state(v5)
    assert state == _full_before_erasure()
    assert is_current(encode_state(state)) and decode_state(encode_state(state)) == state


def test_decode_if_active_with_retention_also_decodes_sessions_gone_idle() -> None:
    idle = SessionState(session_id="s", tenant_id="t", idle_since=5, clock=5)
    assert decode_if_active(encode_state(idle)) is None
    assert decode_if_active(encode_state(idle), idle_too=True) == idle
    never = SessionState.initial("n")
    assert decode_if_active(encode_state(never), idle_too=True) is None


def test_a_format_4_record_is_still_read() -> None:
    """Format 4 is format 5 without approvals: its keys read with no digest, window,
    generation or reason, its run and tasks with no approval kinds; written again in
    format 5."""
    v4 = _older(FORMAT_V4, 21, queue_fields=8)
    assert not is_current(v4)
    state = decode_state(v4)
    assert state == _full_before_approvals()
    assert is_current(encode_state(state)) and decode_state(encode_state(state)) == state


def test_a_format_3_record_is_still_read() -> None:
    """Format 3 is format 4 without the typed input of the active run and of each queued
    task: read with none, and written again in format 4."""
    v3 = _older(FORMAT_V3, 20)
    assert not is_current(v3)
    state = decode_state(v3)
    assert state == _full_before_input()
    assert is_current(encode_state(state)) and decode_state(encode_state(state)) == state


def test_a_format_2_record_is_still_read() -> None:
    """Format 2 is format 3 without the active run's actor."""
    v2 = _older(FORMAT_V2, 19)
    assert not is_current(v2)
    full = _full_before_input()
    assert full.active is not None
    assert decode_state(v2) == evolved(full, active=evolved(full.active, actor=None))


def test_a_format_1_record_is_still_read() -> None:
    """Format 1 is format 2 without the fields durable steps added."""
    v1 = _older(FORMAT_V1, 16, session_fields=8)
    assert not is_current(v1)
    assert decode_state(v1) == _full_before_steps()


@pytest.mark.parametrize(
    "bad",
    [
        {"status": "sleeping"},  # not a RunStatus
        {"seq": "12"},  # not an int
        {"inputs": [{"sourceCommandId": "c", "kind": "nudge", "text": ""}]},
        {"recentCommands": [1, 2, 3]},  # a field of another version
    ],
)
def test_a_json_record_with_a_value_its_type_refuses_is_no_state(bad: dict) -> None:
    doc = msgspec.json.decode(OLD_JSON)
    doc["active"].update(bad)
    with pytest.raises(ValueError):
        decode_state(msgspec.json.encode(doc))
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(doc, SessionState)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x02whatever",
        b"\x03whatever",
        b"\x04whatever",
        b"\x01",
        b"\x01\x93\x01\x02\x03",
        encode_state(_full())[:-3],
    ],
)
def test_bytes_that_are_no_state_record_are_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_state(data)


def test_decode_if_active_skips_idle_sessions() -> None:
    assert decode_if_active(encode_state(SessionState.initial("idle"))) is None
    assert decode_if_active(encode_state(_full())) == _full()


def test_a_busy_session_record_stays_under_1_kib() -> None:
    """600 commands on one session (runs completed and aborted, steers, follow-ups, leases):
    the finished-run memory is bounded and the record compact."""
    state = SessionState.initial("s-0")
    largest = 0
    for cmd in build(600, 1):
        state = decide(state, cmd).state
        data = encode_state(state)
        assert decode_state(data) == state
        largest = max(largest, len(data))
    assert largest <= 1024, largest
    assert len(state_to_json(state)) > 2 * largest  # what JSON took
