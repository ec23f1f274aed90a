"""Queue control and labels, rule by rule, written from the feature's text and
docs/protocol.md#queue-control (not from the decider): a queued task is named by the id of
the command that queued it; `dequeue` and `clear_queue` remove waiting tasks with a fate on
the session log; the attacker cases — unknown id, twice, late (the task started), another
tenant, after a cancel, after a takeover, a skewed clock, too large — and a prompt's labels
(`metadata`), kept on its run."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from sessionstream.core.decider import DeciderConfig, command_digest
from sessionstream.core.timers import due_timers
from sessionstream.schemas.commands import Command
from sessionstream.schemas.events import SESSION_LOG, Event
from tests.unit._harness import Harness, cancelling, leased, tokens


def rejected(events: list[Event]) -> tuple[str, str | None, str | None]:
    assert tokens(events)[0].startswith("rejected:"), tokens(events)
    p: Any = events[0].payload
    return p.reason, p.target_status, p.detail


def with_queue(h: Harness, *ids: str, actor: str = "user:ana") -> None:
    """A running run, and a task per id waiting behind it (queued by `actor`)."""
    if h.state.active is None:
        leased(h)
    for i in ids:
        events = h.prompt(f"task {i}", "enqueue", command_id=i, actor=actor)
        assert tokens(events) == ["run.queued"]
        # the task is named, when queued, by the command that queued it
        assert events[0].payload.model_dump()["source_command_id"] == i


def waiting(h: Harness) -> list[str]:
    return [q.source_command_id for q in h.state.queue]


def test_dequeue_removes_the_named_task_with_a_fate_naming_it_and_who() -> None:
    h = Harness()
    with_queue(h, "B", "C")
    events = h.dequeue("B", actor="user:bo")
    assert tokens(events) == ["run.dequeued:dequeued"]
    e = events[0]
    assert e.run_id == SESSION_LOG
    assert e.payload.model_dump() == {
        "source_command_id": "B",
        "kind": "prompt",
        "reason": "dequeued",
        "actor": "user:bo",
        "queued_by": "user:ana",
    }
    assert waiting(h) == ["C"]
    # the removed task never starts: the next run is C's
    started = h.work("run.complete")
    assert tokens(started) == ["run.finished:completed", "run.started:queued"]
    assert started[-1].payload.model_dump()["source_command_id"] == "C"


def test_dequeue_of_the_only_task_leaves_the_session_idle_after_the_run() -> None:
    h = Harness()
    with_queue(h, "B")
    h.dequeue("B")
    assert tokens(h.work("run.complete")) == ["run.finished:completed"]
    assert h.state.active is None and h.state.queue == ()


def test_an_unknown_id_is_refused_not_queued_and_nothing_changes() -> None:
    h = Harness()
    with_queue(h, "B")
    before = h.state.queue
    reason, status, detail = rejected(h.dequeue("nobody"))
    assert (reason, status) == ("not_queued", "unknown")
    assert detail is not None and "nobody" in detail
    assert h.state.queue == before


def test_twice_an_exact_resend_is_silent_and_a_second_dequeue_says_who_removed_it() -> None:
    h = Harness()
    with_queue(h, "B")
    cmd = h.command("dequeue", {"command_id": "B"}, actor="user:bo", command_id="d1")
    assert tokens(h.apply(cmd)) == ["run.dequeued:dequeued"]
    assert h.apply(cmd) == []  # the same command again: a duplicate, no event
    reason, status, detail = rejected(h.dequeue("B", actor="user:cy"))
    assert (reason, status) == ("not_queued", "dequeued")
    assert detail is not None and "user:bo" in detail


def test_late_a_dequeue_after_the_task_started_names_its_run_and_status() -> None:
    h = Harness()
    with_queue(h, "B")
    started = h.work("run.complete")  # A ends, B starts before the dequeue is decided
    b_run = started[-1].run_id
    reason, status, detail = rejected(h.dequeue("B"))
    assert (reason, status) == ("not_queued", "running")
    assert detail is not None and b_run in detail
    assert h.status == "running"  # B goes on: a late dequeue never cancels it
    # once B has ended, the refusal says how
    h.acquire("w2")
    h.work("run.fail", {"error": "x"}, worker="w2")
    reason, status, _ = rejected(h.dequeue("B"))
    assert (reason, status) == ("not_queued", "failed")


def test_another_tenants_dequeue_and_clear_are_refused_and_take_no_id() -> None:
    h = Harness()
    with_queue(h, "B")
    events = h.dequeue("B", tenant="globex", command_id="x-1")
    assert rejected(events)[0] == "tenant_mismatch"
    assert rejected(h.clear_queue(tenant="globex"))[0] == "tenant_mismatch"
    assert waiting(h) == ["B"]
    # the owner may still use the id the intruder sent
    assert tokens(h.dequeue("B", command_id="x-1")) == ["run.dequeued:dequeued"]


def test_after_a_cancel_the_queue_is_still_controlled_and_the_removed_task_never_starts() -> None:
    h = Harness()
    with_queue(h, "B", "C")
    assert tokens(h.abort())[-1] == "run.cancel_requested"  # held: cancelling
    assert tokens(h.dequeue("B")) == ["run.dequeued:dequeued"]
    ended = h.work("cancel.ack")
    assert tokens(ended)[-2:] == ["run.finished:cancelled", "run.started:queued"]
    assert ended[-1].payload.model_dump()["source_command_id"] == "C"


def test_removing_an_interrupting_prompt_leaves_its_cancel_and_starts_nothing() -> None:
    h = Harness()
    leased(h)
    events = h.prompt("stop, do this", "interrupt", command_id="I")
    assert tokens(events) == ["run.queued", "run.cancel_requested"]
    assert tokens(h.dequeue("I")) == ["run.dequeued:dequeued"]
    assert h.status == "cancelling"  # the cancel is not undone
    assert tokens(h.work("cancel.ack"))[-1] == "run.finished:cancelled"
    assert h.state.active is None


def test_after_a_takeover_the_queue_is_the_sessions_and_a_stale_holder_cannot_touch_it() -> None:
    h = Harness()
    with_queue(h, "B", "C")
    h.now = h.state.active.lease_expires_at or h.now  # type: ignore[union-attr]
    assert "run.lease_expired:lease_expiry" in tokens(h.fire("lease_expiry"))
    h.acquire("w2")
    # the old holder writes at its old generation: fenced, the queue untouched
    h.work("run.complete", worker="w1", generation=1)
    assert waiting(h) == ["B", "C"]
    assert tokens(h.dequeue("C")) == ["run.dequeued:dequeued"]
    done = h.work("run.complete", worker="w2")
    assert done[-1].payload.model_dump()["source_command_id"] == "B"


def test_a_skewed_producer_clock_decides_nothing() -> None:
    h = Harness()
    with_queue(h, "B")
    events = h.dequeue("B", ts=1)  # a producer clock decades behind
    assert tokens(events) == ["run.dequeued:dequeued"]
    assert events[0].ts == h.now and events[0].producer_ts == 1


def test_an_id_too_long_is_no_command() -> None:
    h = Harness()
    with pytest.raises(ValidationError):
        h.command("dequeue", {"command_id": "x" * 201})
    with pytest.raises(ValidationError):
        h.command("dequeue", {"command_id": ""})


def test_a_dequeue_naming_a_run_acts_only_while_that_run_is_active() -> None:
    h = Harness()
    with_queue(h, "B")
    assert rejected(h.dequeue("B", run_id="r-gone"))[0] == "run_not_active"
    run = h.state.active
    assert run is not None
    assert tokens(h.dequeue("B", run_id=run.run_id)) == ["run.dequeued:dequeued"]


def test_a_pending_follow_up_is_the_runs_not_the_queues() -> None:
    h = Harness()
    leased(h)
    h.do("follow_up", {"text": "f", "on_run_end": "queue"}, command_id="F")
    reason, status, _ = rejected(h.dequeue("F"))
    assert (reason, status) == ("not_queued", "pending")
    # once its run ends without it, it waits as a task of its own: removable
    h.work("run.fail", {"error": "x"})
    assert waiting(h) == []  # it started at once (nothing else waited)
    assert h.state.active is not None and h.state.active.source_command_id == "F"


def test_queued_follow_ups_are_tasks_and_removable() -> None:
    h = Harness()
    cancelling(h)
    assert tokens(h.follow_up("later")) == ["run.queued"]
    fid = h.commands[-1].command_id
    events = h.dequeue(fid)
    assert tokens(events) == ["run.dequeued:dequeued"]
    assert events[0].payload.model_dump()["kind"] == "follow_up"


def test_a_requeued_follow_up_is_removable_by_its_own_id() -> None:
    h = Harness()
    with_queue(h, "B")
    h.do("follow_up", {"text": "f", "on_run_end": "queue"}, command_id="F")
    h.work("run.fail", {"error": "x"})  # F re-queued behind B; B starts
    assert waiting(h) == ["F"]
    assert tokens(h.dequeue("F")) == ["run.dequeued:dequeued"]


def test_clear_queue_removes_every_task_in_queue_order_then_refuses_an_empty_queue() -> None:
    h = Harness()
    with_queue(h, "B", "C")
    h.prompt("now", "interrupt", command_id="I", actor="user:cy")  # at the front
    events = h.clear_queue(actor="user:bo")
    assert tokens(events) == ["run.dequeued:cleared"] * 3
    got = [e.payload.model_dump() for e in events]
    assert [(p["source_command_id"], p["queued_by"], p["actor"]) for p in got] == [
        ("I", "user:cy", "user:bo"),
        ("B", "user:ana", "user:bo"),
        ("C", "user:ana", "user:bo"),
    ]
    assert h.state.queue == ()
    assert rejected(h.clear_queue())[0] == "queue_empty"
    reason, status, _ = rejected(h.dequeue("C"))
    assert (reason, status) == ("not_queued", "cleared")


def test_clear_queue_on_an_idle_session_is_refused() -> None:
    h = Harness()
    assert rejected(h.clear_queue())[0] == "queue_empty"


def test_removing_tasks_frees_their_room() -> None:
    h = Harness(DeciderConfig(max_queue=1))
    with_queue(h, "B")
    assert rejected(h.prompt("c", "enqueue"))[0] == "queue_full"
    h.dequeue("B")
    assert tokens(h.prompt("c", "enqueue")) == ["run.queued"]


def test_the_removed_tasks_remembered_are_bounded() -> None:
    h = Harness(DeciderConfig(finished_window=2))
    with_queue(h, "B", "C", "D")
    h.clear_queue()
    assert [r.source_command_id for r in h.state.removed] == ["C", "D"]
    assert rejected(h.dequeue("B"))[1] == "unknown"  # forgotten: said so


# -- labels ------------------------------------------------------------------------------------


LABELS = {"team": "growth", "ticket/id": "T-1"}


def test_a_prompts_labels_are_on_its_run_and_a_queued_task_keeps_them_until_it_starts() -> None:
    h = Harness()
    started = h.do("prompt", {"text": "a", "metadata": LABELS})
    assert started[0].payload.model_dump()["metadata"] == LABELS
    h.acquire()
    queued = h.do("prompt", {"text": "b", "policy": "enqueue", "metadata": {"team": "ops"}})
    assert queued[0].payload.model_dump()["metadata"] == {"team": "ops"}
    assert h.state.queue[0].metadata == {"team": "ops"}
    nxt = h.work("run.complete")
    assert nxt[-1].payload.model_dump()["metadata"] == {"team": "ops"}


def test_a_retry_carries_its_own_labels_not_the_retried_runs() -> None:
    h = Harness()
    h.do("prompt", {"text": "a", "metadata": LABELS})
    h.acquire()
    h.work("run.fail", {"error": "x", "retryable": True})
    retry = h.do("prompt", {"text": "a", "retry_of": h.last_run})
    assert retry[0].payload.model_dump()["metadata"] is None


def test_runs_started_otherwise_carry_no_labels() -> None:
    h = Harness()
    assert h.send()[0].payload.model_dump()["metadata"] is None


def _prompt(payload: dict[str, Any], **kw: Any) -> Command:
    return Command(
        command_id="c1",
        session_id="acme:s1",
        tenant_id="acme",
        type="prompt",
        ts=1,
        payload=payload,
        **kw,
    )


def test_a_prompt_without_labels_digests_as_it_did_before_the_field() -> None:
    # digests computed by the version before labels existed
    plain = _prompt({"text": "hello"})
    assert command_digest(plain) == 2532022699907185365
    assert command_digest(_prompt({"text": "hello", "metadata": {}})) == 2532022699907185365
    full = _prompt(
        {"text": "hello", "policy": "enqueue", "input": {"a": 1}, "approval_kinds": ["payment"]},
        actor="user:ana",
    )
    assert command_digest(full) == 3635656109402434961
    # labels, when present, are part of it: the same id with other labels is another command
    a = command_digest(_prompt({"text": "hello", "metadata": {"k": "v"}}))
    b = command_digest(_prompt({"text": "hello", "metadata": {"k": "w"}}))
    assert len({a, b, command_digest(plain)}) == 3


def test_the_same_id_with_other_labels_is_refused_command_id_reused() -> None:
    h = Harness()
    h.do("prompt", {"text": "a", "metadata": {"k": "v"}}, command_id="p1")
    events = h.do("prompt", {"text": "a", "metadata": {"k": "w"}}, command_id="p1")
    assert rejected(events)[0] == "command_id_reused"


@pytest.mark.parametrize(
    "labels",
    [
        {f"k{i}": "v" for i in range(17)},  # 17 keys
        {"": "v"},
        {"k" * 65: "v"},
        {"team:x": "v"},  # ':' separates key and value in a search
        {"a b": "v"},
        {"é": "v"},
        {"k": "v" * 257},
    ],
)
def test_labels_beyond_their_bounds_are_no_command(labels: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        _prompt({"text": "x", "metadata": labels})


def test_labels_at_their_bounds_are_a_command() -> None:
    labels = {f"k{i:02d}" + "x" * 61: "v" * 256 for i in range(16)}
    assert all(len(k) == 64 for k in labels)
    c = _prompt({"text": "x", "metadata": labels})
    assert c.payload.model_dump()["metadata"] == labels


def test_no_timer_is_set_by_queue_control() -> None:
    h = Harness()
    with_queue(h, "B")
    before = due_timers(h.state)
    h.dequeue("B")
    assert due_timers(h.state) == before
