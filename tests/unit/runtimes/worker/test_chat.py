"""Chat-shaped model calls in the SDK (docs/workers.md#chat). Expected outcomes from the
agent SDK's contract (issue text and docs): a chat call is a durable step whose input is the
conversation, the tools and the schema, and whose result is what the model said with its
tool calls; each tool call the model asks for is a durable step of its own; a takeover or a
later round gets both back instead of asking again; structured output is checked against
the schema before the handler sees it; a model that only completes still takes a plain
conversation, but never tools or a schema."""

from __future__ import annotations

import asyncio
import json
import re
import types
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from sessionstream.agent import (
    AbortSignal,
    Completion,
    FakeModel,
    Message,
    ModelOutputInvalid,
    RunContext,
    ToolCall,
    ToolSpec,
    tool,
)
from sessionstream.errors import ConfigurationError
from sessionstream.runtimes.worker.chat import output_spec
from sessionstream.runtimes.worker.model import example_of, fake_chat_reply
from sessionstream.testing import AgentHarness


class Invoice(BaseModel):
    number: str
    total: float
    paid: bool = False


SEARCHES: list[tuple[str, int, str]] = []


@tool
async def search(q: str, limit: int = 3, *, idempotency_id: str) -> list[str]:
    """Search the invoices."""
    SEARCHES.append((q, limit, idempotency_id))
    return [f"hit {i} for {q}" for i in range(limit)]


# -- the pieces ----------
def test_a_message_round_trips_through_the_api_shape() -> None:
    call = ToolCall("call_1", "search", '{"q":"x"}')
    for m in (
        Message.system("be brief"),
        Message.user("hi"),
        Message.assistant(None, [call]),
        Message.tool(call, "[]"),
    ):
        assert Message.from_json(m.to_json()) == m
    wire = Message.assistant(None, [call]).to_json()
    assert wire["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "search", "arguments": '{"q":"x"}'},
        }
    ]
    assert Message.tool("call_1", "ok").to_json()["tool_call_id"] == "call_1"
    with pytest.raises(ValueError, match="role"):
        Message.from_json({"role": "developer", "content": "x"})


def test_a_tool_is_described_by_its_signature_and_docstring() -> None:
    spec = search.spec
    assert spec.name == "search" and spec.description == "Search the invoices."
    params = spec.parameters
    assert set(params["properties"]) == {"q", "limit"}  # what the runtime gives is not asked
    assert params["required"] == ["q"]
    assert params["properties"]["limit"]["default"] == 3
    assert search.validate({"q": "a", "limit": "2"}) == {"q": "a", "limit": 2}
    with pytest.raises(ValueError):
        search.validate({"limit": 2})


def test_tools_that_cannot_be_described_are_refused_when_defined() -> None:
    def plain(q: str) -> str:
        return q

    with pytest.raises(ConfigurationError, match="async def"):
        tool(plain)  # type: ignore[arg-type]

    async def star(*args: str) -> str:
        return ""

    with pytest.raises(ConfigurationError, match=r"\*args"):
        tool(star)
    with pytest.raises(ConfigurationError, match="tool name"):
        ToolSpec("not a name!")


def test_structured_output_is_checked_against_the_schema() -> None:
    out = output_spec(Invoice)
    assert out.name == "Invoice" and out.schema["required"] == ["number", "total"]
    assert out.read('{"number": "7", "total": 3}') == Invoice(number="7", total=3.0)
    with pytest.raises(ModelOutputInvalid, match="not JSON"):
        out.read("The invoice is 7.")
    with pytest.raises(ModelOutputInvalid, match="total"):
        out.read('{"number": "7"}')
    raw = output_spec({"title": "pair", "type": "array", "items": {"type": "integer"}})
    assert raw.name == "pair" and raw.read("[1, 2]") == [1, 2]
    assert output_spec(list[int]).read("[1]") == [1]


def test_an_example_value_follows_refs_enums_and_required() -> None:
    class Line(BaseModel):
        sku: str
        kind: str = "item"

    class Order(BaseModel):
        lines: list[Line]
        note: str | None = None

    value = example_of(Order.model_json_schema(), "x")
    assert Order.model_validate(value) == Order(lines=[Line(sku="x")])
    assert example_of({"enum": ["a", "b"]}) == "a"


