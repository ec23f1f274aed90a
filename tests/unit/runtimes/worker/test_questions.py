"""The worker's side of questions to a person (docs/protocol.md#questions-to-a-person), in
the in-memory harness (the real decider): `await ctx.ask_user(...)` waits — its lease
renewing — for a person's answer and returns it (validated against a declared type); a
cancel releases it at once; an expired question raises QuestionClosed; a takeover asks the
same question again and gets the recorded answer, never asking twice."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from sessionstream.agent import QuestionClosed, RunCancelled, RunContext
from sessionstream.core.decider import DeciderConfig
from sessionstream.testing import AgentHarness

seen: list[Any] = []


class Room(BaseModel):
    nights: int
    breakfast: bool = False


async def asks(ctx: RunContext) -> str:
    account = await ctx.ask_user("Which account?", Literal["acme-main", "acme-travel"])
    seen.append(account)
    return f"paid from {account}"


async def asks_for_a_room(ctx: RunContext) -> str:
    try:
        room = await ctx.ask_user("How many nights?", Room, question_id="room")
    except QuestionClosed as e:
        seen.append(e.reason)
        raise
    seen.append(room)
    return f"{room.nights} nights"


async def asks_anything(ctx: RunContext) -> str:
    try:
        seen.append(await ctx.ask_user("Anything to add?"))
    except (QuestionClosed, RunCancelled) as e:
        seen.append(type(e).__name__)
        raise
    return "ok"


@pytest.fixture(autouse=True)
def _fresh() -> None:
    seen.clear()


async def test_the_answer_is_returned_validated_and_named_by_the_person() -> None:
    async with AgentHarness(asks, actor="user:bo") as h:
        await h.prompt("pay the hotel")
        asked = await h.until_event("question.asked")
        p = asked.payload.model_dump()
        assert p["question_id"] == "question-1" and p["question"] == "Which account?"
        assert '"acme-main"' in p["schema_"]  # the declared type's JSON schema, shown
        assert seen == []  # waiting for the person
        await h.answer("question-1", "acme-travel")
        outcome = await h.finished(asked.run_id)
        assert outcome.status == "completed" and outcome.result == "paid from acme-travel"
        answered = next(e for e in h.log if e.type == "question.answered")
        assert answered.payload.model_dump()["answered_by"] == "user:bo"


async def test_a_pydantic_type_converts_the_answer() -> None:
    async with AgentHarness(asks_for_a_room) as h:
        await h.prompt("book")
        asked = await h.until_event("question.asked")
        await h.answer("room", {"nights": 3})
        outcome = await h.finished(asked.run_id)
        assert outcome.status == "completed" and seen == [Room(nights=3)]


async def test_an_answer_that_does_not_fit_the_type_closes_the_question() -> None:
    async with AgentHarness(asks_for_a_room) as h:
        await h.prompt("book")
        asked = await h.until_event("question.asked")
        await h.answer("room", {"nights": "many"})
        outcome = await h.finished(asked.run_id)
        assert outcome.status == "failed"
        assert str(seen[0]).startswith("invalid_answer")


async def test_the_wait_outlasts_several_leases_renewing() -> None:
    async with AgentHarness(asks_anything, lease_ms=300) as h:
        await h.prompt("ask")
        asked = await h.until_event("question.asked")
        await h.until_event("run.lease_renewed", 4)  # > one lease's length waited
        run = h.state.active if h.state else None
        assert run is not None and run.generation == asked.generation  # never lost meanwhile
        await h.answer("question-1", [1, "two"])
        outcome = await h.finished(asked.run_id)
        assert outcome.status == "completed" and seen == [[1, "two"]]
        assert "run.lease_expired" not in h.types()


async def test_a_cancel_releases_the_wait_at_once() -> None:
    async with AgentHarness(asks_anything) as h:
        await h.prompt("ask")
        asked = await h.until_event("question.asked")
        await h.abort()
        outcome = await asyncio.wait_for(h.finished(asked.run_id), 5)
        assert outcome.status == "cancelled" and seen == ["RunCancelled"]
        closed = next(e for e in h.log if e.type == "question.closed")
        assert closed.payload.model_dump()["reason"] == "cancelling"


async def test_an_expired_question_raises_question_closed() -> None:
    config = DeciderConfig(question_ttl_ms=1_000)
    async with AgentHarness(asks_anything, config=config) as h:
        await h.prompt("ask")
        asked = await h.until_event("question.asked")
        outcome = await h.finished(asked.run_id)
        assert outcome.status == "failed" and seen == ["QuestionClosed"]
        closed = next(e for e in h.log if e.type == "question.closed")
        assert closed.payload.model_dump()["reason"] == "question_expired"


async def test_takeover_while_waiting_asks_the_same_question_and_is_answered_once() -> None:
    async with AgentHarness(asks) as h:
        await h.prompt("pay the hotel")
        first = await h.until_event("question.asked")
        await h.crash_worker()
        again = await h.until_event("question.asked", 2)
        assert again.generation == first.generation + 1
        assert again.payload.model_dump()["expires_at"] == first.payload.model_dump()["expires_at"]
        await h.answer("question-1", "acme-main")
        outcome = await h.finished(first.run_id)
        assert outcome.status == "completed" and seen == ["acme-main"]
        assert h.types().count("question.answered") == 1


async def test_takeover_after_the_answer_replays_it_never_asking_again() -> None:
    gate = asyncio.Event()

    async def asks_then_waits(ctx: RunContext) -> str:
        account = await ctx.ask_user("Which account?")
        seen.append(account)
        await gate.wait()
        return str(account)

    async with AgentHarness(asks_then_waits) as h:
        await h.prompt("pay")
        asked = await h.until_event("question.asked")
        await h.answer("question-1", "acme-main")
        await h.until(lambda: seen == ["acme-main"], "the first holder got the answer")
        await h.crash_worker()
        await h.until_event("question.replayed")
        gate.set()
        outcome = await h.finished(asked.run_id)
        assert outcome.status == "completed" and outcome.result == "acme-main"
        assert seen == ["acme-main", "acme-main"]
        assert h.types().count("question.asked") == 1 and h.types().count("question.answered") == 1
