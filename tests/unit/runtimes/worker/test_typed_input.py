"""Typed input on the worker, from the spec (docs/workers.md#typed-input): `ctx.input` is the
prompt's input as parsed JSON; a handler that declares the input's type as its second
parameter gets it validated — an instance of its model — or the run fails at once, before
any model call, tool or action, saying why; a handler whose declaration cannot work is
refused when the worker (or the harness) is built; a pydantic model returned is the run's
JSON result."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import re
import types
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from sessionstream.agent import ActionRun, RunContext, Worker
from sessionstream.errors import ConfigurationError
from sessionstream.runtimes.worker._handler import check_handler, result_text
from sessionstream.settings import Settings
from sessionstream.testing import AgentHarness

REPO = Path(__file__).resolve().parents[4]


class Order(BaseModel):
    sku: str
    qty: int = Field(gt=0)
    gift: bool = False


DEFAULT_ORDER = Order(sku="default", qty=1)


class Booked(BaseModel):
    sku: str
    total: float


@dataclasses.dataclass
class Line:
    sku: str
    qty: int


class Address(TypedDict):
    city: str
    zip: str


class Seen:
    """What the handlers were given."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, Any]] = []


async def _record(a: ActionRun) -> str:
    return "booked"


def typed_agent(seen: Seen) -> Any:
    async def run(ctx: RunContext, order: Order) -> Booked:
        seen.calls.append((ctx.input, order))
        async with ctx.model(step="price") as m:
            await m.complete(f"price {order.sku}")
        await ctx.action("booking", f"{ctx.run_id}:book", _record)
        return Booked(sku=order.sku, total=order.qty * 9.5)

    return run


async def test_a_valid_input_reaches_the_handler_as_its_model_and_the_result_is_json() -> None:
    seen = Seen()
    async with AgentHarness(typed_agent(seen)) as h:
        done = await h.run("book it", input={"sku": "A-1", "qty": 2})
    assert done.status == "completed", done.error
    [(raw, order)] = seen.calls
    assert raw == {"sku": "A-1", "qty": 2}  # ctx.input: the JSON value as sent
    assert isinstance(order, Order) and order == Order(sku="A-1", qty=2, gift=False)
    assert json.loads(done.result or "") == {"sku": "A-1", "total": 19.0}
    started = next(e for e in done.events if e.type == "run.started")
    assert json.loads(started.payload.model_dump()["input"]) == {"sku": "A-1", "qty": 2}


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ({"sku": "A-1", "qty": "two"}, "the input does not match Order: qty: Input should be"),
        ({"sku": "A-1", "qty": 0}, "the input does not match Order: qty: Input should be greater"),
        ({"qty": 1}, "the input does not match Order: sku: Field required"),
        (["A-1", 1], "the input does not match Order: Input should be"),
        ("A-1", "the input does not match Order: "),
        (None, "the prompt has no input, and the handler's parameter `order: Order` needs one"),
    ],
    ids=["wrong type", "out of range", "missing field", "an array", "a string", "no input"],
)
async def test_an_input_that_does_not_fit_fails_the_run_before_anything_runs(
    given: Any, why: str
) -> None:
    seen = Seen()
    async with AgentHarness(typed_agent(seen)) as h:
        done = await h.run("book it", input=given)
        assert done.status == "failed"
        assert done.error is not None and done.error.startswith(why), done.error
        assert seen.calls == [], "the handler was called"
        # no model call, no tool, no action: the run failed right after its grant
        types = done.types()
        assert types == ["run.started", "run.lease_granted", "run.finished"], types
        assert h.actions.runs == {}
        finished = done.events[-1].payload.model_dump()
        assert finished["retryable"] is False


async def test_a_harness_input_may_be_the_model_itself() -> None:
    seen = Seen()
    async with AgentHarness(typed_agent(seen)) as h:
        done = await h.run("book it", input=Order(sku="B-2", qty=1, gift=True))
    assert done.status == "completed", done.error
    assert seen.calls[0] == (
        {"sku": "B-2", "qty": 1, "gift": True},
        Order(sku="B-2", qty=1, gift=True),
    )


