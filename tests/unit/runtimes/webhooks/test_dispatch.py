"""The dispatcher with a scripted `send`: order per endpoint and session, the endpoint's
slots, retries, dead letters, the backlog bound, and what closing a partition leaves."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict

import pytest

from sessionstream.runtimes.webhooks.backoff import RetryPolicy
from sessionstream.runtimes.webhooks.dispatch import DeadLetter, Dispatcher, Job, Outcome, Target
from sessionstream.runtimes.webhooks.ledger import Ledger

A = Target("wh_a", "http://a.example/", b"k" * 32)
B = Target("wh_b", "http://b.example/", b"k" * 32)
FAST = RetryPolicy(attempts=50, first_s=0.001, max_s=0.002)


def job(offset: int, session: str, partition: int = 0) -> Job:
    return Job(partition, offset, f"{session}/r/{offset:010d}", session, "run.started", b"{}")


class Script:
    """A fake `send`: records calls, answers by a rule, counts what runs at once."""

    def __init__(self, rule=lambda t, j, n: Outcome(True, 200)) -> None:  # type: ignore[no-untyped-def]
        self.rule = rule
        self.calls: list[tuple[str, str]] = []
        self.ok: dict[tuple[str, str], list[int]] = defaultdict(list)
        self.now: dict[str, int] = defaultdict(int)
        self.most: dict[str, int] = defaultdict(int)
        self.tries: dict[tuple[str, str], int] = defaultdict(int)

    async def __call__(self, t: Target, j: Job) -> Outcome:
        key = (t.subscription_id, j.session_id)
        # a session's later event is never sent before its earlier ones were delivered
        assert all(o < j.offset for o in self.ok[key])
        self.calls.append((t.subscription_id, j.event_id))
        self.now[t.subscription_id] += 1
        self.most[t.subscription_id] = max(
            self.most[t.subscription_id], self.now[t.subscription_id]
        )
        try:
            await asyncio.sleep(0.001)
            n = self.tries[(t.subscription_id, j.event_id)]
            self.tries[(t.subscription_id, j.event_id)] += 1
            out: Outcome = self.rule(t, j, n)
        finally:
            self.now[t.subscription_id] -= 1
        if out.ok:
            self.ok[key].append(j.offset)
        return out


class Graves:
    def __init__(self) -> None:
        self.dead: list[DeadLetter] = []

    async def __call__(self, d: DeadLetter) -> None:
        self.dead.append(d)


def dispatcher(send: Script, graves: Graves, **kw: object) -> Dispatcher:
    args: dict[object, object] = {"concurrency": 2, "backlog": 1000, **kw}
    return Dispatcher(send, graves, args.pop("policy", FAST), **args)  # type: ignore[arg-type]


async def _submit_all(d: Dispatcher, jobs: list[Job], targets: list[Target]) -> Ledger:
    led = Ledger(0)
    d.open(0, led)
    for j in jobs:
        led.add(j.offset, {t.subscription_id for t in targets})
        d.submit(j, targets)
    return led


def test_flaky_endpoints_get_each_session_in_order_within_their_slots() -> None:
    rnd = random.Random(7)

    def flaky(t: Target, j: Job, n: int) -> Outcome:
        return Outcome(rnd.random() > 0.4, 200 if n else 500, "flaky")

    async def main() -> None:
        send, graves = Script(flaky), Graves()
        d = dispatcher(send, graves)
        jobs = [job(o, f"s{o % 5}") for o in range(60)]
        led = await _submit_all(d, jobs, [A, B])
        await asyncio.wait_for(d.drained(), 10)
        assert graves.dead == []
        for sub in ("wh_a", "wh_b"):
            for s in range(5):
                assert send.ok[(sub, f"s{s}")] == [
                    j.offset for j in jobs if j.session_id == f"s{s}"
                ]
            assert send.most[sub] == 2  # never more than its slots, and they were used
        assert led.position() == (60, "")

    asyncio.run(main())


def test_tries_run_out_into_a_dead_letter_and_the_session_goes_on() -> None:
    def down_for_the_first(t: Target, j: Job, n: int) -> Outcome:
        return Outcome(j.offset != 0, 503 if j.offset == 0 else 200, "HTTP 503: busy")

    async def main() -> None:
        send, graves = Script(down_for_the_first), Graves()
        d = dispatcher(send, graves, policy=RetryPolicy(3, 0.001, 0.002))
        led = await _submit_all(d, [job(0, "s"), job(1, "s")], [A])
        await asyncio.wait_for(d.drained(), 5)
        (dead,) = graves.dead
        assert (dead.job.offset, dead.attempts, dead.last_status) == (0, 3, 503)
        assert dead.last_error == "HTTP 503: busy"
        assert send.calls == [("wh_a", "s/r/0000000000")] * 3 + [("wh_a", "s/r/0000000001")]
        assert led.position() == (2, "")

    asyncio.run(main())


def test_a_final_failure_is_buried_at_once() -> None:
    async def main() -> None:
        send = Script(
            lambda t, j, n: Outcome(False, None, "refused: 127.0.0.1 is loopback", final=True)
        )
        graves = Graves()
        d = dispatcher(send, graves)
        await _submit_all(d, [job(0, "s")], [A])
        await asyncio.wait_for(d.drained(), 5)
        assert [g.attempts for g in graves.dead] == [1] and len(send.calls) == 1

    asyncio.run(main())


def test_a_retry_after_is_waited() -> None:
    waits: list[float] = []

    async def sleep(s: float) -> None:
        waits.append(s)

    async def main() -> None:
        send = Script(lambda t, j, n: Outcome(n > 0, 429, "slow down", retry_after=0.5))
        d = dispatcher(send, Graves(), policy=RetryPolicy(5, 0.001, 60), sleep=sleep)
        await _submit_all(d, [job(0, "s")], [A])
        await asyncio.wait_for(d.drained(), 5)
        assert waits == [0.5]

    asyncio.run(main())


def test_a_failing_endpoint_past_its_backlog_has_new_events_buried() -> None:
    async def main() -> None:
        async def send(t: Target, j: Job) -> Outcome:
            return Outcome(t is B, 200 if t is B else 500, "down")

        graves = Graves()
        # A fails and waits long to retry: its lanes hold their events
        d = Dispatcher(send, graves, RetryPolicy(100, 10, 10), concurrency=1, backlog=2)
        led = Ledger(0)
        d.open(0, led)
        for o in range(5):
            led.add(o, {"wh_a", "wh_b"})
            d.submit(job(o, f"s{o}"), [A, B])
            await asyncio.sleep(0.01)
        assert [(g.subscription_id, g.job.offset) for g in graves.dead] == [
            ("wh_a", 2),
            ("wh_a", 3),
            ("wh_a", 4),
        ]
        assert all("backlog full: 2 events" in g.last_error for g in graves.dead)
        assert not d.saturated()  # a failing endpoint does not hold the others up
        pos = led.position()
        assert pos is not None and pos[0] == 0  # 0 and 1 still wait for A

    asyncio.run(main())


def test_a_healthy_endpoint_past_its_backlog_saturates_instead_of_losing_events() -> None:
    async def main() -> None:
        gate = asyncio.Event()

        async def send(t: Target, j: Job) -> Outcome:
            await gate.wait()  # slow, not failing
            return Outcome(True, 200)

        graves = Graves()
        d = Dispatcher(send, graves, FAST, concurrency=1, backlog=2)
        led = await _submit_all(d, [job(o, f"s{o}") for o in range(5)], [A])
        await asyncio.sleep(0.01)
        assert graves.dead == [] and d.saturated() and d.saturated(0.5)
        gate.set()
        await asyncio.wait_for(d.drained(), 5)
        assert not d.saturated(0.5) and led.position() == (5, "")

    asyncio.run(main())


def test_closing_lets_attempts_in_flight_end_and_leaves_the_retrying_ones() -> None:
    async def main() -> None:
        started = asyncio.Event()

        async def send(t: Target, j: Job) -> Outcome:
            if j.session_id == "slow":
                started.set()
                await asyncio.sleep(0.2)
                return Outcome(True, 200)
            return Outcome(False, 500, "no")  # retried for ever (slowly)

        d = Dispatcher(send, Graves(), RetryPolicy(100, 10, 10), concurrency=4, backlog=100)
        await _submit_all(d, [job(0, "failing"), job(1, "slow"), job(2, "failing")], [A])
        await started.wait()
        pos = await asyncio.wait_for(d.close(0, grace_s=5), 2)
        # 1 answered 2xx while closing: recorded; 0 (and 2 behind it) are not done
        assert pos == (0, '{"r":[[1,1]]}')
        assert not d.owns(0) and d.waiting == 0

    asyncio.run(main())


def test_closing_does_not_wait_past_its_grace() -> None:
    async def main() -> None:
        async def send(t: Target, j: Job) -> Outcome:
            await asyncio.sleep(60)
            return Outcome(True, 200)

        d = Dispatcher(send, Graves(), FAST, concurrency=1, backlog=10)
        await _submit_all(d, [job(0, "s")], [A])
        await asyncio.sleep(0.01)
        assert await asyncio.wait_for(d.close(0, grace_s=0.05), 1) == (0, "")

    asyncio.run(main())


def test_a_deleted_subscription_drops_what_waits_for_it() -> None:
    async def main() -> None:
        send = Script(lambda t, j, n: Outcome(t is B, 500 if t is A else 200, "no"))
        d = dispatcher(send, Graves(), policy=RetryPolicy(100, 0.05, 0.05))
        led = await _submit_all(d, [job(0, "s"), job(1, "s")], [A, B])
        await asyncio.sleep(0.02)
        d.drop("wh_a")
        await asyncio.wait_for(d.drained(), 5)
        assert led.position() == (2, "")
        tried = len(send.calls)
        await asyncio.sleep(0.1)
        assert len(send.calls) == tried  # no more attempts for it

    asyncio.run(main())


@pytest.mark.parametrize("partitions", [1, 3])
def test_partitions_are_independent(partitions: int) -> None:
    async def main() -> None:
        send, graves = Script(), Graves()
        d = dispatcher(send, graves)
        ledgers = {p: Ledger(0) for p in range(partitions)}
        for p, led in ledgers.items():
            d.open(p, led)
        for o in range(12):
            p = o % partitions
            ledgers[p].add(o, {"wh_a"})
            d.submit(job(o, f"p{p}-s{o % 2}", p), [A])
        await asyncio.wait_for(d.drained(), 5)
        assert {p: d.positions()[p][0] for p in ledgers} == {
            p: max(o for o in range(12) if o % partitions == p) + 1 for p in ledgers
        }

    asyncio.run(main())
