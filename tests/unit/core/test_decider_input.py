"""A prompt's typed input (docs/protocol.md#producer-commands), written from the spec: any
JSON value (null: none), carried by the run it starts or the task it queues, held as text
and counted in the session's held-text bound, part of the command's content for duplicate
detection, and refused where the protocol has no place for it."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from sessionstream.core.decider import DeciderConfig, command_digest
from sessionstream.core.open_runs import open_run
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.commands import MAX_INPUT_DEPTH, Command
from sessionstream.schemas.errors import MalformedRecord, SchemaViolation
from sessionstream.schemas.events import CommandRejected, Event, RunQueued, RunStarted
from tests.unit._harness import Harness, tokens
from tests.unit._model import LogModel

ORDER = {"sku": "A-1", "qty": 2, "gift": False, "note": "é ✈", "tags": ["x", None, 1.5]}
CODEC = Codec()


def prompt(h: Harness, text: str = "p", **payload: Any) -> list[Event]:
    """A prompt (and the reference model shown the command itself)."""
    cmd = h.command("prompt", {"text": text, **payload})
    events = h.apply(cmd)
    model = LogModel()
    for e in h.log:
        model.event(e)
    model.carried(cmd, events)
    return events


def started(events: list[Event]) -> RunStarted:
    return next(e for e in events if e.type == "run.started").payload_as(RunStarted)


def value(text: str | None) -> Any:
    return None if text is None else json.loads(text)


@pytest.mark.parametrize("given", [ORDER, [1, "two", {"3": 3}], "just text", 42, -0.5, True])
def test_the_run_a_prompt_starts_carries_its_input_as_json_text(given: Any) -> None:
    h = Harness()
    run = started(prompt(h, input=given))
    assert isinstance(run.input, str) and value(run.input) == given
    assert run.input == json.dumps(given, ensure_ascii=False, separators=(",", ":"))
    # the state holds the text, and so does the open-runs record the workers read
    assert h.state.active is not None and h.state.active.input_json == run.input
    o = open_run(h.state)
    assert o is not None and o.input == run.input


def test_an_object_keeps_its_keys_in_the_order_the_producer_wrote_them() -> None:
    h = Harness()
    run = started(prompt(h, input={"b": 1, "a": 2}))
    assert run.input == '{"b":1,"a":2}'


def test_null_is_no_input_and_a_prompt_without_one_digests_as_before_the_field() -> None:
    h = Harness()
    plain = h.command("prompt", {"text": "x"})
    null = h.command("prompt", {"text": "x", "input": None})
    assert started(h.apply(null)).input is None
    # the digest of a prompt without input is the one an earlier version recorded (the
    # protocol's recipe over the payload JSON of that version, which had no `input`): a
    # re-send across the upgrade is still a duplicate
    old_payload = (
        b'{"text":"x","policy":"reject","context_ref":null,"timeout_ms":null,"retry_of":null}'
    )
    envelope = b"\x01prompt\x1f\x01acme\x1f\x00\x1f\x00\x1f\x00\x1f\x00\x1f"
    before = int.from_bytes(hashlib.blake2b(envelope + old_payload, digest_size=8).digest(), "big")
    assert command_digest(plain) == command_digest(null) == before


def test_a_queued_prompt_keeps_its_input_until_it_starts() -> None:
    h = Harness()
    prompt(h, "first", input={"n": 1})
    h.acquire("w1")
    [queued] = prompt(h, "second", policy="enqueue", input=["second", 2])
    assert value(queued.payload_as(RunQueued).input) == ["second", 2]
    interrupt = prompt(h, "third", policy="interrupt", input="third")
    [front] = [e for e in interrupt if e.type == "run.queued"]
    assert value(front.payload_as(RunQueued).input) == "third"
    assert [value(q.input_json) for q in h.state.queue] == ["third", ["second", 2]]
    # the interrupt cancels the first run; each queued prompt starts with its own input
    third = started(h.work("cancel.ack"))
    assert (third.origin, value(third.input)) == ("queued", "third")
    h.acquire("w1")
    second = started(h.work("run.complete", {"result": "ok"}))
    assert (second.prompt, value(second.input)) == ("second", ["second", 2])


def test_a_queued_prompt_without_input_starts_without_one() -> None:
    h = Harness()
    prompt(h, "first", input=ORDER)
    h.acquire("w1")
    prompt(h, "second", policy="enqueue")
    assert started(h.work("run.complete")).input is None


def test_a_follow_up_or_a_send_that_starts_a_run_starts_it_without_input() -> None:
    h = Harness()
    run = started(h.follow_up("f"))
    assert run.origin == "follow_up" and run.input is None
    h.abort()
    run = started(h.send("s"))
    assert run.origin == "send" and run.input is None


def test_a_send_with_an_input_violates_its_schema() -> None:
    """`send` carries no input: as a follow-up it would have nowhere to go, and a send never
    refuses for the session's state (docs/protocol.md#input-modes)."""
    record = {
        "commandId": "c",
        "sessionId": "s",
        "tenantId": "t",
        "type": "send",
        "ts": 1,
        "payload": {"text": "x", "input": {"a": 1}},
    }
    with pytest.raises(SchemaViolation, match="input"):
        CODEC.decode_command(json.dumps(record).encode())