async def test_ctx_input_is_the_parsed_json_for_any_handler_and_none_without_input() -> None:
    got: list[Any] = []

    async def plain(ctx: RunContext) -> None:
        got.append(ctx.input)

    async with AgentHarness(plain) as h:
        for value in ([1, "two", {"3": None}], "text", 0, False):
            assert (await h.run("x", input=value)).status == "completed"
        assert (await h.run("no input")).status == "completed"
    assert got == [[1, "two", {"3": None}], "text", 0, False, None]


async def test_a_parameter_with_a_default_keeps_it_when_the_prompt_has_no_input() -> None:
    got: list[Any] = []

    async def run(ctx: RunContext, order: Order | None = DEFAULT_ORDER) -> str:
        got.append(order)
        return "ok"

    async def optional(ctx: RunContext, order: Order | None) -> str:
        got.append(order)
        return "ok"

    for handler in (run, optional):
        async with AgentHarness(handler) as h:
            assert (await h.run("x")).status == "completed"
            assert (await h.run("y", input={"sku": "C", "qty": 3})).status == "completed"
    assert got == [
        Order(sku="default", qty=1),
        Order(sku="C", qty=3),
        None,  # `Order | None` without a default: a missing input is None
        Order(sku="C", qty=3),
    ]


@pytest.mark.parametrize(
    ("annotation", "given", "expected"),
    [
        (list[int], [1, 2], [1, 2]),
        (Line, {"sku": "L", "qty": 4}, Line("L", 4)),
        (Address, {"city": "Lisbon", "zip": "1100"}, {"city": "Lisbon", "zip": "1100"}),
        (Literal["fast", "cheap"], "fast", "fast"),
        (dict[str, Order], {"a": {"sku": "A", "qty": 1}}, {"a": Order(sku="A", qty=1)}),
    ],
    ids=["list[int]", "dataclass", "TypedDict", "Literal", "dict of models"],
)
async def test_any_type_pydantic_validates_may_be_declared(
    annotation: Any, given: Any, expected: Any
) -> None:
    got: list[Any] = []

    async def run(ctx: RunContext, value: Any) -> Any:
        got.append(value)
        return value

    run.__annotations__["value"] = annotation
    async with AgentHarness(run) as h:
        done = await h.run("x", input=given)
    assert done.status == "completed", done.error
    assert got == [expected]
    assert done.result == result_text(expected)  # what it returned, as the run's result


async def test_the_input_is_validated_again_for_a_new_holder_and_each_round() -> None:
    """Late: after a takeover the next holder reads the input from the open-runs record;
    a follow-up's round is given it again."""
    seen = Seen()
    gate = asyncio.Event()

    async def run(ctx: RunContext, order: Order) -> str:
        seen.calls.append((ctx.round, order))
        async with ctx.model(step=f"plan-{ctx.round}") as m:
            await m.complete(order.sku)
        if ctx.round == 0 and len(seen.calls) == 1:
            await gate.wait()  # the first holder dies here
        return f"round {ctx.round}"

    async with AgentHarness(run) as h:
        run_id = await h.run_of(await h.prompt("book", input={"sku": "T-1", "qty": 1}))
        await h.until_event("step.recorded")
        await h.crash_worker()
        await h.until(lambda: len(seen.calls) == 2, "the new holder's call")
        done = await h.finished(run_id)
    assert done.status == "completed" and done.generations == 2
    assert seen.calls == [(0, Order(sku="T-1", qty=1))] * 2


async def test_a_follow_up_round_gets_the_input_again() -> None:
    seen: list[tuple[int, Order]] = []

    first_round = asyncio.Event()

    async def run(ctx: RunContext, order: Order) -> str:
        seen.append((ctx.round, order))
        if ctx.round == 0:
            await first_round.wait()
        return f"round {ctx.round}"

    async with AgentHarness(run) as h:
        run_id = await h.run_of(await h.prompt("book", input={"sku": "F-1", "qty": 2}))
        await h.until(lambda: len(seen) == 1, "the first round")
        await h.follow_up("also gift-wrap it")
        await h.until_event("run.follow_up_queued")
        first_round.set()
        done = await h.finished(run_id)
    assert done.status == "completed"
    assert seen == [(0, Order(sku="F-1", qty=2)), (1, Order(sku="F-1", qty=2))]


