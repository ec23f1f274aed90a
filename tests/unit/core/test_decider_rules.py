"""Rules that span several commands: run order, generations, the action gate, tenancy, size,
duplicates, seq and run ids."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from sessionstream.core.decider import RUN_ID_NAMESPACE, DeciderConfig
from sessionstream.core.state import evolved
from sessionstream.schemas.commands import PromptPayload
from sessionstream.schemas.events import (
    SESSION_LOG,
    CancelAcknowledged,
    CancelRequested,
    CommandRejected,
    InputDropped,
    LeaseGranted,
    RunQueued,
    RunStarted,
)
from tests.unit._harness import Harness, leased, running, tokens


def started_prompts(h: Harness) -> list[str]:
    return [e.payload_as(RunStarted).prompt for e in h.log if e.type == "run.started"]


def end_cancel_ack(h: Harness) -> Any:
    h.abort()
    return h.work("cancel.ack")


def end_lease_expiry(h: Harness) -> Any:
    h.abort()
    return h.fire("lease_expiry")


def end_cancel_deadline(h: Harness) -> Any:
    h.abort()
    h.work("lease.renew", {"lease_ms": 10**9})
    return h.fire("cancel_deadline")


def end_release(h: Harness) -> Any:
    h.abort()
    return h.work("lease.release")


ENDINGS: list[tuple[str, Callable[[Harness], Any], str]] = [
    ("cancel.ack", end_cancel_ack, "cancelled"),
    ("lease_expiry", end_lease_expiry, "cancelled"),
    ("cancel_deadline", end_cancel_deadline, "cancelled"),
    ("release", end_release, "cancelled"),
    ("run_deadline", lambda h: h.fire("run_deadline"), "timed_out"),
    ("fail", lambda h: h.work("run.fail", {"error": "x"}), "failed"),
]


@pytest.mark.parametrize(("end", "status"), [pytest.param(e, s, id=i) for i, e, s in ENDINGS])
def test_waiting_tasks_start_in_order_and_the_runs_follow_ups_go_with_it(
    end: Callable[[Harness], Any], status: str
) -> None:
    h = Harness()
    leased(h)
    h.prompt("P1", policy="enqueue")
    f1 = h.follow_up("F1")[0].command_id  # pending for the active run: it never got it
    h.prompt("P2", policy="enqueue")
    events = end(h)
    assert tokens(events)[-3:] == [
        "run.input_dropped",
        f"run.finished:{status}",
        "run.started:queued",
    ]
    dropped = events[-3].payload_as(InputDropped)
    assert (dropped.source_command_id, dropped.kind, dropped.terminal_status) == (
        f1,
        "follow_up",
        status,
    )
    # each following run ends at once (unleased abort), freeing the session for the next
    for _ in range(2):
        h.abort()
    # the follow-up never became a task of its own: only the prompts ran, in their order
    assert started_prompts(h) == ["p0", "P1", "P2"] and h.state.queue == ()


def test_follow_up_with_on_run_end_queue_waits_behind_the_queued_prompts() -> None:
    h = Harness()
    leased(h)
    h.prompt("P1", policy="enqueue")
    h.do("follow_up", {"text": "F1", "on_run_end": "queue"})
    h.abort()
    events = h.work("cancel.ack")
    assert tokens(events) == [
        "run.cancel_acknowledged",
        "run.input_requeued",
        "run.finished:cancelled",
        "run.queued",
        "run.started:queued",
    ]
    h.abort()
    h.abort()
    assert started_prompts(h) == ["p0", "P1", "F1"]


def test_complete_delivers_follow_up_then_queue_continues() -> None:
    h = Harness()
    leased(h)
    h.prompt("P1", policy="enqueue")
    f1 = h.follow_up("F1")[0].command_id
    h.prompt("P2", policy="enqueue")
    first = h.work("run.complete", {"result": "round 0"})
    assert tokens(first) == ["run.round_completed", "run.follow_up_delivered"]
    # still not consumed: the run goes on again, the follow-up is not silently lost
    again = h.work("run.complete", {"result": "round 1"})
    assert tokens(again) == ["run.round_completed", "run.follow_up_delivered"]
    # every round's answer is on the log, not only the last one's
    assert [first[0].payload.result, again[0].payload.result] == ["round 0", "round 1"]
    assert tokens(h.work("run.complete", {"consumed_follow_ups": [f1]})) == [
        "run.input_consumed",
        "run.finished:completed",
        "run.started:queued",
    ]
    h.abort()
    assert started_prompts(h) == ["p0", "P1", "P2"]


def test_follow_up_while_cancelling_waits_as_a_task_in_arrival_order() -> None:
    h = Harness()
    leased(h)
    h.abort()
    assert tokens(h.follow_up("F-late")) == ["run.queued"]
    h.send("NEW")
    h.work("cancel.ack")
    assert started_prompts(h) == ["p0", "F-late"]
    h.abort()
    assert started_prompts(h) == ["p0", "F-late", "NEW"]


def test_follow_up_when_idle_reject_is_refused_while_cancelling() -> None:
    h = Harness()
    leased(h)
    h.abort()
    assert tokens(h.follow_up("F", when_idle="reject")) == ["rejected:run_cancelling"]
    h.work("cancel.ack")
    assert started_prompts(h) == ["p0"] and h.state.active is None


def test_interrupt_goes_in_front_of_enqueued_prompts() -> None:
    h = Harness()
    leased(h)
    h.prompt("P1", policy="enqueue")
    h.prompt("I", policy="interrupt")
    h.work("cancel.ack")
    assert started_prompts(h) == ["p0", "I"]
    h.abort()
    assert started_prompts(h) == ["p0", "I", "P1"]


def test_generation_lifecycle_and_takeover() -> None:
    h = Harness()
    running(h)
    assert h.generation == 1 and h.state.active and h.state.active.lease_owner is None
    [granted] = h.acquire("w1")
    assert granted.generation == 1 and granted.payload_as(LeaseGranted).worker_id == "w1"
    h.work("run.progress", {"kind": "model.request.started"})
    [expired] = h.fire("lease_expiry")
    assert expired.generation == 2 and h.generation == 2
    [taken] = h.acquire("w2")
    assert taken.generation == 2 and h.state.active.lease_owner == "w2"
    before = h.state
    events = h.work("run.progress", {"kind": "tool.started"}, worker="w1", generation=1)
    assert tokens(events) == ["rejected:stale_generation", "run.stale_write_recorded"]
    assert events[0].run_id == SESSION_LOG and events[1].run_id == before.active.run_id
    # the stale write advanced the logs' seq, nothing else
    assert h.state.active is not None
    assert (
        evolved(
            h.state,
            log_seq=before.log_seq,
            active=evolved(h.state.active, seq=before.active.seq),
        )
        == before
    )
    [released] = h.work("lease.release", worker="w2")
    assert released.generation == 3 and h.state.active.lease_owner is None
    assert tokens(h.acquire("w1")) == ["run.lease_granted"] and h.generation == 3


def test_action_gate_never_approves_twice() -> None:
    h = Harness()
    leased(h)
    req = {"idempotency_key": "mail-1", "kind": "email"}
    assert tokens(h.work("action.request", req)) == ["action.approved"]
    for _ in range(3):
        assert tokens(h.work("action.request", req)) == ["action.decision_replayed:approved"]
    h.abort()
    # a new key is refused while cancelling; so is a retry of the approved, unfinished one
    # (its first decision stays recorded, but nothing may act once the cancel is asked)
    assert tokens(h.work("action.request", {**req, "idempotency_key": "mail-2"})) == [
        "action.denied"
    ]
    assert tokens(h.work("action.request", req)) == ["action.denied"]
    h.work("cancel.ack", {"actions_blocked": ["mail-2"]})
    assert tokens(h.work("action.request", req)) == ["action.denied"]
    assert [e.type for e in h.log].count("action.approved") == 1


def test_denied_action_stays_denied_after_compaction() -> None:
    h = Harness()
    leased(h)
    h.work("compact.start")
    req = {"idempotency_key": "k", "kind": "write"}
    assert tokens(h.work("action.request", req)) == ["action.denied"]
    h.work("compact.finish", {"checkpoint_uri": "s3://ck"})
    assert tokens(h.work("action.request", req)) == ["action.decision_replayed:denied"]
    assert tokens(h.work("action.result", {"idempotency_key": "k"})) == ["rejected:unknown_action"]


def test_action_gate_after_lease_loss_takes_the_new_generation() -> None:
    h = Harness()
    leased(h)
    h.fire("lease_expiry")
    events = h.work("action.request", {"idempotency_key": "k", "kind": "x"}, generation=1)
    assert tokens(events)[0] == "rejected:stale_generation"
    h.acquire("w2")
    assert tokens(h.work("action.request", {"idempotency_key": "k", "kind": "x"}, worker="w2")) == [
        "action.approved"
    ]


def test_tenant_is_claimed_by_the_first_run() -> None:
    h = Harness()
    # a rejected command claims nothing
    assert tokens(h.steer()) == ["rejected:no_active_run"]
    assert h.state.tenant_id is None
    h.prompt("mine")
    assert h.state.tenant_id == "acme"
    [rej] = h.do("steer", {"text": "x"}, tenant="other")
    assert rej.payload_as(CommandRejected).reason == "tenant_mismatch"
    assert rej.tenant_id == "acme"  # recorded in the owner's stream, not the intruder's
    h.abort()
    assert tokens(h.prompt("again", tenant="other")) == ["rejected:tenant_mismatch"]


def test_payload_size_limit_is_inclusive() -> None:
    limit = 200
    h = Harness(DeciderConfig(max_payload_bytes=limit))
    empty = len(PromptPayload(text="").__pydantic_serializer__.to_json(PromptPayload(text="")))
    fits = "x" * (limit - empty)
    assert tokens(h.prompt(fits)) == ["run.started:prompt"]
    h.abort()
    [rej] = h.prompt(fits + "x")
    why = rej.payload_as(CommandRejected)
    assert why.reason == "payload_too_large" and f"{limit + 1} bytes" in (why.detail or "")


def test_exact_duplicate_decides_nothing() -> None:
    h = Harness()
    first = h.command("prompt", {"text": "p"})
    assert tokens(h.apply(first)) == ["run.started:prompt"]
    assert h.apply(first) == []
    # a re-send whose producer stamped it again is still the same command
    assert h.apply(first.model_copy(update={"ts": first.ts + 5})) == []
    rejected = h.command("steer", {"text": "x"}, run_id="r-old")
    assert tokens(h.apply(rejected)) == ["rejected:run_not_active"]
    assert h.apply(rejected) == []  # a rejection is an outcome too: not decided twice
    timer = h.timer("run_deadline")
    assert tokens(h.apply(timer)) == ["run.finished:timed_out"]
    assert h.apply(timer) == []  # the processor re-fired it after a restart


@pytest.mark.parametrize(
    "other",
    [
        pytest.param({"type": "abort", "payload": {}}, id="type"),
        pytest.param({"payload": {"text": "q"}}, id="payload"),
        pytest.param({"run_id": "r-x"}, id="run"),
        pytest.param({"actor": "user:eve"}, id="actor"),
    ],
)
def test_same_command_id_with_other_content_is_refused(other: dict[str, Any]) -> None:
    h = Harness()
    first = h.command("prompt", {"text": "p"})
    h.apply(first)
    data = {**first.model_dump(), **other}
    events = h.apply(type(first).model_validate(data))
    assert tokens(events) == ["rejected:command_id_reused"]
    # the id keeps its first meaning: the first command re-sent is still a duplicate
    assert h.apply(first) == []


def test_a_foreign_tenants_command_takes_no_id_from_the_owner() -> None:
    h = Harness()
    h.prompt("mine")
    forged = h.command("abort", {}, tenant="intruder", command_id="owner-abort-1")
    assert tokens(h.apply(forged)) == ["rejected:tenant_mismatch"]
    assert tokens(h.apply(forged)) == ["rejected:tenant_mismatch"]  # refused every time
    # the owner's command with that id is decided as if the intruder never sent it
    own = h.command("abort", {}, command_id="owner-abort-1")
    assert tokens(h.apply(own)) == ["run.cancel_requested", "run.finished:cancelled"]


def test_dedup_window_is_bounded_in_time() -> None:
    h = Harness(DeciderConfig(dedup_ttl_ms=60_000))
    first = h.command("steer", {"text": "x"})
    h.apply(first)
    h.now += 60_000
    assert h.apply(first) == []  # inside the window (inclusive)
    h.now += 1
    # forgotten once the window has passed by the decider's clock: decided again
    assert tokens(h.apply(first)) == ["rejected:no_active_run"]


def test_seq_contiguous_per_run_and_session_log() -> None:
    h = Harness()
    for _ in range(3):
        h.steer()
    leased(h)
    for _ in range(4):
        h.work("run.progress", {"kind": "tool.started"})
    h.prompt("busy")
    h.work("run.complete")
    log = [e.seq for e in h.log if e.run_id == SESSION_LOG]
    run = [e.seq for e in h.log if e.run_id == h.last_run]
    assert log == [1, 2, 3, 4] and run == list(range(1, 8))


def test_run_ids_are_deterministic() -> None:
    def story(session: str) -> list[str]:
        h = Harness(session_id=session)
        leased(h)
        h.prompt("next", policy="enqueue")
        h.work("run.complete")
        return [e.run_id for e in h.log if e.type == "run.started"]

    a, b = story("s-1"), story("s-1")
    assert a == b and len(set(a)) == 2
    assert a[0] == str(uuid.uuid5(RUN_ID_NAMESPACE, "s-1/c1/0"))
    assert a[1] == str(uuid.uuid5(RUN_ID_NAMESPACE, "s-1/c3/1"))
    assert set(story("s-2")).isdisjoint(a)


def test_run_timeout_defaults_and_cap() -> None:
    cfg = DeciderConfig(default_run_timeout_ms=1_000, max_run_timeout_ms=5_000)
    h = Harness(cfg)
    [s] = h.prompt("a")
    assert s.payload_as(RunStarted).timeout_at == h.now + 1_000
    h.abort()
    [s] = h.do("prompt", {"text": "b", "timeout_ms": 10**9})
    assert s.payload_as(RunStarted).timeout_at == h.now + 5_000


def test_cancel_carries_what_was_aborted_and_its_deadline() -> None:
    h = Harness(DeciderConfig(cancel_grace_ms=7_000))
    leased(h)
    [req] = h.abort("user")
    assert req.payload_as(CancelRequested).cancel_deadline_at == h.now + 7_000
    ack = {"model_request_aborted": True, "tools_aborted": ["web"], "subtasks_cancelled": ["s"]}
    ev = h.work("cancel.ack", ack)
    acked = ev[0].payload_as(CancelAcknowledged)
    assert acked.model_dump() == {
        "worker_id": "w1",
        **ack,
        "actions_blocked": [],
        "actions_executing": [],
    }


def test_events_carry_the_log_time_the_producer_time_and_the_tenant() -> None:
    h = Harness()
    h.now = 42
    [e] = h.prompt(ts=7)
    assert (e.ts, e.producer_ts, e.tenant_id, e.session_id, e.generation) == (
        42,
        7,
        "acme",
        "s-1",
        1,
    )
    [r] = h.prompt()
    assert (r.run_id, r.generation) == (SESSION_LOG, 0)


def test_a_completed_action_replays_its_decision_while_cancelling() -> None:
    h = Harness()
    leased(h)
    req = {"idempotency_key": "mail-1", "kind": "email"}
    assert tokens(h.work("action.request", req)) == ["action.approved"]
    assert tokens(h.work("action.result", {"idempotency_key": "mail-1"})) == ["action.completed"]
    h.abort()
    # it already happened: the worker may learn its result, nothing runs again
    assert tokens(h.work("action.request", req)) == ["action.decision_replayed:approved"]


def test_acquire_with_an_old_generation_is_fenced() -> None:
    h = Harness()
    leased(h)
    old = h.generation
    h.fire("lease_expiry")
    out = h.work("lease.acquire", {}, worker="w1", generation=old)
    assert tokens(out) == ["rejected:stale_generation", "run.stale_write_recorded"]
    assert tokens(h.acquire("w2")) == ["run.lease_granted"] and h.generation == old + 1


def test_a_run_is_open_exactly_while_it_needs_a_holder() -> None:
    from sessionstream.core.open_runs import open_run

    h = Harness()
    assert open_run(h.state) is None
    h.prompt("p")
    o = open_run(h.state)
    assert o is not None and (o.run_id, o.generation, o.previous_holder) == (h.last_run, 1, None)
    h.acquire("w1")
    assert open_run(h.state) is None
    h.work("compact.start")
    h.fire("lease_expiry")  # lost mid-compaction: open again, running, at the next generation
    o = open_run(h.state)
    assert o is not None and (o.status, o.generation, o.previous_holder) == ("running", 2, "w1")
    h.acquire("w2")
    h.abort()
    assert open_run(h.state) is None  # cancelling: its holder acknowledges, nobody else runs it
    h.work("cancel.ack", worker="w2")
    assert open_run(h.state) is None and h.state.active is None


def test_an_id_used_by_another_tenant_before_the_session_had_an_owner_stays_free() -> None:
    h = Harness()
    early = h.command("steer", {"text": "x"}, tenant="intruder", command_id="k-1")
    assert tokens(h.apply(early)) == ["rejected:no_active_run"]
    # ids are remembered per tenant: the owner's first prompt under it is its own command
    assert tokens(h.prompt("mine", command_id="k-1")) == ["run.started:prompt"]


def test_a_requeued_follow_up_keeps_who_sent_it() -> None:
    h = Harness()
    leased(h)
    h.do("follow_up", {"text": "F", "on_run_end": "queue"}, actor="user:bo")
    h.abort()
    events = h.work("cancel.ack")
    queued = next(e for e in events if e.type == "run.queued")
    assert queued.payload_as(RunQueued).actor == "user:bo"
    started = next(e for e in events if e.type == "run.started")
    assert started.payload_as(RunStarted).actor == "user:bo"
