"""Erasure and retention, rule by rule, written from the feature's text (erasure and
retention of sessions) and docs/protocol.md#erasure-and-retention, not from the decider:
erase twice, from another tenant, from a producer's topic, while a run is active, late
commands after the erasure, the retention timer on the log's clock and a skewed clock."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from pydantic import ValidationError

from sessionstream.core.decider import DeciderConfig
from sessionstream.core.state import SessionState
from sessionstream.core.timers import due_timers
from sessionstream.schemas.commands import LATEST_CHECKPOINT_REF
from tests.unit._harness import SID, Harness, cancelling, compacting, leased, running, tokens

RETAIN = 60_000
CFG = DeciderConfig(retention_ms=RETAIN)


def erase(h: Harness, **kw: Any) -> list[Any]:
    """An administrator's erase, on the control topic."""
    h.via = kw.pop("via", "timer")
    try:
        return h.do("session.erase", kw.pop("payload", {"reason": "user asked"}), **kw)
    finally:
        h.via = None


def finished(h: Harness) -> str:
    """A run that completed, with a checkpoint; returns its id."""
    leased(h)
    h.work("compact.start")
    h.work("compact.finish", {"checkpoint_uri": "s3://ck/1"})
    h.now += 1_000
    h.work("run.complete", {"result": "done"})
    assert h.state.active is None and h.last_run is not None
    return h.last_run


def keys(h: Harness) -> set[tuple[str, int]]:
    return {(e.run_id, e.seq) for e in h.log}


def test_an_idle_session_is_erased_and_keeps_nothing_but_its_counters() -> None:
    h = Harness(CFG)
    finished(h)
    before = h.state
    events = erase(h, actor="admin:ops")
    assert tokens(events) == ["session.erased"]
    p = events[0].payload.model_dump()
    assert p["session_hash"] == "sha256:" + hashlib.sha256(SID.encode()).hexdigest()
    assert (p["trigger"], p["reason"], p["actor"], p["runs_started"]) == (
        "admin",
        "user asked",
        "admin:ops",
        1,
    )
    st = h.state
    assert st.active is None and st.queue == () and st.finished == ()
    assert st.last_checkpoint is None and st.idle_since is None
    assert st.erased_at == events[0].ts
    # kept: the tenant (the id stays its), the clock and the counters (keys never repeat)
    assert (st.tenant_id, st.runs_started, st.clock) == ("acme", 1, h.now)
    assert st.log_seq == before.log_seq + 1
    # no retention timer for an erased session with nothing new
    assert due_timers(st, RETAIN) == []


def test_erasing_twice_erases_again_and_nothing_more() -> None:
    h = Harness(CFG)
    finished(h)
    first = erase(h)
    second = erase(h)
    assert tokens(second) == ["session.erased"]
    assert second[0].seq == first[0].seq + 1
    # not remembered: the same command id again is an erasure again, not a duplicate
    again = erase(h, command_id=second[0].command_id)
    assert tokens(again) == ["session.erased"]


def test_another_tenants_erase_is_refused_and_changes_nothing() -> None:
    h = Harness(CFG)
    finished(h)
    before = h.state
    assert tokens(erase(h, tenant="globex")) == ["rejected:tenant_mismatch"]
    assert h.state.finished == before.finished and h.state.erased_at is None


@pytest.mark.parametrize("via", ["producer", "worker"])
def test_an_erase_on_a_producers_or_workers_topic_is_not_allowed_here(via: str) -> None:
    h = Harness(CFG)
    run = finished(h)
    events = erase(h, via=via, command_id="e1")
    assert tokens(events) == ["rejected:not_allowed_here"]
    assert h.state.finished_run(run) is not None and h.state.erased_at is None
    # not remembered: the same id on the control topic erases
    assert tokens(erase(h, command_id="e1")) == ["session.erased"]


@pytest.mark.parametrize("arrange", [running, leased, compacting, cancelling])
def test_an_erase_while_a_run_is_active_is_refused_session_busy(arrange: Any) -> None:
    h = Harness(CFG)
    arrange(h)
    before = h.state.active
    events = erase(h)
    assert tokens(events) == ["rejected:session_busy"]
    assert "abort" in (events[0].payload.detail or "")
    assert h.state.active is not None and h.state.active.run_id == before.run_id  # type: ignore[union-attr]
    assert h.state.erased_at is None


def test_abort_then_erase_once_the_run_has_finished() -> None:
    h = Harness(CFG)
    leased(h)
    h.abort()
    assert tokens(erase(h)) == ["rejected:session_busy"]
    h.work("cancel.ack", {"model_request_aborted": True})
    assert h.state.active is None
    assert tokens(erase(h)) == ["session.erased"]


def test_late_commands_after_the_erasure_know_nothing_of_the_erased_runs() -> None:
    h = Harness(CFG)
    run = finished(h)
    erase(h)
    # the old holder writes late: an unknown run, not `run_finished`
    assert tokens(h.work("run.progress", {"kind": "tool.started"}, run_id=run)) == [
        "rejected:unknown_run"
    ]
    # a producer naming the erased run: not active, status unknown
    events = h.do("steer", {"text": "x"}, run_id=run)
    assert tokens(events) == ["rejected:run_not_active"]
    assert events[0].payload.target_status == "unknown"
    assert h.state.active is None


