"""`sessionstream.testing.AgentHarness`: a handler run as a worker runs it, against the real
decider, in memory. Expected outcomes come from the protocol (docs/protocol.md: a takeover
grants generation + 1 and hands over the recorded steps; a finished step is not called
again; an idempotency key acts once; an abort ends the run `cancelled`; a follow-up is
handled in a round of its own) and from docs/workers.md's "Testing an agent"."""

from __future__ import annotations

import asyncio
import re
import types
from pathlib import Path

import pytest

from sessionstream.agent import AbortSignal, ActionRun, RunContext
from sessionstream.core.decider import fold
from sessionstream.errors import ConfigurationError
from sessionstream.testing import AgentHarness, HarnessError

REPO = Path(__file__).resolve().parents[2]


class CountingModel:
    """A model that answers at once and counts the prompts it was asked."""

    name = "counting"

    def __init__(self) -> None:
        self.prompts: list[str] = []

    async def complete(self, prompt: str, *, signal: AbortSignal) -> str:
        self.prompts.append(prompt)
        return f"re: {prompt}"


def _example() -> types.ModuleType:
    text = (REPO / "docs" / "workers.md").read_text()
    section = text[text.index("## Testing an agent") :]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found is not None
    module = types.ModuleType("workers_md_testing_example")
    exec(compile(found.group(1), "docs/workers.md", "exec"), module.__dict__)
    return module


async def test_the_docs_example_tests_pass() -> None:
    example = _example()
    await example.test_the_invoice_agent()
    await example.test_a_takeover_resumes_from_the_recorded_draft()


@pytest.mark.parametrize("crash_after", [0, 1, 2, 3])
async def test_a_takeover_after_any_step_calls_each_finished_step_once(crash_after: int) -> None:
    """kill -9 of the holder after 0, 1, 2 or all 3 of its steps were recorded: the new
    holder (generation 2) gets the recorded ones back and calls only the others."""
    model = CountingModel()
    tools: list[str] = []
    # the holder waits at each gate: the crash lands exactly between two steps
    gates = [asyncio.Event() for _ in range(4)]

    async def search(signal: AbortSignal, idempotency_id: str) -> str:
        tools.append(idempotency_id)
        return "hits"

    async def agent(ctx: RunContext) -> str:
        await gates[0].wait()
        async with ctx.model(step="plan") as m:
            plan = await m.complete(ctx.prompt)
        await gates[1].wait()
        found = await ctx.call_tool("search", search, input={"q": plan}, step="search")
        await gates[2].wait()
        async with ctx.model(step="answer") as m:
            answer = await m.complete(f"{plan} {found}")
        await gates[3].wait()
        return answer

    async with AgentHarness(agent, model=model) as h:
        run_id = await h.run_of(await h.prompt("q"))
        for gate in gates[:crash_after]:
            gate.set()
        if crash_after:
            await h.until_event("step.recorded", crash_after)
        await h.crash_worker()
        for gate in gates:
            gate.set()
        done = await h.finished(run_id)
    assert done.status == "completed"
    assert done.generations == 2
    assert model.prompts == ["q", "re: q hits"]  # each model step called once in all
    assert len(tools) == 1
    recorded = [(e.generation, e.payload.step_id) for e in done.events if e.type == "step.recorded"]
    steps = ["plan", "search", "answer"]
    assert recorded == [(1, s) for s in steps[:crash_after]] + [(2, s) for s in steps[crash_after:]]
    delivered = [e.payload.step_id for e in done.events if e.type == "step.delivered"]
    assert delivered == steps[:crash_after]
    assert done.result == "re: re: q hits"


async def test_an_action_acts_once_across_a_takeover() -> None:
    async def record(a: ActionRun) -> str:
        return f"done {a.generation}"

    async def agent(ctx: RunContext) -> str | None:
        result = await ctx.action("record", f"{ctx.run_id}:once", record)
        await asyncio.sleep(0.05)
        return result

    async with AgentHarness(agent) as h:
        run_id = await h.run_of(await h.prompt("act"))
        await h.until(lambda: len(h.actions.runs) == 1, "the action ran")
        await h.crash_worker()
        done = await h.finished(run_id)
    assert done.status == "completed" and done.generations == 2
    assert list(h.actions.runs.values()) == [1]
    assert done.result == "done 1"  # the recorded outcome, not a second effect


async def test_an_abort_while_the_handler_runs_ends_the_run_cancelled() -> None:
    started = asyncio.Event()

    async def agent(ctx: RunContext) -> str:
        async with ctx.tool("wait") as signal:
            started.set()
            await signal.wait()
        return "never"

    async with AgentHarness(agent) as h:
        run_id = await h.run_of(await h.prompt("wait"))
        await asyncio.wait_for(started.wait(), 5)
        await h.abort()
        done = await h.finished(run_id)
    assert done.status == "cancelled"
    assert "tool.finished" in done.types() or "cancel.acknowledged" in done.types()