def test_the_fake_calls_a_named_tool_once_then_answers_with_its_result() -> None:
    tools = [search.spec.to_json()]
    first = [{"role": "user", "content": "find call=search"}]
    text, calls = fake_chat_reply(first, tools)
    assert text == "" and [c.name for c in calls] == ["search"]
    assert calls[0].args() == {"q": "find call=search"}
    answered = [
        *first,
        Message.assistant(None, calls).to_json(),
        Message.tool(calls[0], "[]").to_json(),
    ]
    text, calls = fake_chat_reply(answered, tools)
    assert calls == [] and text.startswith("answer[")
    assert fake_chat_reply(first, ())[1] == []  # no such tool offered: no call


# -- through the worker's execution, against the real decider ----------
def _chat_agent(counter: dict[str, int], gate: asyncio.Event | None = None) -> Any:
    async def agent(ctx: RunContext) -> str:
        messages: list[Message] = [Message.system("answer from invoices"), Message.user(ctx.prompt)]
        for _ in range(4):
            async with ctx.model() as m:
                reply = await m.chat(messages, tools=[search])
            counter["model"] = counter.get("model", 0) + 1
            messages.append(reply.message())
            if not reply.tool_calls:
                return str(reply)
            messages += await ctx.call_tools(reply, [search])
            if gate is not None:
                await gate.wait()
        return "gave up"

    return agent


async def test_a_tool_loop_records_the_conversation_and_each_tool_call() -> None:
    SEARCHES.clear()
    model = FakeModel(latency_s=0)
    async with AgentHarness(_chat_agent({}), model=model) as h:
        done = await h.finished(await h.run_of(await h.prompt("overdue call=search")))
    assert done.status == "completed", done
    assert model.calls == 2
    assert [(q, n) for q, n, _ in SEARCHES] == [("overdue call=search", 3)]
    assert SEARCHES[0][2] == f"{done.run_id}/tool:search-1"
    # the second request saw the tool's result, answering the model's call by its id
    second = model.conversations[1]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool"]
    assert second[3]["tool_call_id"] == second[2]["tool_calls"][0]["id"]
    assert json.loads(second[3]["content"])[0] == "hit 0 for overdue call=search"
    # a replay shows what the model was asked and said, and what the tool got and returned
    steps = {e.payload.step_id: e.payload for e in done.events if e.type == "step.recorded"}
    assert list(steps) == ["model-1", "tool:search-1", "model-2"]
    assert json.loads(steps["model-1"].input)["messages"][1]["content"] == "overdue call=search"
    assert json.loads(steps["model-1"].input)["tools"][0]["function"]["name"] == "search"
    said = json.loads(steps["model-1"].result)
    assert said["toolCalls"][0]["function"]["name"] == "search" and said["text"] == ""
    assert json.loads(steps["tool:search-1"].input) == {"q": "overdue call=search"}
    assert json.loads(steps["tool:search-1"].result)[2] == "hit 2 for overdue call=search"
    assert json.loads(steps["model-2"].result)["text"] == done.result


async def test_a_takeover_mid_loop_asks_neither_the_model_nor_the_tool_again() -> None:
    """The holder dies after the model asked for the tool and the tool's result was
    recorded: the new holder gets both back and asks the model only for the answer."""
    SEARCHES.clear()
    model = FakeModel(latency_s=0)
    gate = asyncio.Event()
    async with AgentHarness(_chat_agent({}, gate), model=model) as h:
        run_id = await h.run_of(await h.prompt("late call=search"))
        await h.until_event("step.recorded", 2)
        await h.crash_worker()
        gate.set()
        done = await h.finished(run_id)
    assert done.status == "completed" and done.generations == 2
    assert model.calls == 2  # model-1 by generation 1, model-2 by generation 2
    assert len(SEARCHES) == 1
    recorded = [(e.generation, e.payload.step_id) for e in done.events if e.type == "step.recorded"]
    assert recorded == [(1, "model-1"), (1, "tool:search-1"), (2, "model-2")]