# -- refused when the worker is built ------------------------------------------------------------


class NotValidatable:
    def __init__(self, x: int) -> None:
        self.x = x


async def untyped(ctx: RunContext, order) -> None:  # type: ignore[no-untyped-def]
    return None


async def opaque(ctx: RunContext, order: NotValidatable) -> None:
    return None


async def unresolved(ctx: RunContext, order: NotDefinedAnywhere) -> None:  # type: ignore[name-defined]  # noqa: F821
    return None


class Incomplete(BaseModel):
    lines: list[NotDefinedYet]  # type: ignore[name-defined]  # noqa: F821


async def incomplete(ctx: RunContext, order: Incomplete) -> None:
    return None


async def three(ctx: RunContext, order: Order, extra: int) -> None:
    return None


async def keyword_only(ctx: RunContext, *, order: Order) -> None:
    return None


async def nothing() -> None:
    return None


@pytest.mark.parametrize(
    ("handler", "why"),
    [
        (
            untyped,
            r"second parameter `order` has no type.*async def run\(ctx: RunContext, order: Order\)",
        ),
        (opaque, r"`order: NotValidatable` is not one pydantic can validate.*pydantic model"),
        (unresolved, r"`order: NotDefinedAnywhere` cannot be resolved \(NameError"),
        (incomplete, r"`order: Incomplete` is not one pydantic can validate.*NotDefinedYet"),
        (three, r"requires the parameters ctx, order, extra.*order: Order"),
        (keyword_only, r"requires the parameters ctx, order"),
        (nothing, r"takes no parameter for the context"),
    ],
    ids=[
        "unannotated",
        "not validatable",
        "unresolvable",
        "not fully defined",
        "three required",
        "keyword-only",
        "none",
    ],
)
def test_a_handler_whose_input_cannot_work_is_refused_when_the_worker_is_built(
    handler: Any, why: str
) -> None:
    name = handler.__qualname__
    for build in (
        lambda: Worker(Settings(), handler, "w-1", database_url=""),
        lambda: AgentHarness(handler),
        lambda: check_handler(handler, f"mod:{name}"),
    ):
        with pytest.raises(ConfigurationError, match=why) as refused:
            build()
        assert name in str(refused.value), refused.value


def test_handlers_that_take_the_input_in_other_ways_are_taken() -> None:
    async def with_default(ctx: RunContext, order: Order, retries: int = 3) -> None:
        return None

    async def star(ctx: RunContext, *args: Any, **kw: Any) -> None:
        return None

    class Agent:
        async def __call__(self, ctx: RunContext, order: Order) -> None:
            return None

    async def base(ctx: RunContext, order: Order, tag: str) -> None:
        return None

    for handler in (with_default, star, Agent(), functools.partial(base, tag="x")):
        assert check_handler(handler) is handler


# -- the result ----------------------------------------------------------------------------------


def test_a_model_or_dataclass_result_is_sent_as_its_json_at_any_depth() -> None:
    assert result_text(Booked(sku="A", total=1.5)) == '{"sku":"A","total":1.5}'
    assert result_text(Line("L", 2)) == '{"sku":"L","qty":2}'
    assert result_text({"items": [Line("L", 2)], "n": 1}) == '{"items":[{"sku":"L","qty":2}],"n":1}'


# -- docs/workers.md's example is a whole program that runs ----------------------------------------


async def test_the_typed_input_example_in_docs_workers_md_passes() -> None:
    text = (REPO / "docs" / "workers.md").read_text()
    section = text[text.index("## Typed input") :]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found is not None
    module = types.ModuleType("workers_md_typed_input")
    exec(compile(found.group(1), "docs/workers.md", "exec"), module.__dict__)
    await module.test_a_quote()
    await module.test_an_order_that_does_not_fit_fails_before_the_model_is_asked()
