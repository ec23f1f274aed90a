"""Replay the committed golden logs in tests/golden/: commands in, the exact events out.

A golden file is JSON lines: `{"note": ...}` for the reader, `{"command": ...}` (camelCase,
as a producer sends it) followed by one `{"event": ...}` line per event it must give.
`REGEN_GOLDEN=1 pytest tests/unit/core/test_golden.py` rewrites the event lines from the commands;
review the diff by hand before committing it (tests/golden/README.md).
"""

from __future__ import annotations

import json
import os
from itertools import groupby
from pathlib import Path
from typing import Any

import pytest

from sessionstream.core.decider import DEFAULT_CONFIG, DeciderConfig, evolve, fold
from sessionstream.core.state import SessionState
from sessionstream.core.timers import due_timers, timer_command
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.events import Event
from tests.unit._harness import Dedup, check_log
from tests.unit._model import LogModel

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
FILES = sorted(GOLDEN.glob("*.jsonl"))
REGEN = os.environ.get("REGEN_GOLDEN") == "1"
CODEC = Codec()

Line = dict[str, Any]


def load(path: Path) -> list[Line]:
    return [json.loads(raw) for raw in path.read_text().splitlines() if raw.strip()]


def dump(lines: list[Line]) -> str:
    return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)


def config_of(lines: list[Line]) -> DeciderConfig:
    """The story's `{"config": {...}}` line (DeciderConfig fields), or the defaults."""
    for line in lines:
        if "config" in line:
            return DeciderConfig(**line["config"])
    return DEFAULT_CONFIG


def replay(lines: list[Line]) -> tuple[list[Line], list[Event], SessionState | None]:
    """The file as it must be: notes and commands kept, event lines recomputed. A command
    line's `via` names the class of the topic it arrived on (none: tools decide it)."""
    out: list[Line] = []
    log: list[Event] = []
    state: SessionState | None = None
    dedup = Dedup()
    config = config_of(lines)
    for line in lines:
        if "event" in line:
            continue
        out.append(line)
        if "command" not in line:
            continue
        cmd = CODEC.decode_command(json.dumps(line["command"]).encode())  # the JSON path
        if cmd.type == "timer.fired":
            assert state is not None
            built = [
                timer_command(state, t, cmd.ts) for t in due_timers(state, config.retention_ms)
            ]
            assert cmd in built, (
                f"{cmd.command_id} is not a timer sessionstream.core.timers would send"
            )
        # the broker's append time of the record; a story that does not say is one whose
        # producers' clocks agree with the broker's
        at = line.get("logTime", cmd.ts)
        for e in dedup.decide(state, cmd, config, at=at, via=line.get("via")).events:
            state = evolve(state or SessionState.initial(cmd.session_id), e, config)
            log.append(e)
            out.append({"event": Codec.event_to_json(e)})
    return out, log, state


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_golden_log(path: Path) -> None:
    lines, log, state = replay(load(path))
    if REGEN:
        path.write_text(dump(lines))
    assert dump(lines).splitlines() == path.read_text().splitlines()
    check_log(log)
    assert state is not None and fold(log, state.session_id, config_of(lines)) == state
    for e in log:
        assert CODEC.decode_event(CODEC.encode_event(e)) == e


def test_the_required_stories_are_there() -> None:
    names = {p.stem for p in FILES}
    assert {
        "seed_cancel",
        "takeover_stale_write",
        "enqueue_follow_up_order",
        "timeout",
        "late_commands_name_their_run",
        "takeover_redelivers_inputs",
        "clock_is_the_logs",
        "ids_tenants_and_reuse",
        "fates_compaction_and_retry",
        "durable_steps",
        "typed_input",
        "approvals",
        "queue_control",
        "erasure",
        "schedules",
    } <= names