async def test_an_unknown_tool_or_bad_arguments_are_told_to_the_model() -> None:
    SEARCHES.clear()
    calls = [ToolCall("c1", "delete_all", "{}"), ToolCall("c2", "search", '{"limit": 1}')]
    model = FakeModel(latency_s=0, replies=[Completion("", tool_calls=calls), "sorry"])
    async with AgentHarness(_chat_agent({}), model=model) as h:
        done = await h.finished(await h.run_of(await h.prompt("go call=search")))
    assert done.result == "sorry" and SEARCHES == []
    told = [m["content"] for m in model.conversations[1] if m["role"] == "tool"]
    assert "no tool 'delete_all'" in told[0] and "search" in told[0]
    assert "invalid arguments for search: q: Field required" in told[1]


async def test_structured_output_reaches_the_handler_typed_and_comes_back_typed() -> None:
    seen: list[Any] = []
    go = asyncio.Event()

    async def agent(ctx: RunContext) -> dict[str, Any]:
        async with ctx.model() as m:
            reply = await m.chat([Message.user(ctx.prompt)], output=Invoice)
        seen.append(reply.parsed)
        await go.wait()
        assert isinstance(reply.parsed, Invoice)
        return reply.parsed.model_dump()

    model = FakeModel(latency_s=0, replies=['{"number": "INV-7", "total": 12.5}'])
    async with AgentHarness(agent, model=model) as h:
        run_id = await h.run_of(await h.prompt("read INV-7"))
        await h.until_event("step.recorded", 1)
        await h.crash_worker()
        go.set()
        done = await h.finished(run_id)
    assert model.calls == 1  # the recorded reply, parsed again by the new holder
    assert seen == [Invoice(number="INV-7", total=12.5)] * 2
    assert json.loads(done.result or "") == {"number": "INV-7", "total": 12.5, "paid": False}


async def test_a_reply_that_does_not_match_fails_the_run_and_is_not_recorded() -> None:
    async def agent(ctx: RunContext) -> str:
        async with ctx.model() as m:
            reply = await m.chat([Message.user(ctx.prompt)], output=Invoice)
        return str(reply)

    model = FakeModel(latency_s=0, replies=['{"number": "INV-7"}'])
    async with AgentHarness(agent, model=model) as h:
        done = await h.finished(await h.run_of(await h.prompt("read")))
    assert done.status == "failed"
    assert "does not match Invoice: total" in str(done.error)
    assert "step.recorded" not in done.types()


class CompleteOnly:
    name = "complete-only"

    def __init__(self) -> None:
        self.prompts: list[str] = []

    async def complete(self, prompt: str, *, signal: AbortSignal) -> str:
        self.prompts.append(prompt)
        return "ok"


async def test_a_model_that_only_completes_takes_a_plain_conversation_only() -> None:
    model = CompleteOnly()

    async def agent(ctx: RunContext) -> str:
        async with ctx.model() as m:
            one = await m.chat([Message.user(ctx.prompt)])
            two = await m.chat([Message.system("s"), Message.user("u")])
        try:
            async with ctx.model() as m:
                await m.chat([Message.user("x")], tools=[search])
        except ConfigurationError as e:
            return f"{one} {two} refused: {e}"
        return "not refused"

    async with AgentHarness(agent, model=model) as h:
        done = await h.finished(await h.run_of(await h.prompt("hello")))
    assert model.prompts == ["hello", "system: s\n\nuser: u"]
    assert done.result is not None and done.result.startswith("ok ok refused: ")
    assert "has no chat()" in done.result


async def test_the_chat_example_in_docs_workers_md_runs() -> None:
    text = (Path(__file__).resolve().parents[4] / "docs" / "workers.md").read_text()
    section = text[text.index("## Chat\n") :]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found is not None
    module = types.ModuleType("workers_md_chat_example")
    exec(compile(found.group(1), "docs/workers.md", "exec"), module.__dict__)
    await module.test_the_agent_calls_the_tool_once_and_summarises()
