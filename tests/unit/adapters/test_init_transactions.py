"""The processor's patience with init_transactions: a restarted broker that is still
loading its transaction coordinator is asked again; anything else stops it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from sessionstream.adapters.kafka import TransactionalProducer
from sessionstream.adapters.kafka.transactions import Stopping, init_transactions
from sessionstream.errors import KafkaUnavailable


class Answers:
    """Producers (the adapter's client around a stand-in driver) whose init_transactions
    answer from a shared script (None: success)."""

    def __init__(self, *answers: KafkaError | None) -> None:
        self.answers = list(answers)
        self.made: list[Answers.Producer] = []

    class Producer:
        def __init__(self, script: Answers) -> None:
            self.script, self.calls = script, 0
            self.timeouts: list[float] = []

        def init_transactions(self, timeout: float) -> None:
            self.calls += 1
            self.timeouts.append(timeout)
            answer = self.script.answers.pop(0)
            if answer is not None:
                raise KafkaException(answer)

    def make(self) -> TransactionalProducer:
        self.made.append(Answers.Producer(self))
        return TransactionalProducer(self.made[-1])  # type: ignore[arg-type]


def load_in_progress(retriable: bool) -> KafkaError:
    return KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, "loading", retriable=retriable)


def test_a_retriable_answer_is_asked_again_by_the_same_producer() -> None:
    a = Answers(load_in_progress(True), KafkaError(KafkaError._TIMED_OUT, retriable=True), None)
    got = init_transactions(a.make, 600, bootstrap="b")
    assert got.driver is a.made[0] and len(a.made) == 1 and a.made[0].calls == 3
    # patient: short steps, so that a stop is noticed
    assert a.made[0].timeouts == [10, 10, 10]


def test_a_busy_coordinator_not_marked_retriable_gets_a_new_producer() -> None:
    # seen after a broker restart under load: COORDINATOR_LOAD_IN_PROGRESS after 60 s
    a = Answers(load_in_progress(False), None)
    got = init_transactions(a.make, 600, bootstrap="b")
    assert len(a.made) == 2 and got.driver is a.made[1]


def test_without_patience_the_first_failure_stops_the_processor() -> None:
    a = Answers(load_in_progress(True))
    with pytest.raises(KafkaUnavailable, match="init_transactions failed"):
        init_transactions(a.make, 0, bootstrap="b")


@pytest.mark.parametrize(
    "error",
    [
        KafkaError(KafkaError._FENCED, "fenced", fatal=True),
        KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "denied"),
    ],
)
def test_other_errors_stop_it_at_once(error: KafkaError) -> None:
    a = Answers(error, None)
    with pytest.raises(KafkaUnavailable):
        init_transactions(a.make, 600, bootstrap="b")
    assert len(a.made) == 1 and a.made[0].calls == 1


def test_a_stop_during_the_wait_ends_it() -> None:
    stop = threading.Event()
    stop.set()
    a = Answers(load_in_progress(True), None)
    with pytest.raises(Stopping):
        init_transactions(a.make, 600, bootstrap="b", stop=stop)
    assert a.made[0].calls == 1


def test_without_patience_one_call_of_60_s() -> None:
    a = Answers(None)
    init_transactions(a.make, 0, bootstrap="b")
    assert a.made[0].timeouts == [60]


def _starting_processor(monkeypatch: pytest.MonkeyPatch, init: Callable[..., object]) -> Any:
    """A processor whose start() finds its topics and gets its producers from `init` (in
    place of `init_transactions`)."""
    from types import SimpleNamespace

    from sessionstream.runtimes.processor import loop
    from sessionstream.settings import Settings

    s = Settings(schema_registry_url="")  # no registry: the test needs no stack
    monkeypatch.setattr(loop, "ensure_topics", lambda settings: [])
    monkeypatch.setattr(
        loop,
        "check_topics",
        lambda settings, **_: SimpleNamespace(partitions={s.commands_topic: 4}),
    )
    monkeypatch.setattr(loop, "init_transactions", init)
    return loop.TransactionalProcessor(s, instance_id="t")


def test_a_starting_processor_waits_for_a_loading_coordinator_and_can_be_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker started just before the processor may still load its transaction
    coordinator: the processor asks for START_PATIENCE_S (not one 60 s call, after which it
    used to exit 2), and SIGTERM (the stop event given to start) ends the wait."""

    from sessionstream.runtimes.processor import loop

    asked: list[tuple[float, threading.Event | None]] = []

    def recording(
        make: object, patience_s: float, *, bootstrap: str, stop: threading.Event | None
    ) -> object:
        asked.append((patience_s, stop))
        raise Stopping("stopped while waiting for the transaction coordinator")

    proc = _starting_processor(monkeypatch, recording)
    stop = threading.Event()
    with pytest.raises(Stopping):
        proc.start(stop)
    assert [stopper for _, stopper in asked] == [stop]
    assert asked[0][0] == pytest.approx(loop.START_PATIENCE_S, abs=1.0)
    assert loop.START_PATIENCE_S >= 120


def test_the_second_producer_waits_out_what_is_left_of_one_patience(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cold broker's coordinators are awaited once for both producers (not 2 x 300 s),
    and a second producer that cannot start leaves the first flushed, not dangling."""
    from types import SimpleNamespace

    from sessionstream.runtimes.processor import loop

    clock = [1000.0]
    # the loop module's own clock only: other threads keep the real one
    monkeypatch.setattr(
        loop,
        "time",
        SimpleNamespace(monotonic=lambda: clock[0], perf_counter=time.perf_counter, time=time.time),
    )
    first = SimpleNamespace(flushed=0)
    first.flush = lambda timeout: setattr(first, "flushed", first.flushed + 1) or 0
    asked: list[float] = []

    def recording(
        make: object, patience_s: float, *, bootstrap: str, stop: threading.Event | None
    ) -> object:
        asked.append(patience_s)
        if len(asked) == 1:
            clock[0] += 250.0  # the first coordinator took 250 s to load
            return first
        raise KafkaUnavailable("init_transactions failed: timed out", bootstrap="b")

    proc = _starting_processor(monkeypatch, recording)
    with pytest.raises(KafkaUnavailable):
        proc.start(threading.Event())
    assert asked == [loop.START_PATIENCE_S, loop.START_PATIENCE_S - 250.0]
    assert first.flushed == 1 and proc._producers == []
