"""Approval at the action gate, rule by rule, written from the feature's text and
docs/protocol.md#approvals (not from the decider): the attacker cases — approve after the
cancel, with a stale digest, from another tenant's key, twice, after expiry; a takeover with
a pending approval — and the policy's sources (settings per tenant and kind, the prompt)."""

from __future__ import annotations

from typing import Any

import pytest

from sessionstream.core.approvals import needs_approval, parse_approval_kinds
from sessionstream.core.decider import DeciderConfig
from sessionstream.core.timers import due_timers
from sessionstream.schemas.commands import Command
from tests.unit._harness import Harness, leased, tokens

TTL = 60_000
CFG = DeciderConfig(approval_policy=(("*", "payment"),), approval_ttl_ms=TTL)
A, B = "sha256:aa", "sha256:bb"


def pay(key: str = "k1", digest: str | None = A, kind: str = "payment") -> dict[str, Any]:
    return {"idempotency_key": key, "kind": kind, "args_digest": digest, "detail": "EUR 5"}


def waiting(config: DeciderConfig = CFG) -> Harness:
    h = Harness(config)
    leased(h)
    assert tokens(h.work("action.request", pay())) == ["action.pending"]
    return h


def reasons(events: list[Any]) -> list[str]:
    return [e.payload.reason for e in events if e.type in ("command.rejected", "action.denied")]


def test_pending_carries_key_kind_digest_and_a_window_on_the_logs_clock() -> None:
    h = waiting()
    e = h.log[-1]
    p = e.payload.model_dump()
    assert (p["idempotency_key"], p["kind"], p["args_digest"]) == ("k1", "payment", A)
    assert p["expires_at"] == e.ts + TTL and e.generation == 1
    # the approval_expiry timer is due then
    assert [t.due_at for t in due_timers(h.state) if t.kind == "approval_expiry"] == [e.ts + TTL]


def test_a_persons_approval_names_them_and_the_action_may_then_run_once() -> None:
    h = waiting()
    h.now += 1_000
    events = h.approve("k1", A, actor="user:bo")
    assert tokens(events) == ["action.approved"]
    assert events[0].payload.model_dump()["decided_by"] == "user:bo"
    assert tokens(h.work("action.request", pay())) == ["action.decision_replayed:approved"]
    assert tokens(h.work("action.result", {"idempotency_key": "k1"})) == ["action.completed"]


def test_a_result_for_a_key_still_pending_is_refused() -> None:
    h = waiting()
    assert reasons(h.work("action.result", {"idempotency_key": "k1"})) == ["unknown_action"]


def test_deny_gives_the_persons_reason_and_who() -> None:
    h = waiting()
    events = h.deny("k1", A, reason="wrong hotel", actor="user:bo")
    p = events[0].payload.model_dump()
    assert (p["reason"], p["detail"], p["decided_by"]) == ("denied", "wrong hotel", "user:bo")
    assert tokens(h.work("action.request", pay())) == ["action.decision_replayed:denied"]


def test_approve_after_the_cancel_is_refused() -> None:
    h = waiting()
    events = h.abort()
    assert tokens(events) == ["action.denied", "run.cancel_requested"]
    assert events[0].payload.model_dump()["reason"] == "cancelling"
    assert reasons(h.approve()) == ["action_not_pending"]


def test_approve_with_a_stale_digest_is_refused_and_changes_nothing() -> None:
    h = waiting()
    before = h.state.active
    assert reasons(h.approve("k1", B)) == ["digest_mismatch"]
    assert reasons(h.approve("k1", None)) == ["digest_mismatch"]
    assert h.state.active is not None and before is not None
    assert h.state.active.actions == before.actions
    assert tokens(h.approve("k1", A)) == ["action.approved"]


def test_approve_from_another_tenants_key_is_refused() -> None:
    h = waiting()
    events = h.approve("k1", A, tenant="globex", actor="mallory")
    assert reasons(events) == ["tenant_mismatch"]
    assert tokens(h.approve("k1", A)) == ["action.approved"]


def test_approve_twice_and_deny_after_approve_are_refused() -> None:
    h = waiting()
    h.approve()
    assert reasons(h.approve()) == ["action_not_pending"]
    assert reasons(h.deny()) == ["action_not_pending"]
    assert "approved" in h.log[-1].payload.model_dump()["detail"]


def test_approve_after_expiry_is_refused_and_the_timer_denies() -> None:
    h = waiting()
    h.now += TTL - 1
    h.now += 1
    assert reasons(h.approve()) == ["approval_expired"]
    assert h.state.active is not None and h.state.active.actions["k1"].decision == "pending"
    events = h.fire("approval_expiry")
    assert reasons(events) == ["approval_expired"]
    assert reasons(h.approve()) == ["action_not_pending"]


