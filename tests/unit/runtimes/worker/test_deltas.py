"""Token deltas, from the spec (issue "token deltas to the console"; docs/workers.md): a
streaming model's pieces of answer are published per model call, batched, numbered from 1
without gaps, outside the log — a view: the finished step holds the whole answer, a stale
holder publishes none, a model that does not stream is never handed a callback, and a
delta that cannot be published never fails the run."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sessionstream.agent import AbortSignal, RunContext
from sessionstream.runtimes.worker._deltas import MAX_PENDING_CHARS, DeltaBuffer, DeltaKey
from sessionstream.runtimes.worker.model import FakeModel, streams_deltas
from sessionstream.testing import AgentHarness


def key(call: str = "model-1", run: str = "r-1") -> DeltaKey:
    return DeltaKey("acme:s-1", "acme", run, 2, call, 3)


class Sent:
    def __init__(self) -> None:
        self.records: list[tuple[int, bytes, dict[str, Any]]] = []

    def __call__(self, partition: int, k: bytes, value: bytes) -> None:
        self.records.append((partition, k, json.loads(value)))


def test_one_record_per_call_per_flush_with_the_text_that_arrived_in_order() -> None:
    sent = Sent()
    buf = DeltaBuffer(sent, clock=lambda: 12.5)
    for piece in ("Hel", "lo", " wor"):
        buf.add(key(), piece)
    buf.add(key("model-2"), "other call")
    assert sent.records == []  # nothing before the flush
    assert buf.flush() == 2
    by_call = {r[2]["callId"]: r for r in sent.records}
    partition, k, first = by_call["model-1"]
    assert partition == 3 and k == b"acme:s-1/r-1/model-1"
    assert first == {
        "type": "model.delta",
        "sessionId": "acme:s-1",
        "tenantId": "acme",
        "runId": "r-1",
        "generation": 2,
        "callId": "model-1",
        "seq": 1,
        "text": "Hello wor",
        "ts": 12500,
    }
    buf.add(key(), "ld")
    assert buf.flush() == 1 and sent.records[-1][2]["seq"] == 2  # numbered per call
    assert buf.flush() == 0  # nothing new: nothing sent


def test_a_call_that_ended_sends_what_it_gathered_at_once() -> None:
    sent = Sent()
    buf = DeltaBuffer(sent)
    buf.add(key(), "last words")
    buf.add(key("model-2"), "still streaming")
    buf.add(key(), "")  # the call ended: its finished event is on its way
    assert [(r[2]["callId"], r[2]["text"]) for r in sent.records] == [("model-1", "last words")]
    buf.add(key(), "")  # nothing gathered: nothing sent
    assert len(sent.records) == 1


def test_a_call_that_gathers_too_much_goes_out_before_the_interval_ends() -> None:
    sent = Sent()
    buf = DeltaBuffer(sent)
    buf.add(key(), "x" * (MAX_PENDING_CHARS - 1))
    assert sent.records == []
    buf.add(key(), "yy")
    assert len(sent.records) == 1 and len(sent.records[0][2]["text"]) == MAX_PENDING_CHARS + 1


def test_an_ended_run_flushes_its_deltas_and_a_new_holder_counts_from_one() -> None:
    sent = Sent()
    buf = DeltaBuffer(sent)
    buf.add(key(), "a")
    buf.flush()
    buf.add(key(), "b")
    buf.forget("r-1")
    assert [r[2]["seq"] for r in sent.records] == [1, 2]
    buf.add(key(), "c")
    buf.flush()
    assert sent.records[-1][2]["seq"] == 1


def test_a_delta_that_cannot_be_sent_is_dropped_not_raised() -> None:
    def broken(*_: Any) -> None:
        raise RuntimeError("producer gone")

    buf = DeltaBuffer(broken)
    buf.add(key(), "a")
    assert buf.flush() == 1 and buf.sent == 0


def test_which_models_stream() -> None:
    class Plain:
        name = "plain"

        async def complete(self, prompt: str, *, signal: AbortSignal) -> str:
            return prompt

    class Loose:
        name = "loose"

        async def complete(self, prompt: str, **kw: Any) -> str:
            return prompt

    assert streams_deltas(FakeModel()) and streams_deltas(Loose())
    assert not streams_deltas(Plain()) and not streams_deltas(object())


async def test_a_streaming_models_deltas_join_to_the_recorded_answer() -> None:
    async def agent(ctx: RunContext) -> str:
        async with ctx.model(step="answer") as m:
            return await m.complete("write it")

    model = FakeModel(latency_s=0.02, pieces=5)
    async with AgentHarness(agent, model=model) as h:
        done = await h.run("go")
    assert done.status == "completed" and done.result
    started = next(e for e in done.events if e.type == "model.request.started")
    call_id = started.payload.model_dump()["call_id"]
    pieces = [text for k, text in h.deltas if k.call_id == call_id]
    assert len(pieces) == 5 and "".join(pieces) == done.result
    assert {k.run_id for k, _ in h.deltas} == {done.run_id}
    assert {k.generation for k, _ in h.deltas} == {1}


async def test_a_model_that_does_not_stream_is_called_as_before() -> None:
    class Plain:
        name = "plain"

        async def complete(self, prompt: str, *, signal: AbortSignal) -> str:
            return f"re: {prompt}"

    async def agent(ctx: RunContext) -> str:
        async with ctx.model() as m:
            return await m.complete("x")

    async with AgentHarness(agent, model=Plain()) as h:
        done = await h.run("go")
    assert done.status == "completed" and done.result == "re: x" and h.deltas == []


async def test_a_replayed_step_publishes_no_deltas() -> None:
    """A takeover's new holder gets the recorded reply: nothing is called, nothing streams."""
    crashed: list[bool] = []

    async def agent(ctx: RunContext) -> str:
        async with ctx.model(step="answer") as m:
            reply = await m.complete("write it")
        if not crashed:
            crashed.append(True)
            async with ctx.tool("wait") as signal:
                await signal.wait()
        return reply

    async with AgentHarness(agent, model=FakeModel(latency_s=0.0, pieces=3)) as h:
        run_id = await h.run_of(await h.prompt("go"))
        await h.until(lambda: len(h.deltas) == 3, "the first holder's deltas")
        await h.until_event("tool.started")
        await h.crash_worker()
        done = await h.finished(run_id)
    assert done.status == "completed" and done.generations == 2
    assert len(h.deltas) == 3 and {k.generation for k, _ in h.deltas} == {1}


@pytest.mark.parametrize("fenced", [True, False])
async def test_a_fenced_holder_publishes_no_deltas(fenced: bool) -> None:
    from sessionstream.runtimes.worker._execution import Execution
    from tests.unit.runtimes.worker.test_execution import SPEC, Host

    async def agent(ctx: RunContext) -> None:
        return None

    host = Host(agent)
    ex = Execution(host, SPEC)  # type: ignore[arg-type]
    ex.generation = 4
    if fenced:
        ex.fenced = "stale_generation"
    ex.delta("model-1", "text")
    ex.delta("model-1", "")  # the call ended
    k = DeltaKey("s-1", "acme", "r-1", 4, "model-1", 0)
    assert host.deltas == ([] if fenced else [(k, "text"), (k, "")])