def test_a_retry_of_an_erased_run_is_unknown() -> None:
    h = Harness(CFG)
    leased(h)
    h.work("run.fail", {"error": "boom", "retryable": True})
    run = h.last_run
    erase(h)
    events = h.do("prompt", {"text": "retry", "retry_of": run})
    assert tokens(events) == ["rejected:unknown_run"]


def test_after_the_erasure_a_command_starts_a_fresh_session_with_keys_never_seen() -> None:
    h = Harness(CFG)
    finished(h)
    first_prompt = h.commands[0].command_id
    erase(h)
    erased_keys = keys(h)  # every key the sink tombstones, the erasure's own included
    # the old command id is forgotten with the session: decided anew, as a new run
    events = h.do("prompt", {"text": "hello again"}, command_id=first_prompt)
    assert tokens(events) == ["run.started:prompt"]
    assert events[0].run_id not in {r for r, _ in erased_keys}
    # the session log goes on counting: a rejection after the erasure has a new key
    assert tokens(h.prompt("busy")) == ["rejected:session_busy"]
    new_keys = [(e.run_id, e.seq) for e in h.log[len(erased_keys) :]]
    assert new_keys and not set(new_keys) & erased_keys


def test_a_queued_task_from_the_latest_checkpoint_gets_none_after_the_erasure() -> None:
    h = Harness(CFG)
    finished(h)
    assert h.state.last_checkpoint == "s3://ck/1"
    erase(h)
    events = h.do("prompt", {"text": "x", "context_ref": LATEST_CHECKPOINT_REF})
    assert tokens(events) == ["run.started:prompt"]
    p = events[0].payload.model_dump()
    assert p["from_checkpoint"] is True and p["context_ref"] is None


def test_the_retention_timer_erases_a_session_idle_for_the_period_by_the_logs_clock() -> None:
    h = Harness(CFG)
    finished(h)
    idle_since = h.log[-1].ts
    assert [(t.kind, t.due_at) for t in due_timers(h.state, RETAIN)] == [
        ("retention", idle_since + RETAIN)
    ]
    events = h.fire("retention")
    assert tokens(events) == ["session.erased"]
    p = events[0].payload.model_dump()
    assert p["trigger"] == "retention" and p["actor"] is None
    assert due_timers(h.state, RETAIN) == []


def test_no_retention_without_the_setting() -> None:
    h = Harness()
    finished(h)
    assert due_timers(h.state, None) == []
    h.via = "timer"
    forged = h.do(
        "timer.fired", {"kind": "retention", "due_at": 0}, run_id="_session", generation=0
    )
    assert tokens(forged) == ["rejected:timer_stale"]


def test_an_early_retention_timer_is_stale_and_not_remembered() -> None:
    """A processor clock ahead of the broker's fires the timer before the log says it is
    due: refused, not remembered, and honoured when fired again once due."""
    h = Harness(CFG)
    finished(h)
    cmd = h.timer("retention")
    due = cmd.payload.model_dump()["due_at"]
    assert tokens(h.apply(cmd, at=due - 1)) == ["rejected:timer_stale"]
    assert h.state.erased_at is None
    h.now = due
    assert tokens(h.apply(cmd, at=due)) == ["session.erased"]


def test_a_forged_retention_timer_with_an_early_due_time_changes_nothing() -> None:
    h = Harness(CFG)
    finished(h)
    h.via = "timer"
    events = h.do(
        "timer.fired",
        {"kind": "retention", "due_at": 1},
        run_id="_session",
        generation=0,
        ts=10**12,  # the forger's clock: information only
    )
    assert tokens(events) == ["rejected:timer_stale"]
    assert h.state.erased_at is None


def test_a_new_run_before_the_retention_period_keeps_the_session() -> None:
    h = Harness(CFG)
    finished(h)
    cmd = h.timer("retention")
    h.now -= RETAIN // 2  # a prompt half way through the period
    h.now = max(h.now, h.state.clock)
    h.prompt("more")
    assert tokens(h.apply(cmd, at=cmd.payload.model_dump()["due_at"])) == ["rejected:timer_stale"]
    assert h.state.active is not None


def test_a_producers_skewed_clock_moves_no_retention_deadline() -> None:
    h = Harness(CFG)
    leased(h)
    # the completion's producer clock is a day ahead; the log's clock decides
    h.do(
        "run.complete",
        {"result": "ok"},
        run_id=h.state.active.run_id,  # type: ignore[union-attr]
        worker="w1",
        generation=1,
        ts=h.now + 86_400_000,
    )
    assert [t.due_at for t in due_timers(h.state, RETAIN)] == [h.now + RETAIN]


def test_a_session_that_never_ran_has_nothing_to_retain_and_can_be_erased() -> None:
    h = Harness(CFG)
    assert due_timers(SessionState.initial(SID), RETAIN) == []
    assert tokens(erase(h)) == ["session.erased"]
    assert h.state.erased_at is not None and h.state.runs_started == 0


def test_a_reason_too_large_is_a_schema_violation() -> None:
    h = Harness(CFG)
    with pytest.raises(ValidationError):
        h.command("session.erase", {"reason": "x" * 501})
