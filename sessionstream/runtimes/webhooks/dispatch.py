"""Deliveries in flight: per endpoint and session one after the other, per endpoint a few
at once, retried with back-off, then buried as dead letters.

Every (endpoint, session) pair has a *lane*: its events in log order, the head one tried
until it is delivered (2xx) or buried, only then the next. So an endpoint never gets a
session's event before that session's earlier events were delivered or dead-lettered.
Lanes of one endpoint share its slots (`webhooks_concurrency` requests at once); a lane
waiting to retry holds none.

Each endpoint holds at most `webhooks_backlog` events. Past that, what happens depends on
the endpoint: one that is *failing* (its last attempt failed) has the new events buried at
once ("backlog full"), so a dead receiver costs memory and time only up to a bound and the
others go on; one that answers, only not as fast as its events come, makes the dispatcher
*saturated*, and the deliverer stops reading until it has caught up (nothing of a healthy
receiver's is dropped, and a burst is delivered whole, at the receiver's pace).

The dispatcher does no I/O itself: `send` makes an attempt and `bury` records a dead letter
(both given), and each finished delivery is marked in its partition's `Ledger`. Closing a
partition (a rebalance took it, or the process stops) lets the attempts in flight end,
up to a grace period, so an answer a receiver already gave is recorded and not asked for
again by the next owner; then the lanes stop where they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from sessionstream.adapters import metrics
from sessionstream.runtimes.webhooks.backoff import RetryPolicy
from sessionstream.runtimes.webhooks.ledger import Ledger

__all__ = ["DeadLetter", "Dispatcher", "Job", "Outcome", "Target"]

log = logging.getLogger("sessionstream.webhooks")


@dataclass(frozen=True)
class Job:
    """One event to deliver: where it is in the log, its webhook-id and its body."""

    partition: int
    offset: int
    event_id: str
    session_id: str
    event_type: str
    body: bytes
    #: when the broker appended it (epoch ms): the delivery latency starts there
    appended_ms: int = 0


@dataclass(frozen=True)
class Target:
    """Where a job goes: a subscription's id, URL and signing key."""

    subscription_id: str
    url: str
    secret: bytes = field(repr=False)


@dataclass(frozen=True)
class Outcome:
    """One attempt's result. `final`: no retry can help (the URL is refused now, or the
    receiver answered 410 Gone)."""

    ok: bool
    status: int | None = None
    error: str = ""
    retry_after: float | None = None
    final: bool = False


@dataclass(frozen=True)
class DeadLetter:
    """A delivery given up: the last attempt's status and error."""

    subscription_id: str
    job: Job
    attempts: int
    last_status: int | None
    last_error: str


Send = Callable[[Target, Job], Awaitable[Outcome]]
Bury = Callable[[DeadLetter], Awaitable[None]]


class _Lane:
    __slots__ = ("jobs", "partition", "target", "task")

    def __init__(self, target: Target, partition: int) -> None:
        self.target = target
        self.partition = partition
        self.jobs: deque[Job] = deque()
        self.task: asyncio.Task[None] | None = None


class _Partition:
    __slots__ = ("busy", "closing", "idle", "lanes", "ledger")

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.closing = False
        self.lanes: set[tuple[str, int, str]] = set()
        #: sends and burials under way (a close waits for them)
        self.busy = 0
        self.idle = asyncio.Event()
        self.idle.set()


class _Endpoint:
    __slots__ = ("failing", "queued", "slots")

    def __init__(self, concurrency: int) -> None:
        self.slots = asyncio.Semaphore(concurrency)
        self.queued = 0
        #: its last attempt failed (and none succeeded since)
        self.failing = False