def test_a_retry_carries_its_own_input_and_inherits_none() -> None:
    h = Harness()
    first = started(prompt(h, input={"attempt": 1}))
    h.acquire("w1")
    h.work("run.fail", {"error": "flaky", "retryable": True})
    failed = h.last_run
    again = started(prompt(h, "retry", retry_of=failed, input={"attempt": 2}))
    assert (again.retry_of, value(again.input)) == (failed, {"attempt": 2})
    assert value(first.input) == {"attempt": 1}
    h.acquire("w1")
    h.work("run.fail", {"error": "flaky", "retryable": True})
    bare = started(prompt(h, "retry without", retry_of=h.last_run))
    assert bare.input is None  # the session keeps nothing of a finished run's input


# -- duplicates ----------------------------------------------------------------------------------


def test_the_same_prompt_with_the_same_input_is_a_duplicate() -> None:
    h = Harness()
    first = h.command("prompt", {"text": "p", "input": ORDER})
    assert tokens(h.apply(first)) == ["run.started:prompt"]
    assert h.apply(first) == []
    assert h.apply(first.model_copy(update={"ts": first.ts + 9})) == []
    # and through the wire: its Avro and its JSON decode to the same content
    assert h.apply(CODEC.decode_command(CODEC.encode_command(first))) == []
    assert h.apply(CODEC.decode_command(Codec.command_to_json(first))) == []


@pytest.mark.parametrize(
    "other",
    [
        {"sku": "A-1", "qty": 3, "gift": False, "note": "é ✈", "tags": ["x", None, 1.5]},
        None,
        # the same members in another order: the digest is of the JSON as it came
        dict(reversed(list(ORDER.items()))),
        [ORDER],
    ],
    ids=["another value", "no input", "keys reordered", "wrapped"],
)
def test_another_input_under_the_same_command_id_is_a_reused_id(other: Any) -> None:
    h = Harness()
    first = h.command("prompt", {"text": "p", "input": ORDER}, command_id="order-1")
    h.apply(first)
    payload = {"text": "p"} if other is None else {"text": "p", "input": other}
    again = h.command("prompt", payload, command_id="order-1")
    assert command_digest(again) != command_digest(first)
    assert tokens(h.apply(again)) == ["rejected:command_id_reused"]
    # nothing of the second input reached the session
    assert h.state.active is not None and value(h.state.active.input_json) == ORDER


def test_a_prompt_without_input_re_sent_with_one_is_a_reused_id() -> None:
    h = Harness()
    h.apply(h.command("prompt", {"text": "p"}, command_id="c-9"))
    assert tokens(h.apply(h.command("prompt", {"text": "p", "input": 1}, command_id="c-9"))) == [
        "rejected:command_id_reused"
    ]


# -- bounds --------------------------------------------------------------------------------------