def test_an_early_approval_expiry_timer_is_stale() -> None:
    h = waiting()
    run = h.state.active
    assert run is not None
    cmd = h.command(
        "timer.fired",
        {"kind": "approval_expiry", "due_at": 0},
        run_id=run.run_id,
        generation=run.generation,
    )
    assert reasons(h.apply(cmd)) == ["timer_stale"]


def test_takeover_the_new_holder_sees_the_same_pending_decision_never_a_second_approval() -> None:
    h = waiting()
    first = h.log[-1].payload.model_dump()
    events = h.work("lease.release")
    assert tokens(events) == ["action.denied:lease_lost", "run.lease_released"]
    assert events[0].generation == 1 and events[1].generation == 2
    # a decision now finds nothing waiting; nor can it name the lost generation's request
    assert reasons(h.approve("k1", A, generation=1)) == ["action_not_pending"]
    h.acquire("w2")
    h.now += 5_000
    # the new holder asks with other arguments: refused, the key keeps its record
    assert reasons(h.work("action.request", pay(digest=B), worker="w2")) == ["digest_mismatch"]
    events = h.work("action.request", pay(), worker="w2")
    assert tokens(events) == ["action.pending"]
    again = events[0].payload.model_dump()
    assert events[0].generation == 2 and again["expires_at"] == first["expires_at"]
    assert reasons(h.approve("k1", A, generation=1)) == ["approval_stale"]
    assert tokens(h.approve("k1", A, generation=2)) == ["action.approved"]
    assert reasons(h.approve("k1", A)) == ["action_not_pending"]
    approvals = [e for e in h.log if e.type == "action.approved"]
    assert len(approvals) == 1


def test_a_takeover_after_the_window_is_denied_expired() -> None:
    h = waiting()
    h.work("lease.release")
    h.acquire("w2")
    h.now += TTL
    assert reasons(h.work("action.request", pay(), worker="w2")) == ["approval_expired"]
    assert tokens(h.work("action.request", pay(), worker="w2")) == [
        "action.decision_replayed:denied"
    ]


def test_the_runs_end_resolves_every_pending_key_first() -> None:
    h = waiting()
    h.work("action.request", pay("k2"))
    events = h.work("run.fail", {"error": "boom"})
    assert tokens(events) == [
        "action.denied",
        "action.denied",
        "run.finished:failed",
    ]
    assert [e.payload.model_dump()["reason"] for e in events[:2]] == ["run_finished"] * 2


def test_approve_without_a_run_id_is_no_command() -> None:
    with pytest.raises(ValueError, match="needs runId"):
        Command(
            command_id="c",
            session_id="s",
            tenant_id="acme",
            type="action.approve",
            ts=0,
            payload={"idempotency_key": "k1", "args_digest": A},
        )


def test_pending_keys_count_toward_max_actions() -> None:
    h = Harness(DeciderConfig(approval_policy=(("*", "payment"),), max_actions=1))
    leased(h)
    h.work("action.request", pay("k1"))
    assert tokens(h.work("action.request", pay("k2", kind="email"))) == ["action.denied"]
    assert h.log[-1].payload.model_dump()["reason"] == "too_many_actions"


def test_a_prompt_adds_kinds_for_its_run_and_a_queued_prompt_keeps_them() -> None:
    h = Harness()  # no settings policy: only the prompt's
    h.prompt("first")
    h.do("prompt", {"text": "second", "policy": "enqueue", "approval_kinds": ["email"]})
    h.acquire("w1")
    assert tokens(h.work("action.request", pay(kind="email"))) == ["action.approved"]
    h.work("run.complete")
    h.acquire("w1")
    assert tokens(h.work("action.request", pay(kind="email"))) == ["action.pending"]
    assert tokens(h.work("action.request", pay("k2", kind="sms"))) == ["action.approved"]


@pytest.mark.parametrize(
    ("policy", "tenant", "kind", "run_kinds", "needed"),
    [
        ("", "acme", "payment", (), False),
        ("payment", "acme", "payment", (), True),
        ("payment", "acme", "email", (), False),
        ("acme:payment", "globex", "payment", (), False),
        ("acme:payment", "acme", "payment", (), True),
        ("acme:*", "acme", "anything", (), True),
        ("*:email", "globex", "email", (), True),
        ("send_email, acme:payment", "acme", "send_email", (), True),
        ("", "acme", "email", ("email",), True),
        ("", "acme", "email", ("*",), True),
        ("acme:payment", "acme", "email", ("sms",), False),
    ],
)
def test_policy(
    policy: str, tenant: str, kind: str, run_kinds: tuple[str, ...], needed: bool
) -> None:
    assert needs_approval(parse_approval_kinds(policy), tenant, kind, run_kinds) is needed


@pytest.mark.parametrize("bad", ["acme:", ":payment", " : "])
def test_policy_entries_need_both_sides(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_approval_kinds(bad)