class Dispatcher:
    """Lanes of deliveries over the partitions this process owns."""

    def __init__(
        self,
        send: Send,
        bury: Bury,
        policy: RetryPolicy,
        *,
        concurrency: int,
        backlog: int,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rnd: random.Random | None = None,
    ) -> None:
        self._send = send
        self._bury = bury
        self.policy = policy
        self.concurrency = concurrency
        self.backlog = backlog
        self._sleep = sleep
        self._rnd = rnd
        self._partitions: dict[int, _Partition] = {}
        self._lanes: dict[tuple[str, int, str], _Lane] = {}
        self._endpoints: dict[str, _Endpoint] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: deliveries submitted and not finished (`drained` waits for none)
        self._work = 0
        self._drained = asyncio.Event()
        self._drained.set()
        #: the first error a lane died of (a bug): the deliverer stops on it
        self.failure: BaseException | None = None

    # -- partitions ------------------------------------------------------------------------
    def open(self, partition: int, ledger: Ledger) -> None:
        self._partitions[partition] = _Partition(ledger)

    def owns(self, partition: int) -> bool:
        return partition in self._partitions

    def ledger(self, partition: int) -> Ledger:
        return self._partitions[partition].ledger

    @property
    def partitions(self) -> list[int]:
        return sorted(self._partitions)

    async def close(self, partition: int, grace_s: float) -> tuple[int, str] | None:
        """Stop the partition's deliveries: attempts in flight may end (up to `grace_s`),
        the rest stop where they are. Returns what to commit (offset, metadata)."""
        ps = self._partitions.get(partition)
        if ps is None:
            return None
        ps.closing = True
        if ps.busy:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ps.idle.wait(), grace_s)
        tasks = []
        for key in list(ps.lanes):
            lane = self._lanes.pop(key)
            if lane.task is not None:
                lane.task.cancel()
                tasks.append(lane.task)
            self._forget(lane.target.subscription_id, len(lane.jobs))
        await asyncio.gather(*tasks, return_exceptions=True)
        del self._partitions[partition]
        return ps.ledger.position()

    def positions(self) -> dict[int, tuple[int, str]]:
        """What to commit now, per open partition that has read anything."""
        out = {}
        for p, ps in self._partitions.items():
            pos = ps.ledger.position()
            if pos is not None:
                out[p] = pos
        return out

    # -- jobs -------------------------------------------------------------------------------
    def submit(self, job: Job, targets: Iterable[Target]) -> None:
        """Deliver `job` to each target (the ledger already holds it, pending for them)."""
        ps = self._partitions[job.partition]
        for target in targets:
            sub = target.subscription_id
            ep = self._endpoint(sub)
            self._work += 1
            self._drained.clear()
            if ep.queued >= self.backlog and ep.failing:
                error = (
                    f"backlog full: {ep.queued} events wait for this failing endpoint in "
                    "this deliverer (SESSIONSTREAM_WEBHOOKS_BACKLOG)"
                )
                self._spawn(self._overflow(DeadLetter(sub, job, 0, None, error)))
                continue
            # a session's events are on one partition; keyed by both, a lane marks its
            # jobs done in the ledger they were read into whatever happens
            key = (sub, job.partition, job.session_id)
            lane = self._lanes.get(key)
            if lane is None:
                lane = self._lanes[key] = _Lane(target, job.partition)
                ps.lanes.add(key)
            lane.jobs.append(job)
            ep.queued += 1
            metrics.WEBHOOK_BACKLOG.inc()
            if lane.task is None:
                lane.task = self._spawn(self._run(key, lane))

    def drop(self, subscription_id: str) -> None:
        """A deleted subscription: its waiting deliveries are dropped (finished, not sent)."""
        for key in [k for k in self._lanes if k[0] == subscription_id]:
            lane = self._lanes.pop(key)
            if lane.task is not None:
                lane.task.cancel()
            ps = self._partitions.get(lane.partition)
            if ps is not None:
                ps.lanes.discard(key)
                for job in lane.jobs:
                    ps.ledger.done(job.offset, subscription_id)
            self._forget(subscription_id, len(lane.jobs))
        self._endpoints.pop(subscription_id, None)

    def saturated(self, fraction: float = 1.0) -> bool:
        """An endpoint that is not failing holds `fraction` of its backlog or more: reading
        more now would only pile up events for it."""
        limit = self.backlog * fraction
        return any(ep.queued >= limit and not ep.failing for ep in self._endpoints.values())

    async def drained(self) -> None:
        """Until every submitted delivery has finished."""
        await self._drained.wait()

    @property
    def waiting(self) -> int:
        """Deliveries submitted and not finished."""
        return self._work

    async def stop(self) -> None:
        """Cancel whatever still runs (after the partitions were closed)."""
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- internals --------------------------------------------------------------------------
    def _endpoint(self, subscription_id: str) -> _Endpoint:
        ep = self._endpoints.get(subscription_id)
        if ep is None:
            ep = self._endpoints[subscription_id] = _Endpoint(self.concurrency)
        return ep

    def _spawn(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        # a lane that died would hold its partition's offset for ever: say so, and let
        # the process stop (`failure`) rather than go on with deliveries that never end
        log.error("webhooks: a delivery lane failed", exc_info=task.exception())
        if self.failure is None:
            self.failure = task.exception()

    def _forget(self, subscription_id: str, jobs: int) -> None:
        """`jobs` deliveries leave without finishing here (closed, or dropped)."""
        ep = self._endpoints.get(subscription_id)
        if ep is not None:
            ep.queued -= jobs
        metrics.WEBHOOK_BACKLOG.dec(jobs)
        self._finished(jobs)

    def _finished(self, n: int = 1) -> None:
        self._work -= n
        if self._work <= 0:
            self._drained.set()

    async def _overflow(self, dead: DeadLetter) -> None:
        ps = self._partitions.get(dead.job.partition)
        if ps is None or ps.closing:
            self._finished()
            return
        await self._busy(ps, self._buried(dead))
        ps.ledger.done(dead.job.offset, dead.subscription_id)
        self._finished()

    async def _buried(self, dead: DeadLetter) -> None:
        await self._bury(dead)
        metrics.WEBHOOK_DEAD_LETTERS.inc()
        log.warning(
            "webhook %s: dead letter %s (%s) after %s attempt(s): %s",
            dead.subscription_id,
            dead.job.event_id,
            dead.job.event_type,
            dead.attempts,
            dead.last_error,
        )

    async def _busy(self, ps: _Partition, work: Awaitable[None]) -> None:
        ps.busy += 1
        ps.idle.clear()
        try:
            await work
        finally:
            ps.busy -= 1
            if ps.busy == 0:
                ps.idle.set()

    async def _run(self, key: tuple[str, int, str], lane: _Lane) -> None:
        ps = self._partitions[lane.partition]
        sub = lane.target.subscription_id
        ep = self._endpoint(sub)
        while lane.jobs:
            job = lane.jobs[0]
            failures = 0
            while True:
                if ps.closing:
                    return
                async with ep.slots:
                    if ps.closing:
                        return
                    outcome = await self._attempt(ps, lane.target, job)
                ep.failing = not outcome.ok
                if outcome.ok:
                    break
                failures += 1
                if outcome.final or self.policy.gives_up(failures):
                    dead = DeadLetter(sub, job, failures, outcome.status, outcome.error)
                    await self._busy(ps, self._buried(dead))
                    break
                metrics.WEBHOOK_RETRIES.inc()
                delay = self.policy.delay(failures, outcome.retry_after, self._rnd)
                log.info(
                    "webhook %s: %s attempt %s failed (%s); again in %.1fs",
                    sub,
                    job.event_id,
                    failures,
                    outcome.error,
                    delay,
                )
                await self._sleep(delay)
            lane.jobs.popleft()
            ep.queued -= 1
            metrics.WEBHOOK_BACKLOG.dec()
            ps.ledger.done(job.offset, sub)
            self._finished()
        # the lane is empty: it ends (a new job for the pair starts a new one)
        if self._lanes.get(key) is lane:
            del self._lanes[key]
            ps.lanes.discard(key)

    async def _attempt(self, ps: _Partition, target: Target, job: Job) -> Outcome:
        started = time.monotonic()
        ps.busy += 1
        ps.idle.clear()
        try:
            outcome = await self._send(target, job)
        finally:
            ps.busy -= 1
            if ps.busy == 0:
                ps.idle.set()
        metrics.WEBHOOK_ATTEMPT_SECONDS.observe(time.monotonic() - started)
        metrics.WEBHOOK_ATTEMPTS.labels("ok" if outcome.ok else "failed").inc()
        if outcome.ok:
            metrics.WEBHOOK_DELIVERED.inc()
            if job.appended_ms:
                metrics.WEBHOOK_LATENCY.observe(max(0.0, time.time() - job.appended_ms / 1000))
        return outcome