def test_queue_control_story_removes_only_waiting_tasks_and_says_what_became_of_the_rest() -> None:
    """Written from the feature's text: a queued task is named by its command id when queued;
    a dequeue removes it with a fate naming who; twice, unknown, late, another tenant's:
    explicit refusals; clear_queue removes every waiting task in order; a removed task never
    starts; labels travel with the run. The model checks every command's events too."""
    lines = load(GOLDEN / "queue_control.jsonl")
    _, log, state = replay(lines)
    model = LogModel()
    commands = {
        c["commandId"]: CODEC.decode_command(json.dumps(c).encode())
        for c in (line["command"] for line in lines if "command" in line)
    }
    for cid, events in groupby(log, key=lambda e: e.command_id):
        model.feed(list(events), commands[cid])
    removed = [e.payload.model_dump() for e in log if e.type == "run.dequeued"]
    assert [(p["source_command_id"], p["reason"]) for p in removed] == [
        ("sess-queue-03-prompt", "dequeued"),
        ("sess-queue-15-prompt", "cleared"),
        ("sess-queue-05-prompt", "cleared"),
        ("sess-queue-14-prompt", "cleared"),
    ]
    started = [e.payload.model_dump() for e in log if e.type == "run.started"]
    assert [p["source_command_id"] for p in started] == [
        "sess-queue-01-prompt",
        "sess-queue-04-prompt",
    ]
    assert started[1]["metadata"] == {"team": "ops"}
    refusals = [
        (e.payload.model_dump()["reason"], e.payload.model_dump()["target_status"])
        for e in log
        if e.type == "command.rejected"
    ]
    assert refusals == [
        ("not_queued", "dequeued"),
        ("tenant_mismatch", None),
        ("not_queued", "unknown"),
        ("not_queued", "running"),
        ("queue_empty", None),
        ("not_queued", "cleared"),
        ("not_queued", "cancelled"),
    ]
    assert state is not None and state.active is None and state.queue == ()


def test_approvals_story_executes_nothing_without_a_persons_approval() -> None:
    """Written from the feature's text: a payment waits for a person; a stale digest, another
    tenant's key, an older generation's decision and a second approval are refused; a lease
    loss resolves the pending approval first and the new holder sees the same pending
    decision (same window), approved once; a deny says who; expiry denies; a cancel and the
    run's end resolve what waits, first."""
    _, log, _ = replay(load(GOLDEN / "approvals.jsonl"))
    refused = [e.payload.model_dump()["reason"] for e in log if e.type == "command.rejected"]
    assert refused == [
        "digest_mismatch",
        "tenant_mismatch",
        "approval_stale",
        "unknown_action",
        "action_not_pending",
        "stale_generation",
        "approval_stale",
        "action_not_pending",
        "approval_expired",
        "action_not_pending",
        "run_not_active",
    ]
    pending = [(e.generation, e.payload.model_dump()) for e in log if e.type == "action.pending"]
    first, again = pending[0][1], pending[1][1]
    assert (pending[0][0], pending[1][0]) == (1, 2)
    assert (
        again["expires_at"] == first["expires_at"] and again["args_digest"] == first["args_digest"]
    )
    approved = [e.payload.model_dump() for e in log if e.type == "action.approved"]
    assert [(a["idempotency_key"], a["decided_by"]) for a in approved] == [
        ("mail-1", None),  # an email needs no person
        ("pay-1", "user:bo"),  # once, for generation 2
    ]
    completed = [
        e.payload.model_dump()["idempotency_key"] for e in log if e.type == "action.completed"
    ]
    assert completed == ["pay-1"]
    denied = [
        (e.payload.model_dump()["idempotency_key"], e.payload.model_dump()["reason"])
        for e in log
        if e.type == "action.denied"
    ]
    assert denied == [
        ("pay-1", "digest_mismatch"),
        ("pay-1", "lease_lost"),
        ("pay-2", "denied"),
        ("pay-3", "approval_expired"),
        ("pay-4", "cancelling"),
        ("del-1", "run_finished"),
    ]
    # resolution first: each resolving denial is its command's first event
    for e in log:
        if e.type == "action.denied" and e.payload.model_dump()["reason"] in (
            "lease_lost",
            "cancelling",
            "run_finished",
        ):
            same = [x for x in log if x.command_id == e.command_id]
            assert same[0] == e and len(same) > 1


def test_typed_input_story_gives_each_run_its_own_prompts_input() -> None:
    """Written from the protocol's text: a run starts with its prompt's input, a queued
    prompt keeps its own until it starts, a retry carries its own, the reused id and the
    refused prompts change nothing, and a follow-up (a send) carries none."""
    _, log, _ = replay(load(GOLDEN / "typed_input.jsonl"))
    runs = [e.payload.model_dump() for e in log if e.type == "run.started"]
    assert [(r["origin"], json.loads(r["input"])) for r in runs] == [
        ("prompt", {"sku": "A-1", "qty": 2, "giftWrap": False, "note": "leave at the door ✉"}),
        ("queued", ["B-2", 1]),
        ("prompt", ["B-2", 1, "retry"]),
    ]
    assert runs[2]["retry_of"] == log[[e.type for e in log].index("run.started", 1)].run_id
    refused = [e.payload.model_dump()["reason"] for e in log if e.type == "command.rejected"]
    assert refused == ["command_id_reused", "session_busy", "tenant_mismatch"]
    queued = next(e.payload.model_dump() for e in log if e.type == "run.queued")
    assert json.loads(queued["input"]) == ["B-2", 1]
    follow_up = next(e.payload.model_dump() for e in log if e.type == "run.follow_up_queued")
    assert "input" not in follow_up


