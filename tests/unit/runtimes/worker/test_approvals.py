"""The worker's side of approvals, in the in-memory harness (the real decider): a handler's
`ctx.action(...)` for a kind that needs a person waits — its lease renewing — for the
person's decision; approved, the action runs once; denied, `ActionDenied` says who; a
cancel releases it at once and the action never runs; a takeover waits on a new pending
request and is approved once."""

from __future__ import annotations

import pytest

from sessionstream.agent import ActionRun, RunContext
from sessionstream.core.decider import DeciderConfig
from sessionstream.runtimes.worker._approval import ActionDenied, args_digest
from sessionstream.testing import AgentHarness

PAYMENTS = DeciderConfig(approval_policy=(("*", "payment"),))
ARGS = {"amount": 420, "to": "Hotel Lisboa"}
DIGEST = args_digest(ARGS)
ran: list[str] = []
outcomes: list[str] = []


async def _pay(a: ActionRun) -> str:
    ran.append(a.idempotency_key)
    return "paid"


async def pays(ctx: RunContext) -> str:
    try:
        return await ctx.action("payment", f"{ctx.run_id}:pay", _pay, arguments=ARGS) or ""
    except ActionDenied as e:
        outcomes.append(str(e.reason))
        raise


@pytest.fixture(autouse=True)
def _fresh() -> None:
    ran.clear()
    outcomes.clear()


def test_the_digest_is_of_the_arguments_canonical_json() -> None:
    assert args_digest({"b": 1, "a": "é"}) == args_digest({"a": "é", "b": 1})
    assert args_digest(ARGS).startswith("sha256:") and len(DIGEST) == 7 + 64


async def test_approved_the_action_runs_once() -> None:
    async with AgentHarness(pays, config=PAYMENTS, actor="user:bo") as h:
        await h.prompt("pay the hotel")
        pending = await h.until_event("action.pending")
        assert pending.payload.model_dump()["args_digest"] == DIGEST
        assert ran == []  # waiting for the person
        await h.approve(f"{pending.run_id}:pay", DIGEST)
        outcome = await h.finished(pending.run_id)
        assert outcome.status == "completed" and ran == [f"{pending.run_id}:pay"]
        approved = [e for e in h.log if e.type == "action.approved"]
        assert [e.payload.model_dump()["decided_by"] for e in approved] == ["user:bo"]


async def test_denied_raises_action_denied_naming_who() -> None:
    async with AgentHarness(pays, config=PAYMENTS, actor="user:bo") as h:
        await h.prompt("pay the hotel")
        pending = await h.until_event("action.pending")
        await h.deny(f"{pending.run_id}:pay", DIGEST, reason="wrong hotel")
        outcome = await h.finished(pending.run_id)
        assert outcome.status == "failed" and ran == []
        assert outcomes == ["denied by user:bo"]


async def test_a_cancel_releases_the_wait_at_once_and_the_action_never_runs() -> None:
    async with AgentHarness(pays, config=PAYMENTS) as h:
        await h.prompt("pay the hotel")
        pending = await h.until_event("action.pending")
        await h.abort()
        outcome = await h.finished(pending.run_id)
        assert outcome.status == "cancelled" and ran == []
        assert outcomes == []  # released as a cancel (RunCancelled), not as a denial
        ack = next(e for e in h.log if e.type == "run.cancel_acknowledged")
        assert f"{pending.run_id}:pay" in ack.payload.model_dump()["actions_blocked"]


async def test_takeover_the_new_holder_waits_on_a_new_pending_and_is_approved_once() -> None:
    async with AgentHarness(pays, config=PAYMENTS) as h:
        await h.prompt("pay the hotel")
        first = await h.until_event("action.pending")
        await h.crash_worker()
        again = await h.until_event("action.pending", 2)
        assert again.generation == first.generation + 1
        assert again.payload.model_dump()["expires_at"] == first.payload.model_dump()["expires_at"]
        await h.approve(f"{first.run_id}:pay", DIGEST)
        outcome = await h.finished(first.run_id)
        assert outcome.status == "completed" and ran == [f"{first.run_id}:pay"]
        assert [e.type for e in h.log].count("action.approved") == 1
