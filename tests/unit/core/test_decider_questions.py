"""Questions to a person, rule by rule, written from the issue's text and
docs/protocol.md#questions-to-a-person (not from the decider): the attacker cases — an
answer after the cancel, twice, from another tenant, for a stale generation, after expiry,
too large, a forged or early timer, a skewed producer clock; a takeover while waiting."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sessionstream.core.decider import DeciderConfig
from sessionstream.core.state_codec import decode_state, encode_state
from sessionstream.core.timers import due_timers
from sessionstream.schemas.commands import Command
from tests.unit._harness import Harness, leased, tokens

TTL = 60_000
CFG = DeciderConfig(question_ttl_ms=TTL)


def waiting(config: DeciderConfig = CFG) -> Harness:
    h = Harness(config)
    leased(h)
    assert tokens(h.ask("q1", "Which account?")) == ["question.asked"]
    return h


def reasons(events: list[Any]) -> list[str]:
    return [e.payload.reason for e in events if e.type in ("command.rejected", "question.closed")]


def payload(e: Any) -> dict[str, Any]:
    return dict(e.payload.model_dump())


def test_asked_carries_the_question_and_a_window_on_the_logs_clock() -> None:
    h = Harness(CFG)
    leased(h)
    events = h.work(
        "question.ask",
        {"question_id": "q1", "question": "Which account?", "schema": {"type": "string"}},
    )
    e = events[0]
    p = payload(e)
    assert (p["question_id"], p["question"]) == ("q1", "Which account?")
    assert json.loads(p["schema_"]) == {"type": "string"}
    assert p["expires_at"] == e.ts + TTL and e.generation == 1
    # the approval_expiry timer is due then
    assert [t.due_at for t in due_timers(h.state) if t.kind == "approval_expiry"] == [e.ts + TTL]


def test_an_answer_names_the_person_and_a_re_ask_replays_it_never_asking_again() -> None:
    h = waiting()
    h.now += 1_000
    events = h.answer("q1", {"account": "acme-main", "n": 3}, actor="user:bo")
    assert tokens(events) == ["question.answered"]
    p = payload(events[0])
    assert json.loads(p["answer"]) == {"account": "acme-main", "n": 3}
    assert p["answered_by"] == "user:bo"
    replay = h.ask("q1")
    assert tokens(replay) == ["question.replayed:answered"]
    r = payload(replay[0])
    assert json.loads(r["answer"]) == {"account": "acme-main", "n": 3}
    assert r["answered_by"] == "user:bo"
    assert due_timers(h.state)[0].kind != "approval_expiry"


def test_any_json_answer_null_included() -> None:
    h = waiting()
    events = h.answer("q1", None)
    assert tokens(events) == ["question.answered"] and payload(events[0])["answer"] == "null"


def test_answer_after_the_cancel_is_refused() -> None:
    h = waiting()
    events = h.abort()
    assert tokens(events) == ["question.closed:cancelling", "run.cancel_requested"]
    assert reasons(h.answer()) == ["question_not_open"]
    assert "cancelling" in (h.log[-1].payload.model_dump()["detail"] or "")


def test_answer_twice_is_refused_whoever_sends_it() -> None:
    h = waiting()
    h.answer("q1", "first", actor="user:bo")
    assert reasons(h.answer("q1", "second", actor="user:ana")) == ["question_not_open"]
    assert "user:bo" in (h.log[-1].payload.model_dump()["detail"] or "")
    assert len([e for e in h.log if e.type == "question.answered"]) == 1


def test_answer_from_another_tenant_is_refused_and_the_question_stays_open() -> None:
    h = waiting()
    assert reasons(h.answer("q1", "mine", tenant="globex", actor="mallory")) == ["tenant_mismatch"]
    assert tokens(h.answer("q1", "ours")) == ["question.answered"]


def test_answer_of_an_unknown_question_is_refused() -> None:
    h = waiting()
    assert reasons(h.answer("q9")) == ["unknown_question"]


def test_answer_naming_a_finished_run_is_refused_run_not_active() -> None:
    h = waiting()
    h.work("run.complete")
    assert reasons(h.answer("q1")) == ["run_not_active"]


def test_answer_after_expiry_is_refused_and_the_timer_closes_it() -> None:
    h = waiting()
    h.now += TTL - 1
    assert tokens(h.answer("q1", "just in time")) == ["question.answered"]
    h2 = waiting()
    h2.now += TTL
    assert reasons(h2.answer()) == ["question_expired"]
    run = h2.state.active
    assert run is not None and run.questions["q1"].status == "open"
    assert reasons(h2.fire("approval_expiry")) == ["question_expired"]
    assert reasons(h2.answer()) == ["question_not_open"]
    assert tokens(h2.ask("q1")) == ["question.replayed:closed"]


def test_a_skewed_producer_clock_does_not_open_a_closed_window() -> None:
    h = waiting()
    h.now += TTL + 5_000
    # the person's producer stamps the answer before the question was even asked: the log's
    # clock decides
    cmd = h.command(
        "question.answer",
        {"question_id": "q1", "answer": "late"},
        run_id=h.state.active.run_id if h.state.active else None,
        ts=1,
        actor="user:bo",
    )
    assert reasons(h.apply(cmd)) == ["question_expired"]


def test_a_forged_or_early_expiry_timer_is_stale() -> None:
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
    assert h.state.active is not None and h.state.active.questions["q1"].status == "open"


def test_an_oversize_answer_is_refused_and_the_question_stays_open() -> None:
    h = waiting(DeciderConfig(question_ttl_ms=TTL, max_answer_bytes=32))
    assert reasons(h.answer("q1", "é" * 16)) == ["answer_too_large"]  # 34 bytes as JSON
    assert tokens(h.answer("q1", "é" * 14)) == ["question.answered"]  # 30 bytes


def test_takeover_while_waiting_reopens_the_same_question_never_two_answers() -> None:
    h = waiting()
    first = payload(h.log[-1])
    events = h.work("lease.release")
    assert tokens(events) == ["question.closed:lease_lost", "run.lease_released"]
    assert events[0].generation == 1
    assert reasons(h.answer("q1", generation=1)) == ["question_not_open"]
    h.acquire("w2")
    h.now += 5_000
    events = h.ask("q1", worker="w2")
    assert tokens(events) == ["question.asked"]
    assert events[0].generation == 2 and payload(events[0])["expires_at"] == first["expires_at"]
    assert reasons(h.answer("q1", "old", generation=1)) == ["question_stale"]
    assert tokens(h.answer("q1", "new", generation=2)) == ["question.answered"]
    assert reasons(h.answer("q1", "again")) == ["question_not_open"]
    assert tokens(h.ask("q1", worker="w2")) == ["question.replayed:answered"]
    assert len([e for e in h.log if e.type == "question.answered"]) == 1


def test_takeover_after_an_answer_replays_it_to_the_new_holder() -> None:
    h = waiting()
    h.answer("q1", {"ok": True})
    h.fire("lease_expiry")
    h.acquire("w2")
    events = h.ask("q1", worker="w2")
    assert tokens(events) == ["question.replayed:answered"]
    assert json.loads(payload(events[0])["answer"]) == {"ok": True}


def test_a_takeover_after_the_window_is_closed_expired() -> None:
    h = waiting()
    h.work("lease.release")
    h.acquire("w2")
    h.now += TTL
    assert reasons(h.ask("q1", worker="w2")) == ["question_expired"]
    assert tokens(h.ask("q1", worker="w2")) == ["question.replayed:closed"]


def test_a_stale_holders_ask_is_fenced() -> None:
    h = waiting()
    h.fire("lease_expiry")
    h.acquire("w2")
    events = h.ask("q2", worker="w1", generation=1)
    assert tokens(events) == ["rejected:stale_generation", "run.stale_write_recorded"]


def test_the_runs_end_closes_open_questions_after_pending_approvals() -> None:
    h = Harness(DeciderConfig(approval_policy=(("*", "payment"),)))
    leased(h)
    h.work("action.request", {"idempotency_key": "k1", "kind": "payment"})
    h.ask("q1")
    h.ask("q2")
    events = h.work("run.fail", {"error": "boom"})
    assert tokens(events) == [
        "action.denied",
        "question.closed:run_finished",
        "question.closed:run_finished",
        "run.finished:failed",
    ]
    assert [payload(e)["question_id"] for e in events[1:3]] == ["q1", "q2"]


def test_questions_are_bounded_per_run_and_the_refused_id_stays_free() -> None:
    h = Harness(DeciderConfig(max_questions=1))
    leased(h)
    h.ask("q1")
    assert reasons(h.ask("q2")) == ["too_many_questions"]
    run = h.state.active
    assert run is not None and list(run.questions) == ["q1"]


def test_answer_without_a_run_id_is_no_command() -> None:
    with pytest.raises(ValueError, match="needs runId"):
        Command(
            command_id="c",
            session_id="s",
            tenant_id="acme",
            type="question.answer",
            ts=0,
            payload={"question_id": "q1", "answer": 1},
        )


def test_the_state_record_keeps_questions() -> None:
    h = waiting()
    h.ask("q2")
    h.answer("q1", {"a": "é"})
    assert decode_state(encode_state(h.state)) == h.state
