"""`SessionClient.collect` settles a command at its events partition's last stable offset,
read after the command's first event arrived (before then it may stop short of the
transaction's commit marker, and the outcome would miss events). The reads are asked in
one round and answered in a later one, and the rule must survive that: an answer asked
before a command's events arrived never settles it.

The broker's answers are stood in for by futures the test resolves (this is the client's
bookkeeping; the integration test
`test_collected_outcomes_hold_every_event_of_their_command_while_others_commit` checks the
same on the real broker)."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any, cast

from confluent_kafka import KafkaError, KafkaException

from schemas.events import Event
from sessionstream.client import CommandHandle, SessionClient, _key
from sessionstream.settings import Settings


class Client(SessionClient):
    """The client with its last-stable-offset requests recorded instead of sent."""

    def __init__(self) -> None:
        super().__init__("t", Settings())
        self.asked: list[dict[int, Future[Any]]] = []
        self.fallback: list[set[int]] = []

    def _ask_offsets(self, partitions: set[int], *, committed: bool) -> dict[int, Future[Any]]:
        assert committed
        futures: dict[int, Future[Any]] = {p: Future() for p in partitions}
        self.asked.append(futures)
        return futures

    def _hwms(self, partitions: set[int], *, committed: bool = False) -> dict[int, int]:
        assert committed
        self.fallback.append(set(partitions))
        return dict.fromkeys(partitions, 99)

    def handle(self, sid: str, partition: int) -> CommandHandle:
        h = CommandHandle(self.command(sid, "prompt", {"text": "x"}), partition=partition)
        h.acked, h.offset = True, 0
        self._pending[_key(h)] = []
        return h

    def events_arrive(self, h: CommandHandle) -> None:
        # only that some event arrived matters here
        self._pending[_key(h)].append(cast(Event, object()))

    def round(self, handles: list[CommandHandle]) -> None:
        self._round_no += 1
        self._settle_points(handles)

    def settle_at(self, h: CommandHandle) -> int | None:
        w = self._waits.get(_key(h))
        return None if w is None else w.settle_at


def answer(futures: dict[int, Future[Any]], offset: int) -> None:
    for f in futures.values():
        f.set_result(SimpleNamespace(offset=offset))


def test_nothing_is_asked_for_commands_without_events() -> None:
    c = Client()
    c.round([c.handle("a", 0), c.handle("b", 1)])
    assert c.asked == []


def test_an_answer_settles_the_commands_whose_events_came_before_it_was_asked() -> None:
    c = Client()
    a, b = c.handle("a", 0), c.handle("b", 1)
    c.events_arrive(a)
    c.events_arrive(b)
    c.round([a, b])
    assert len(c.asked) == 1 and set(c.asked[0]) == {0, 1}  # one request for both
    assert c.settle_at(a) is None  # asked, not answered: the round goes on
    c.round([a, b])
    assert len(c.asked) == 1  # in flight, not asked twice
    answer(c.asked[0], 10)
    c.round([a, b])
    assert (c.settle_at(a), c.settle_at(b)) == (10, 10)


def test_an_answer_asked_before_a_commands_events_arrived_does_not_settle_it() -> None:
    c = Client()
    early, late = c.handle("early", 0), c.handle("late", 0)
    c.events_arrive(early)
    c.round([early, late])  # asks for `early`
    first = c.asked[0]
    c.events_arrive(late)
    c.round([early, late])  # `late`'s events came after that ask: a new one
    assert len(c.asked) == 2
    second = c.asked[1]
    answer(first, 10)  # read before `late`'s marker was certain
    c.round([early, late])
    assert c.settle_at(early) == 10
    assert c.settle_at(late) is None
    answer(second, 12)
    c.round([early, late])
    assert c.settle_at(late) == 12


def test_a_failed_answer_is_read_again_at_once_with_the_fallback() -> None:
    c = Client()
    h = c.handle("a", 2)
    c.events_arrive(h)
    c.round([h])
    for f in c.asked[0].values():
        f.set_exception(KafkaException(KafkaError(KafkaError._TIMED_OUT, "no answer")))
    c.round([h])
    assert c.fallback == [{2}]
    assert c.settle_at(h) == 99
    assert len(c.asked) == 1


def test_answers_nobody_waits_for_are_let_go() -> None:
    c = Client()
    h = c.handle("a", 0)
    c.events_arrive(h)
    c.round([h])
    c.release(h)  # its wait ended (timed out, or settled by `wait`)
    answer(c.asked[0], 5)
    c.round([])
    assert c._lso_asks == []


def test_a_request_refused_before_it_was_sent_is_read_at_once() -> None:
    class Refusing(Client):
        def _ask_offsets(self, partitions: set[int], *, committed: bool) -> dict[int, Future[Any]]:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "no broker"))

    c = Refusing()
    h = c.handle("a", 3)
    c.events_arrive(h)
    c.round([h])
    assert c.fallback == [{3}]
    assert c.settle_at(h) == 99
    assert c._lso_asks == []
