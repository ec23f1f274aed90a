"""The processor's watch over a consumer that does not rejoin its group (`_watch_rejoin`),
with stand-in consumers and a stand-in answer from the coordinator: when it asks, what it
takes for stuck, and that a consumer it gave up cannot call back into the processor.

The case it is for was seen in CI (a broker restart: the consumer's partitions revoked, no
JoinGroup ever again). `test_processor.py` reproduces it on the real broker."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from sessionstream.runtimes.processor import failures
from sessionstream.runtimes.processor.loop import TransactionalProcessor
from sessionstream.settings import Settings


class StandInConsumer:
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()


@pytest.fixture
def proc(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> TransactionalProcessor:
    p = TransactionalProcessor(Settings(store_dir=tmp_path), instance_id="unit")
    p._consumer = StandInConsumer("first")  # type: ignore[assignment]
    made: list[str] = []

    def group_consumer() -> Any:
        made.append("new")
        p._callbacks()  # what the real one does: a new consumer holds nothing yet
        return StandInConsumer(f"new-{len(made)}")

    monkeypatch.setattr(p, "_group_consumer", group_consumer)
    return p


def coordinator(monkeypatch: pytest.MonkeyPatch, answer: set[str] | None) -> list[str]:
    """The coordinator's answer to `static_members`; returns the groups asked about."""
    asked: list[str] = []

    def members(config: Any, group: str, **kw: Any) -> set[str] | None:
        asked.append(group)
        return answer

    monkeypatch.setattr(failures, "static_members", members)
    return asked


def unassigned_for(p: TransactionalProcessor, seconds: float) -> None:
    p._unassigned_since = time.monotonic() - seconds


def test_an_assigned_consumer_is_never_asked_about(
    proc: TransactionalProcessor, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = coordinator(monkeypatch, set())
    proc._unassigned_since = None
    proc._watch_rejoin()
    assert asked == []


def test_the_coordinator_is_asked_only_after_the_check_interval(
    proc: TransactionalProcessor, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = coordinator(monkeypatch, {"processor-unit"})
    unassigned_for(proc, failures.REJOIN_CHECK_S - 5)
    proc._watch_rejoin()
    assert asked == []
    unassigned_for(proc, failures.REJOIN_CHECK_S + 1)
    proc._watch_rejoin()
    proc._watch_rejoin()  # asked again only after another interval
    assert asked == [proc.settings.processor_group]


@pytest.mark.parametrize(
    "answer",
    [{"processor-unit", "processor-other"}, None],
    ids=["listed: waiting in a rebalance", "no answer: a broker still restarting"],
)
def test_a_listed_member_or_no_answer_keeps_the_consumer(
    proc: TransactionalProcessor, monkeypatch: pytest.MonkeyPatch, answer: set[str] | None
) -> None:
    coordinator(monkeypatch, answer)
    first = proc._consumer
    unassigned_for(proc, 300)
    proc._watch_rejoin()
    assert proc._consumer is first


def test_a_member_the_coordinator_does_not_list_gets_a_new_consumer(
    proc: TransactionalProcessor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # another instance's id is listed, not ours
    coordinator(monkeypatch, {"processor-unit-2"})
    first: Any = proc._consumer
    unassigned_for(proc, failures.REJOIN_CHECK_S + 1)
    proc._watch_rejoin()
    assert proc._consumer is not first
    assert first.closed.wait(5), "the given-up consumer is closed (on a thread of its own)"
    # the new consumer's time without partitions counts from its making
    assert proc._unassigned_since is not None
    assert time.monotonic() - proc._unassigned_since < 5


def test_a_given_up_consumer_cannot_call_back(proc: TransactionalProcessor) -> None:
    calls: list[str] = []
    proc._on_assign = lambda c, parts: calls.append("assign")  # type: ignore[method-assign]
    proc._on_revoke = lambda c, parts: calls.append("revoke")  # type: ignore[method-assign]
    callbacks = proc._callbacks()
    current = proc._consumer
    callbacks["on_assign"](current, [])  # type: ignore[arg-type]
    assert calls == ["assign"] and proc._unassigned_since is None
    callbacks["on_revoke"](current, [])  # type: ignore[arg-type]
    assert calls == ["assign", "revoke"] and proc._unassigned_since is not None
    given_up = StandInConsumer("given up")
    callbacks["on_assign"](given_up, [])  # type: ignore[arg-type]
    callbacks["on_revoke"](given_up, [])  # type: ignore[arg-type]
    callbacks["on_lost"](given_up, [])  # type: ignore[arg-type]
    assert calls == ["assign", "revoke"]


def test_after_a_loss_the_producers_made_before_it_are_renewed_once_assigned(
    proc: TransactionalProcessor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lost assignment (the consumer's session timed out: a broker restart) renews the
    producers made before it, in the callback of the next assignment, before any
    transaction on it; not while unassigned (the broker may still be loading), not a
    producer made after the loss, not after a plain revoke, and only once."""
    renewed: list[int] = []
    monkeypatch.setattr(
        proc, "_transactional_producer", lambda slot, patience_s=0.0: renewed.append(slot)
    )
    proc._producers = [object(), object()]  # type: ignore[list-item]
    proc._on_assign = lambda c, parts: None  # type: ignore[method-assign]
    proc._on_revoke = lambda c, parts: None  # type: ignore[method-assign]
    callbacks = proc._callbacks()
    current = proc._consumer
    proc._born = {0: time.monotonic() - 60, 1: time.monotonic() - 60}
    callbacks["on_assign"](current, [])  # type: ignore[arg-type]
    callbacks["on_revoke"](current, [])  # type: ignore[arg-type]
    callbacks["on_assign"](current, [])  # type: ignore[arg-type]
    assert renewed == [], "a plain revoke is a rebalance, not a broker fault"

    callbacks["on_lost"](current, [])  # type: ignore[arg-type]
    proc._born[1] = time.monotonic() + 1  # made after the loss
    proc._watch_rejoin()
    assert renewed == [], "not while unassigned"
    callbacks["on_assign"](current, [])  # type: ignore[arg-type]
    assert renewed == [0]
    callbacks["on_revoke"](current, [])  # type: ignore[arg-type]
    callbacks["on_assign"](current, [])  # type: ignore[arg-type]
    assert renewed == [0]