async def test_steers_reach_the_handler_and_follow_ups_get_a_round_each() -> None:
    seen: list[tuple[int, list[str]]] = []
    go = asyncio.Event()

    async def agent(ctx: RunContext) -> str:
        await go.wait()
        seen.append((ctx.round, ctx.steering()))
        return f"round {ctx.round}"

    async with AgentHarness(agent) as h:
        run_id = await h.run_of(await h.prompt("start"))
        await h.steer("left")
        await h.follow_up("and then?")
        await h.until_event("run.follow_up_queued")
        go.set()
        done = await h.finished(run_id)
    assert done.status == "completed"
    assert seen[0] == (0, ["left"])
    assert [r for r, _ in seen] == [0, 1]
    assert done.result == "round 1"
    # the earlier round's answer is kept on the log too
    rounds = [e.payload.result for e in done.events if e.type == "run.round_completed"]
    assert rounds == ["round 0"]


async def test_the_log_is_the_decider_s_and_folds_to_the_harness_state() -> None:
    async def agent(ctx: RunContext) -> str:
        return f"{ctx.tenant_id}/{ctx.actor}"

    async with AgentHarness(agent, tenant_id="acme", session_id="acme:s-9", actor="user:ann") as h:
        first = await h.run("one")
        busy = await h.prompt("two")
        second = await h.finished(await h.run_of(busy))
        # the run's tenant and who asked for it reach the handler
        assert first.result == "acme/user:ann" and second.result == "acme/user:ann"
        assert fold(h.log, h.session_id) == h.state


async def test_a_second_prompt_while_a_run_is_active_is_rejected_by_policy() -> None:
    go = asyncio.Event()

    async def agent(ctx: RunContext) -> str:
        await go.wait()
        return "ok"

    async with AgentHarness(agent) as h:
        await h.run_of(await h.prompt("first"))
        second = await h.prompt("second", policy="reject")
        await h.until(lambda: bool(h.events_of(second)), "the second prompt decided")
        assert [e.type for e in h.events_of(second)] == ["command.rejected"]
        with pytest.raises(HarnessError, match="rejected"):
            await h.run_of(second)
        go.set()


def test_a_handler_that_is_not_async_is_refused_when_the_harness_is_built() -> None:
    def agent(ctx: RunContext) -> str:
        return "sync"

    with pytest.raises(ConfigurationError, match="async def"):
        AgentHarness(agent)


async def test_a_wait_that_is_not_met_says_what_did_not_come() -> None:
    async def agent(ctx: RunContext) -> str:
        return "x"

    async with AgentHarness(agent, timeout_s=0.2) as h:
        with pytest.raises(HarnessError, match=r"3 x run\.finished"):
            await h.until_event("run.finished", 3)


async def test_a_model_request_records_what_the_model_reported() -> None:
    """`model.request.finished` carries the model, tokens in and out, time to the first
    token, duration, finish reason and cost of the block's requests (docs/protocol.md)."""
    from sessionstream.agent import Completion

    class Reporting:
        name = "reporting"

        async def complete(self, prompt: str, *, signal: AbortSignal) -> str:
            return Completion(
                f"re: {prompt}",
                model="m-2024",
                input_tokens=7,
                output_tokens=3,
                first_token_ms=12,
                finish_reason="stop",
                cost_usd=0.5,
            )

    async def agent(ctx: RunContext) -> str:
        async with ctx.model(step="a") as m:
            first = await m.complete("one")
            second = await m.complete("two")  # one block, two requests: summed
        return first + second

    async with AgentHarness(agent, model=Reporting()) as h:
        done = await h.run("go")
    finished = [e.payload for e in done.events if e.type == "model.request.finished"]
    assert len(finished) == 1
    p = finished[0]
    assert (p.model, p.input_tokens, p.output_tokens, p.cost_usd) == ("m-2024", 14, 6, 1.0)
    assert (p.first_token_ms, p.finish_reason) == (12, "stop")
    assert p.duration_ms is not None and p.duration_ms >= 0


def test_usage_is_refused_on_anything_but_a_finished_model_request() -> None:
    import pydantic

    from sessionstream.schemas.commands import RunProgressPayload

    RunProgressPayload(kind="model.request.finished", input_tokens=1)
    with pytest.raises(pydantic.ValidationError, match=r"model\.request\.finished, not tool"):
        RunProgressPayload(kind="tool.finished", input_tokens=1)
    with pytest.raises(pydantic.ValidationError):
        RunProgressPayload(kind="model.request.finished", output_tokens=-1)