def test_an_input_that_pushes_the_payload_over_its_bound_is_refused_as_oversized_text_is() -> None:
    limit = 300
    h = Harness(DeciderConfig(max_payload_bytes=limit))
    base = Command.model_validate(
        {
            "commandId": "x",
            "sessionId": "s",
            "tenantId": "t",
            "type": "prompt",
            "ts": 1,
            "payload": {"text": "t", "input": {"k": ""}},
        }
    )
    empty = len(base.payload.__pydantic_serializer__.to_json(base.payload))
    fits = {"k": "y" * (limit - empty)}
    assert tokens(prompt(h, "t", input=fits)) == ["run.started:prompt"]
    h.abort()
    [too_large] = prompt(h, "t", input={"k": "y" * (limit - empty + 1)})
    [oversized_text] = prompt(h, "t" * (limit + 1))
    for rej in (too_large, oversized_text):
        why = rej.payload_as(CommandRejected)
        assert why.reason == "payload_too_large"
    assert too_large.payload_as(CommandRejected).detail == f"{limit + 1} bytes > {limit}"
    assert h.state.active is None and h.state.queue == ()


def test_a_queued_input_counts_in_the_text_the_session_holds() -> None:
    h = Harness(DeciderConfig(max_held_bytes=400, max_payload_bytes=1000))
    prompt(h, "run", input={"a": "x" * 100})  # a run's input is held: 3 + 111 bytes
    assert h.state.held_bytes() == len("run") + len('{"a":"' + "x" * 100 + '"}')
    h.acquire("w1")
    # a task whose text fits but whose input would pass the bound is refused
    [refused] = prompt(h, "q", policy="enqueue", input="z" * 300)
    assert refused.payload_as(CommandRejected).reason == "queue_full"
    assert "maxHeldBytes 400" in (refused.payload_as(CommandRejected).detail or "")
    assert h.state.queue == ()
    # the same task with a smaller input is taken, and counted
    before = h.state.held_bytes()
    prompt(h, "q", policy="enqueue", input="z" * 200)
    assert h.state.held_bytes() == before + 1 + 202
    # an interrupting prompt refused for it cancels nothing
    [refused] = prompt(h, "i", policy="interrupt", input="z" * 100)
    assert refused.payload_as(CommandRejected).reason == "queue_full"
    assert h.status == "running"


def test_an_input_that_is_not_json_or_nests_too_deeply_violates_the_schema() -> None:
    def record(value_text: str) -> bytes:
        return (
            '{"commandId":"c","sessionId":"s","tenantId":"t","type":"prompt","ts":1,'
            '"payload":{"text":"x","input":' + value_text + "}}"
        ).encode()

    deep = "[" * (MAX_INPUT_DEPTH + 1) + "]" * (MAX_INPUT_DEPTH + 1)
    ok = "[" * MAX_INPUT_DEPTH + "]" * MAX_INPUT_DEPTH
    assert CODEC.decode_command(record(ok)).payload.model_dump()["input"] is not None
    for bad in ("NaN", "[1, Infinity]", deep, '"a\\u0000b"', '{"k": "\\ud800"}'):
        with pytest.raises((SchemaViolation, MalformedRecord)):
            CODEC.decode_command(record(bad))


# -- who may, and when ---------------------------------------------------------------------------


def test_another_tenants_prompt_with_an_input_holds_nothing() -> None:
    h = Harness()
    prompt(h, "mine")
    h.abort()
    before = h.state
    assert tokens(h.do("prompt", {"text": "theirs", "input": ORDER}, tenant="other")) == [
        "rejected:tenant_mismatch"
    ]
    assert h.state.queue == before.queue and h.state.active is None


def test_a_prompt_naming_a_run_that_ended_holds_nothing_of_its_input() -> None:
    h = Harness()
    prompt(h, "a")
    old = h.last_run
    h.abort()
    late = h.do("prompt", {"text": "late", "input": ORDER, "policy": "enqueue"}, run_id=old)
    assert tokens(late) == ["rejected:run_not_active"]
    assert h.state.active is None and h.state.queue == ()


def test_values_python_holds_equal_are_other_inputs_on_the_wire() -> None:
    """1, 1.0 and true are equal in Python and three inputs in JSON: the id keeps its
    first one."""
    h = Harness()
    h.apply(h.command("prompt", {"text": "p", "input": 1}, command_id="n"))
    for other in (True, 1.0):
        again = h.command("prompt", {"text": "p", "input": other}, command_id="n")
        assert tokens(h.apply(again)) == ["rejected:command_id_reused"]
    assert h.state.active is not None and h.state.active.input_json == "1"
