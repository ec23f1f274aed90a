"""Durable steps on the worker (docs/workers.md#durable-steps), driven event by event with
the fakes of `test_execution`: the first holder records each finished step after it; a new
holder gets them with its grant and calls neither model nor tool again; a follow-up round
gets its earlier rounds' steps back; the new holder starts from the latest checkpoint."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from sessionstream.runtimes.worker._execution import Execution
from sessionstream.runtimes.worker._signal import AbortSignal
from sessionstream.runtimes.worker.context import RunContext
from sessionstream.runtimes.worker.model import Model
from sessionstream.schemas.commands import Command
from tests.unit.runtimes.worker.test_execution import SPEC, Host, event, until


class CountingModel(Model):
    name = "counting"

    def __init__(self) -> None:
        self.prompts: list[str] = []

    async def complete(self, prompt: str, *, signal: AbortSignal) -> str:
        self.prompts.append(prompt)
        return f"reply to {prompt}"


def agent(model: CountingModel, tool_calls: list[str]) -> Any:
    async def search(signal: AbortSignal, idempotency_id: str) -> list[str]:
        tool_calls.append(idempotency_id)
        return ["TAP 1234", "Renfe 77"]

    async def run(ctx: RunContext) -> dict[str, Any]:
        async with ctx.model(model) as m:
            plan = await m.complete(ctx.prompt)
        hits = await ctx.call_tool("search", search, input={"q": plan})
        extra = [f.text for f in ctx.follow_ups()]
        if extra:
            async with ctx.model(model) as m:
                plan = await m.complete(" ".join([ctx.prompt, *extra]))
        return {"plan": plan, "hits": hits, "context": ctx.context_ref}

    return run


def _payloads(host: Host, type_: str) -> list[dict[str, Any]]:
    return [c.payload.model_dump(by_alias=True) for c in host.sent if c.type == type_]


def _grant(host: Host, **payload: Any) -> tuple[Command, Any]:
    acquire = next(c for c in host.sent if c.type == "lease.acquire")
    p = {"worker_id": "w1", "lease_expires_at": 10, "lease_ms": 30_000, **payload}
    return acquire, event("run.lease_granted", p, command_id=acquire.command_id)


async def _start(host: Host) -> tuple[Execution, asyncio.Task[None]]:
    ex = Execution(host, SPEC)
    task = asyncio.create_task(ex.main())
    await until(lambda: "lease.acquire" in host.types())
    return ex, task


async def _finish(ex: Execution, task: asyncio.Task[None]) -> None:
    ex.on_event(event("run.finished", {"terminal_status": "completed"}))
    await asyncio.wait_for(task, 5)


async def test_the_first_holder_records_each_finished_step_after_it() -> None:
    model, tools = CountingModel(), []
    host = Host(agent(model, tools))
    ex, task = await _start(host)
    ex.on_event(_grant(host)[1])
    await until(lambda: "run.complete" in host.types())
    records = _payloads(host, "step.record")
    assert [(r["stepId"], r["kind"], r["name"]) for r in records] == [
        ("model-1", "model", "counting"),
        ("tool:search-1", "tool", "search"),
    ]
    assert json.loads(records[0]["result"]) == "reply to do it"
    assert json.loads(records[0]["input"]) == "do it"
    assert json.loads(records[1]["result"]) == ["TAP 1234", "Renfe 77"]
    assert json.loads(records[1]["input"]) == {"q": "reply to do it"}
    assert records[1]["inputDigest"].startswith("sha256:")
    # each step is recorded after it finished: its finish comes first
    kinds = [
        c.payload.model_dump()["kind"] if c.type == "run.progress" else c.type
        for c in host.sent
        if c.type in ("run.progress", "step.record")
    ]
    assert kinds == [
        "model.request.started",
        "model.request.finished",
        "step.record",
        "tool.started",
        "tool.finished",
        "step.record",
    ]
    assert tools == ["r-1/tool:search-1"]
    await _finish(ex, task)


async def test_a_new_holder_gets_the_recorded_steps_and_calls_nothing_again() -> None:
    model, tools = CountingModel(), []
    host = Host(agent(model, tools))
    ex, task = await _start(host)
    acquire, grant = _grant(host, checkpoint_ref="s3://ck/2", steps_delivered=2)
    ex.on_event(grant)
    await asyncio.sleep(0.05)
    assert "run.complete" not in host.types(), "the handler started before its steps came"
    for step_id, kind, name, result in [
        ("model-1", "model", "gpt", json.dumps("plan from generation 1")),
        ("tool:search-1", "tool", "search", json.dumps(["recorded hit"])),
    ]:
        ex.on_event(
            event(
                "step.delivered",
                {"step_id": step_id, "kind": kind, "name": name, "result": result, "generation": 1},
                command_id=acquire.command_id,
                generation=2,
            )
        )
    await until(lambda: "run.complete" in host.types())
    assert model.prompts == [] and tools == [], "a recorded step was called again"
    assert "step.record" not in host.types()
    assert "run.progress" not in host.types(), "a recorded step reported a call"
    result = json.loads(host.sent[-1].payload.model_dump()["result"])
    assert result == {
        "plan": "plan from generation 1",
        "hits": ["recorded hit"],
        "context": "s3://ck/2",
    }
    await _finish(ex, task)


async def test_a_step_that_started_and_never_finished_runs_again_with_its_id() -> None:
    """Generation 1 recorded the model step and died in the tool: only the tool runs, with
    the same idempotency id generation 1's attempt had."""
    model, tools = CountingModel(), []
    host = Host(agent(model, tools))
    ex, task = await _start(host)
    acquire, grant = _grant(host, steps_delivered=1)
    ex.on_event(grant)
    payload = {
        "step_id": "model-1",
        "kind": "model",
        "result": json.dumps("reply to do it"),
        "generation": 1,
    }
    ex.on_event(event("step.delivered", payload, command_id=acquire.command_id, generation=2))
    await until(lambda: "run.complete" in host.types())
    assert model.prompts == []
    assert tools == ["r-1/tool:search-1"]
    assert [r["stepId"] for r in _payloads(host, "step.record")] == ["tool:search-1"]
    await _finish(ex, task)


