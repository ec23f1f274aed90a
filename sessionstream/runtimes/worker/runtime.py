"""The worker process: finds runs that need a holder, competes for them, executes them.

`Worker(settings, handler, worker_id).run()` — see docs/workers.md for the protocol. The
asyncio loop owns all run state; the Kafka consumers live on their own threads and only
hand records over (`_feed.py`).

Discovery without a consumer group: every worker reads the whole `session.open-runs` topic
(the runs that need a holder, written by the processor) and every worker's presence
(`session.workers`). For each open run the live workers with room rank themselves by
rendezvous hashing of (run, generation, worker); the first sends `lease.acquire` at once,
the k-th waits k acquire steps and sends it only if the run is still open by then. A run
whose holder died is therefore taken as soon as its lease expires, by one worker, wherever
its partition sits; a dead first-ranked worker costs one step.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

from sessionstream.adapters import metrics
from sessionstream.adapters.kafka import (
    CommandProducer,
    Message,
    new_command_producer,
    produce,
    unavailable,
)
from sessionstream.adapters.postgres.step_store import PostgresStepStore
from sessionstream.adapters.registry import attach_registry
from sessionstream.adapters.topics import command_topic
from sessionstream.errors import KafkaFailed, SessionstreamError
from sessionstream.runtimes.worker._deltas import DeltaBuffer, DeltaKey
from sessionstream.runtimes.worker._execution import Execution, RunSpec
from sessionstream.runtimes.worker._feed import ControlFeed, OpenRunsFeed, PresenceFeed
from sessionstream.runtimes.worker._handler import Handler, check_handler
from sessionstream.runtimes.worker._steps import StepStore
from sessionstream.runtimes.worker.executor import ActionExecutor
from sessionstream.runtimes.worker.model import FakeModel, Model
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.commands import Command
from sessionstream.schemas.discovery import OpenRun, WorkerPresence
from sessionstream.schemas.events import Event
from sessionstream.settings import Settings

__all__ = ["Worker", "default_worker_id", "rank"]

log = logging.getLogger("sessionstream.worker")

#: a worker whose presence is older than this many of its intervals is taken for dead
PRESENCE_TTL_INTERVALS = 3


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def rank(run: OpenRun, workers: list[str]) -> list[str]:
    """Rendezvous order of `workers` for `run` (at its generation): the same on every
    worker that sees the same set, different per run, so runs spread over workers."""

    def score(w: str) -> bytes:
        key = f"{run.run_id}/{run.generation}/{w}".encode()
        return hashlib.blake2b(key, digest_size=8).digest()

    return sorted(workers, key=score, reverse=True)


@dataclass
class _Open:
    run: OpenRun
    partition: int
    seen_at: float  # monotonic


class Worker:
    """Executes runs with `handler`, an `async def run(ctx)` (anything else is refused
    here with a ConfigurationError); one per process (or several, with distinct ids)."""

    def __init__(
        self,
        settings: Settings,
        handler: Handler,
        worker_id: str | None = None,
        *,
        model: Model | None = None,
        lease_ms: int | None = None,
        database_url: str | None = None,
        cancel_grace_s: float = 2.0,
        acquire_timeout_s: float = 30.0,
        capacity: int = 100,
        presence_interval_s: float = 1.0,
        acquire_step_s: float = 0.3,
        step_store: StepStore | None = None,
    ) -> None:
        self.settings = settings
        # refused here, before any run is taken, rather than on each run it would fail
        self.handler = check_handler(handler)
        self.worker_id = worker_id or default_worker_id()
        self.model: Model = model or FakeModel()
        #: where step results over the inline bound go: `step_store`, else PostgreSQL's
        #: `step_results` when there is a database (opened by `run`); None: not durable
        self.step_store = step_store
        self._own_store: PostgresStepStore | None = None
        self.lease_ms = lease_ms or settings.worker_lease_ms
        self.max_payload_bytes = settings.max_payload_bytes
        self.cancel_grace_s = cancel_grace_s
        self.acquire_timeout_s = acquire_timeout_s
        self.capacity = capacity
        self.presence_interval_s = presence_interval_s
        self.acquire_step_s = acquire_step_s
        if database_url is None:
            conninfo = settings.database_conninfo if settings.database_url else ""
        else:
            conninfo = database_url
        self.executor: ActionExecutor | None = (
            ActionExecutor(conninfo, settings.database_schema) if conninfo else None
        )
        self.codec = Codec()
        self.executions: dict[str, Execution] = {}
        self._open: dict[str, _Open] = {}  # session id -> its open run
        self._presence: dict[str, tuple[WorkerPresence, int]] = {}  # worker -> (record, ms)
        self._consider_scheduled = False
        self._timers: dict[str, asyncio.TimerHandle] = {}  # run id -> its ranked wait
        self._producer: CommandProducer | None = None
        #: token deltas of streaming model calls (`delta`), published every interval
        self.delta_interval_s = settings.worker_delta_interval_ms / 1000
        self.deltas = DeltaBuffer(self._send_delta)
        self._delta_error_at = 0.0
        self._tasks: set[asyncio.Task[None]] = set()
        self.ready = asyncio.Event()
        #: what ended a background task of `run` (the producer's pump, the presence beat)
        self.failure: BaseException | None = None

    # -- lifecycle ----------
    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Until `stop` is set; then running runs are released for other workers. A
        background task or feed that fails (the producer turned fatal, a consumer's fatal
        error) stops the worker the same way, and `run` then raises its error
        (`KafkaUnavailable` for Kafka's)."""
        loop = asyncio.get_running_loop()
        stop = stop or asyncio.Event()
        if self.executor is not None:
            await self.executor.open()
            if self.step_store is None:
                self._own_store = PostgresStepStore(
                    self.executor.database_url, self.executor.schema
                )
                await self._own_store.open()
                self.step_store = self._own_store
        # this version's command schema id, once (the events it reads are looked up by id)
        await asyncio.to_thread(
            functools.partial(
                attach_registry,
                self.codec,
                self.settings,
                writes=("command",),
                topics=(self.settings.worker_commands_topic,),
            )
        )
        self._producer = new_command_producer(self.settings, **{"linger.ms": 0})
        self.control = ControlFeed(self.settings, loop, self._on_control_event, self.codec)
        self.open_runs = OpenRunsFeed(self.settings, loop, self._on_open_run)
        self.presence = PresenceFeed(self.settings, loop, self._on_presence)
        for feed in (self.control, self.presence, self.open_runs):
            feed.on_failure = functools.partial(self._feed_failed, loop, stop)
            feed.start()
        self._publish_presence()
        log.info(
            "worker %s consuming %s (open runs) and %s",
            self.worker_id,
            self.settings.open_runs_topic,
            self.settings.events_topic,
        )
        pump = asyncio.create_task(self._pump_producer(), name="producer pump")
        beat = asyncio.create_task(self._presence_loop(), name="presence")
        ready = asyncio.create_task(self._await_ready(), name="ready")
        background = [pump, beat, ready]
        if self.delta_interval_s > 0:
            background.append(asyncio.create_task(self._delta_loop(), name="token deltas"))
        for t in background:
            t.add_done_callback(functools.partial(self._background_ended, stop))
        try:
            await stop.wait()
        finally:
            for t in background:
                t.cancel()
            await self._shutdown()
        if self.failure is not None:
            if isinstance(self.failure, KafkaFailed):
                raise unavailable("the worker failed", self.failure, self.settings) from (
                    self.failure
                )
            raise self.failure

    def _feed_failed(
        self, loop: asyncio.AbstractEventLoop, stop: asyncio.Event, error: BaseException
    ) -> None:
        """On a feed's thread: the feed ended with `error` (logged there); the worker
        stops as on SIGTERM, and `run` raises the error."""

        with contextlib.suppress(RuntimeError):  # the loop has closed: run has returned
            loop.call_soon_threadsafe(self._stop_on, stop, error)

    def _background_ended(self, stop: asyncio.Event, task: asyncio.Task[None]) -> None:
        """A background task ended. They end only when cancelled: one that failed would
        leave the worker silent (no presence) or its deliveries unserved, so it stops
        the worker (its runs are released) rather than run on without it."""
        error = None if task.cancelled() else task.exception()
        if error is None:
            return
        log.critical(
            "the worker's %s task failed; stopping the worker", task.get_name(), exc_info=error
        )
        self._stop_on(stop, error)

    def _stop_on(self, stop: asyncio.Event, error: BaseException) -> None:
        """Stop the worker for `error` (the first one is what `run` raises)."""
        if self.failure is None:
            self.failure = error
        stop.set()

    async def _await_ready(self) -> None:
        while not (self.open_runs.caught_up.is_set() and self.presence.caught_up.is_set()):
            await asyncio.sleep(0.02)
        self.ready.set()
        log.info(
            "worker %s ready: %s open runs, %s other workers present",
            self.worker_id,
            len(self._open),
            len(set(self._presence) - {self.worker_id}),
        )
        self._schedule_consider()

    async def _shutdown(self) -> None:
        self.ready.clear()  # no run is taken any more
        for ex in list(self.executions.values()):
            with self._unsent("a lease release"):
                ex.release("worker shutting down")
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=5)
            # still waiting (e.g. for a grant from a broker that is down): their releases
            # were sent; they end here rather than be destroyed with the loop
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=2)
        for handle in self._timers.values():
            handle.cancel()
        with self._unsent("the presence tombstone"):
            self._publish_presence(leaving=True)
        for feed in (self.open_runs, self.presence, self.control):
            feed.close()
        if self._producer is not None:
            # a producer that turned fatal has nothing more to deliver
            with contextlib.suppress(KafkaFailed, SystemError):
                await asyncio.to_thread(self._producer.flush, 10)
        if self.executor is not None:
            await self.executor.close()
        if self._own_store is not None:
            await self._own_store.close()
        log.info("worker %s stopped", self.worker_id)

    @contextlib.contextmanager
    def _unsent(self, what: str) -> Iterator[None]:
        """At shutdown after the producer failed: what cannot be sent is logged, and the
        shutdown goes on (the leases then expire on their own)."""
        try:
            yield
        except SessionstreamError as e:  # KafkaFailed among them
            log.warning("%s was not sent: %s", what, e)

    async def _pump_producer(self) -> None:
        while True:
            assert self._producer is not None
            # a fatal error raises KafkaFailed (named as itself, not as a SystemError)
            self._producer.poll(0)
            await asyncio.sleep(0.02)

    async def _delta_loop(self) -> None:
        while True:
            await asyncio.sleep(self.delta_interval_s)
            self.deltas.flush()

    def delta(self, key: DeltaKey, text: str) -> None:
        """A piece of a streaming answer of one of our runs (`Host.delta`)."""
        if self.delta_interval_s > 0:
            self.deltas.add(key, text)

    def _send_delta(self, partition: int, key: bytes, value: bytes) -> None:
        assert self._producer is not None

        def delivered(err: KafkaFailed | None, _msg: Message) -> None:
            # a view: said at most once a minute (e.g. the topic is missing), never fatal
            if err is not None and time.monotonic() - self._delta_error_at > 60:
                self._delta_error_at = time.monotonic()
                log.warning("token deltas not delivered to %s: %s", self.settings.deltas_topic, err)

        produce(
            self._producer,
            self.settings.deltas_topic,
            key=key,
            value=value,
            partition=partition,
            on_delivery=delivered,
        )

    async def _presence_loop(self) -> None:
        while True:
            await asyncio.sleep(self.presence_interval_s)
            self._publish_presence()

    def _publish_presence(self, *, leaving: bool = False) -> None:
        assert self._producer is not None
        value = None
        if not leaving:
            p = WorkerPresence(
                worker_id=self.worker_id,
                load=len(self.executions),
                capacity=self.capacity,
                interval_ms=int(self.presence_interval_s * 1000),
            )
            value = p.model_dump_json(by_alias=True).encode()
        self._send(self.settings.workers_topic, self.worker_id.encode(), value, "presence")

    def _send(self, topic: str, key: bytes, value: bytes | None, what: str) -> None:
        assert self._producer is not None

        def delivered(err: KafkaFailed | None, _msg: Message) -> None:
            if err is not None:
                log.error("%s not delivered: %s", what, err)

        produce(self._producer, topic, key=key, value=value, on_delivery=delivered)
        self._producer.poll(0)

    def produce(self, cmd: Command) -> None:
        """A command of one of our runs, on the worker-commands topic (murmur2 places it
        on its session's partition)."""
        if cmd.type == "lease.acquire":
            metrics.WORKER_ACQUIRES.inc()
        self._send(
            command_topic(self.settings, cmd.type),
            cmd.session_id.encode(),
            self.codec.encode_command(cmd),
            f"command {cmd.command_id} ({cmd.type})",
        )

    # -- discovery ----------
    def _on_open_run(self, session_id: str, partition: int, run: OpenRun | None) -> None:
        if run is None:
            gone = self._open.pop(session_id, None)
            if gone is not None:
                self._cancel_wait(gone.run.run_id)
            return
        self._open[session_id] = _Open(run, partition, time.monotonic())
        self._schedule_consider()

    def _on_presence(self, worker_id: str, p: WorkerPresence | None, ts_ms: int) -> None:
        if p is None:
            self._presence.pop(worker_id, None)
        else:
            self._presence[worker_id] = (p, ts_ms)

    def live_workers(self) -> list[str]:
        """Workers alive by their last presence (and with room), this one always."""
        now_ms = time.time() * 1000
        out = {self.worker_id}
        for w, (p, ts) in self._presence.items():
            fresh = now_ms - ts <= PRESENCE_TTL_INTERVALS * p.interval_ms
            if fresh and p.load < p.capacity:
                out.add(w)
        return sorted(out)

    def _schedule_consider(self) -> None:
        # after the records already handed over are applied, not after each one
        if not self._consider_scheduled and self.ready.is_set():
            self._consider_scheduled = True
            asyncio.get_running_loop().call_soon(self._consider)

    def _consider(self) -> None:
        self._consider_scheduled = False
        if len(self.executions) >= self.capacity:
            return
        loop = asyncio.get_running_loop()
        live = self.live_workers()
        for o in list(self._open.values()):
            run = o.run
            if run.run_id in self.executions or run.run_id in self._timers:
                continue
            # the holder that lost the lease is most likely gone: it is not ranked
            candidates = [w for w in live if w != run.previous_holder] or live
            order = rank(run, candidates)
            if self.worker_id not in order:
                continue
            wait = order.index(self.worker_id) * self.acquire_step_s
            left = o.seen_at + wait - time.monotonic()
            if left <= 0:
                self._start(o)
            else:
                self._timers[run.run_id] = loop.call_later(left, self._waited, run.run_id)

    def _waited(self, run_id: str) -> None:
        """Our turn came for `run_id`: take it if nobody did meanwhile."""
        self._timers.pop(run_id, None)
        for o in self._open.values():
            if o.run.run_id == run_id and run_id not in self.executions:
                if len(self.executions) < self.capacity:
                    self._start(o)
                return

    def _cancel_wait(self, run_id: str) -> None:
        handle = self._timers.pop(run_id, None)
        if handle is not None:
            handle.cancel()

    def _start(self, o: _Open) -> None:
        r = o.run
        spec = RunSpec(
            r.session_id,
            r.tenant_id,
            r.run_id,
            o.partition,
            r.prompt,
            r.context_ref,
            r.actor,
            r.input,
        )
        ex = Execution(self, spec)
        self.executions[spec.run_id] = ex
        task = asyncio.create_task(ex.main())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def forget(self, ex: Execution) -> None:
        self.deltas.forget(ex.run_id)
        if self.executions.get(ex.run_id) is ex:
            del self.executions[ex.run_id]
            self._schedule_consider()

    # -- execution (control consumer) ----------
    def _on_control_event(self, e: Event, partition: int) -> None:
        ex = self.executions.get(e.run_id)
        if ex is not None:
            ex.on_event(e)
            return
        if e.run_id.startswith("_"):  # the session log: rejections and late gate answers
            for ex in list(self.executions.values()):
                if ex.spec.session_id == e.session_id:
                    ex.on_event(e)