def test_durable_steps_story_hands_each_finished_step_over_once() -> None:
    """Written from the protocol's text: the new holder gets every finished step back with
    the latest checkpoint, and only the unfinished one is run (and recorded) again."""
    _, log, _ = replay(load(GOLDEN / "durable_steps.jsonl"))
    grant = next(e for e in log if e.type == "run.lease_granted" and e.generation == 2)
    p = grant.payload.model_dump()
    assert (p["checkpoint_ref"], p["steps_delivered"]) == ("s3://ckpt/sess-steps/1", 2)
    delivered = [e.payload.model_dump()["step_id"] for e in log if e.type == "step.delivered"]
    assert delivered == ["model-1", "tool:search-1"]
    recorded = [
        (e.generation, e.payload.model_dump()["step_id"]) for e in log if e.type == "step.recorded"
    ]
    assert recorded == [(1, "model-1"), (1, "tool:search-1"), (2, "tool:search-2")]
    # generation 2 started only the step that had no record
    started = [
        e.payload.model_dump()["call_id"]
        for e in log
        if e.generation == 2 and e.type in ("model.request.started", "tool.started")
    ]
    assert started == ["tool:search-2"]
    # generation 1's unfinished tool call was closed by the lease's loss, as abandoned
    closed = [
        (e.payload.model_dump()["call_id"], e.payload.model_dump()["detail"])
        for e in log
        if e.type == "tool.finished" and e.command_id.startswith("timer:")
    ]
    assert closed == [("tool:search-2", "abandoned: lease_lost")]
    # the session's next run asked for the latest checkpoint and starts from it
    nxt = log[-1].payload.model_dump()
    assert log[-1].type == "run.started"
    assert (nxt["context_ref"], nxt["from_checkpoint"]) == ("s3://ckpt/sess-steps/1", True)


def test_seed_story_ends_cancelled_after_the_ack() -> None:
    _, log, state = replay(load(GOLDEN / "seed_cancel.jsonl"))
    types = [e.type for e in log]
    assert types == [
        "run.started",
        "run.lease_granted",
        "model.request.started",
        "tool.started",
        "run.cancel_requested",
        "action.denied",
        "run.cancel_acknowledged",
        "run.finished",
    ]
    assert log[-1].payload.model_dump()["terminal_status"] == "cancelled"
    assert state is not None and state.active is None


def test_erasure_story_refuses_producers_and_active_runs_and_reuses_no_key() -> None:
    """Written from the feature's text: an erase from a producer's topic, while a run is
    active and from another tenant is refused; an administrator's erase of the finished
    session names it by a hash; nothing of it is known after; later keys are new; the
    retention timer erases only when due by the log's clock."""
    import hashlib

    _, log, state = replay(load(GOLDEN / "erasure.jsonl"))
    refused = [e.payload.model_dump()["reason"] for e in log if e.type == "command.rejected"]
    assert refused == [
        "not_allowed_here",
        "session_busy",
        "tenant_mismatch",
        "unknown_run",
        "timer_stale",
    ]
    erased = [e for e in log if e.type == "session.erased"]
    want = "sha256:" + hashlib.sha256(b"sess-erase").hexdigest()
    assert [
        (e.payload.model_dump()["trigger"], e.payload.model_dump()["session_hash"]) for e in erased
    ] == [
        ("admin", want),
        ("retention", want),
    ]
    first = log.index(erased[0])
    before = {(e.run_id, e.seq) for e in log[: first + 1]}
    after = {(e.run_id, e.seq) for e in log[first + 1 :]}
    assert not before & after
    restarted = [e for e in log[first:] if e.type == "run.started"]
    assert len(restarted) == 1 and restarted[0].payload.model_dump()["context_ref"] is None
    assert state is not None and state.erased_at == erased[-1].ts and state.finished == ()