async def test_a_follow_up_round_gets_its_earlier_rounds_steps_back() -> None:
    model, tools = CountingModel(), []
    host = Host(agent(model, tools))
    ex, task = await _start(host)
    ex.on_event(_grant(host)[1])
    await until(lambda: "run.complete" in host.types())
    complete = next(c for c in host.sent if c.type == "run.complete")
    ex.on_event(
        event(
            "run.follow_up_delivered",
            {"text": "also trains", "source_command_id": "f-1"},
            command_id=complete.command_id,
        )
    )
    await until(lambda: [c.type for c in host.sent].count("run.complete") == 2)
    # round 1 made round 0's calls again and got them back; only the new prompt was called
    assert model.prompts == ["do it", "do it also trains"]
    assert tools == ["r-1/tool:search-1"]
    records = [(r["stepId"], json.loads(r["input"])) for r in _payloads(host, "step.record")]
    assert records == [
        ("model-1", "do it"),
        ("tool:search-1", {"q": "reply to do it"}),
        ("model-2", "do it also trains"),
    ]
    await _finish(ex, task)


async def test_a_call_with_another_input_under_a_recorded_id_is_a_step_of_its_own() -> None:
    model, tools = CountingModel(), []
    host = Host(agent(model, tools))
    ex, task = await _start(host)
    acquire, grant = _grant(host, steps_delivered=1)
    ex.on_event(grant)
    other = {
        "step_id": "model-1",
        "kind": "model",
        "input_digest": "sha256:" + "0" * 64,
        "result": json.dumps("an answer to another prompt"),
        "generation": 1,
    }
    ex.on_event(event("step.delivered", other, command_id=acquire.command_id, generation=2))
    await until(lambda: "run.complete" in host.types())
    assert model.prompts == ["do it"]
    ids = [r["stepId"] for r in _payloads(host, "step.record")]
    assert ids[0].startswith("model-1~") and len(ids[0]) == len("model-1~") + 12
    await _finish(ex, task)


async def test_a_result_over_the_inline_bound_goes_to_the_store_and_comes_back() -> None:
    stored: dict[str, str] = {}

    class Store:
        async def put(self, key: str, data: str) -> str:
            stored[f"mem://{key}"] = data
            return f"mem://{key}"

        async def get(self, ref: str) -> str:
            return stored[ref]

    big = ["x" * 100] * 100

    async def tool(signal: AbortSignal, key: str) -> list[str]:
        return big

    async def run(ctx: RunContext) -> int:
        return len(await ctx.call_tool("dump", tool, step="dump"))

    host = Host(run)
    host.step_store = Store()  # type: ignore[assignment]
    ex, task = await _start(host)
    ex.on_event(_grant(host)[1])
    await until(lambda: "run.complete" in host.types())
    (rec,) = _payloads(host, "step.record")
    assert rec["result"] is None and rec["resultRef"] == "mem://r-1/dump"
    assert json.loads(stored["mem://r-1/dump"]) == big
    await _finish(ex, task)
    # a new holder reads it back from the store
    calls: list[str] = []

    async def counted(signal: AbortSignal, key: str) -> list[str]:
        calls.append(key)
        return big

    async def run2(ctx: RunContext) -> int:
        return len(await ctx.call_tool("dump", counted, step="dump"))

    host2 = Host(run2)
    host2.step_store = Store()  # type: ignore[assignment]
    ex2, task2 = await _start(host2)
    acquire, grant = _grant(host2, steps_delivered=1)
    ex2.on_event(grant)
    delivered = {
        "step_id": "dump",
        "kind": "tool",
        "input_digest": rec["inputDigest"],
        "result_ref": "mem://r-1/dump",
        "generation": 1,
    }
    ex2.on_event(event("step.delivered", delivered, command_id=acquire.command_id, generation=2))
    await until(lambda: "run.complete" in host2.types())
    assert calls == [] and host2.sent[-1].payload.model_dump()["result"] == "100"
    await _finish(ex2, task2)
