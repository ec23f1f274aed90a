"""The worker process: discovers startable runs in its partitions and executes them.

`Worker(settings, handler, worker_id).run()` — see docs/workers.md for the protocol. The
asyncio loop owns all run state; the Kafka consumers live on their own threads and only
hand events over (`_feed.py`). Commands are produced with the murmur2 partitioner
(`sessionstream.client.producer_config`), like every other producer of commands.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from dataclasses import dataclass

from confluent_kafka import KafkaError, Producer

from consumers.worker._execution import Execution, Handler, RunSpec
from consumers.worker._feed import ControlFeed, GroupFeed
from consumers.worker.executor import ActionExecutor
from consumers.worker.model import FakeModel, Model
from schemas.codec import Codec
from schemas.commands import Command
from schemas.events import Event, LeaseGranted, RunStarted
from sessionstream.client import producer_config
from sessionstream.settings import Settings
from streams.state import SessionState

__all__ = ["Worker", "default_worker_id"]

log = logging.getLogger("sessionstream.worker")

_STARTABLE = ("running", "compacting")


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class _View:
    """What the group consumer knows of an active run in an assigned partition."""

    spec: RunSpec
    status: str
    owner: str | None


class Worker:
    """Executes runs with `handler`; one per process (or several, with distinct ids)."""

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
        session_timeout_ms: int = 6000,
    ) -> None:
        self.settings = settings
        self.handler = handler
        self.worker_id = worker_id or default_worker_id()
        self.model: Model = model or FakeModel()
        self.lease_ms = lease_ms or settings.worker_lease_ms
        self.cancel_grace_s = cancel_grace_s
        self.acquire_timeout_s = acquire_timeout_s
        self.session_timeout_ms = session_timeout_ms
        url = settings.database_conninfo if database_url is None else database_url
        self.executor: ActionExecutor | None = (
            ActionExecutor(url, settings.database_schema) if url else None
        )
        self.codec = Codec()
        self.executions: dict[str, Execution] = {}
        self._views: dict[str, _View] = {}
        self._assigned: set[int] = set()
        self._consider_scheduled = False
        self._producer: Producer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.ready = asyncio.Event()

    # -- lifecycle ----------
    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Until `stop` is set; then running runs are released for other workers."""
        loop = asyncio.get_running_loop()
        stop = stop or asyncio.Event()
        if self.executor is not None:
            await self.executor.open()
        self._producer = Producer(producer_config(self.settings, **{"linger.ms": 0}))
        self.control = ControlFeed(self.settings, loop, self._on_control_event)
        self.group = GroupFeed(
            self.settings,
            loop,
            self._on_group_event,
            self._on_assign,
            self._on_revoke,
            session_timeout_ms=self.session_timeout_ms,
        )
        self.control.start()
        self.group.start()
        log.info(
            "worker %s consuming %s in group %s",
            self.worker_id,
            self.settings.events_topic,
            self.settings.worker_group,
        )
        pump = asyncio.create_task(self._pump_producer())
        try:
            await stop.wait()
        finally:
            await self._shutdown()
            pump.cancel()

    async def _shutdown(self) -> None:
        for ex in list(self.executions.values()):
            ex.release("worker shutting down")
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5)
        self.group.close()
        self.control.close()
        if self._producer is not None:
            await asyncio.to_thread(self._producer.flush, 10)
        if self.executor is not None:
            await self.executor.close()
        log.info("worker %s stopped", self.worker_id)

    async def _pump_producer(self) -> None:
        while True:
            assert self._producer is not None
            self._producer.poll(0)
            await asyncio.sleep(0.02)

    def produce(self, cmd: Command) -> None:
        assert self._producer is not None

        def delivered(err: KafkaError | None, _msg: object) -> None:
            if err is not None:
                log.error("command %s (%s) not delivered: %s", cmd.command_id, cmd.type, err)

        value = self.codec.encode_command(cmd)
        key = cmd.session_id.encode()
        try:
            self._producer.produce(
                self.settings.commands_topic, key=key, value=value, on_delivery=delivered
            )
        except BufferError:
            self._producer.flush(1)
            self._producer.produce(
                self.settings.commands_topic, key=key, value=value, on_delivery=delivered
            )
        self._producer.poll(0)

    # -- discovery (group consumer) ----------
    def _on_assign(self, partition: int, states: list[SessionState]) -> None:
        self._assigned.add(partition)
        for st in states:
            run = st.active
            if run is None or st.tenant_id is None:
                continue
            spec = RunSpec(
                st.session_id, st.tenant_id, run.run_id, partition, run.prompt, run.context_ref
            )
            self._views[run.run_id] = _View(spec, run.status, run.lease_owner)
        self._schedule_consider()
        self.ready.set()

    def _on_revoke(self, partitions: list[int]) -> None:
        gone = set(partitions)
        self._assigned -= gone
        self._views = {k: v for k, v in self._views.items() if v.spec.partition not in gone}

    def _on_group_event(self, e: Event, partition: int) -> None:
        if partition not in self._assigned:
            return
        t = e.type
        if t == "run.started":
            p = e.payload_as(RunStarted)
            spec = RunSpec(e.session_id, e.tenant_id, e.run_id, partition, p.prompt, p.context_ref)
            self._views[e.run_id] = _View(spec, "running", None)
        view = self._views.get(e.run_id)
        if view is None:
            return
        if t == "run.lease_granted":
            view.owner = e.payload_as(LeaseGranted).worker_id
        elif t in ("run.lease_expired", "run.lease_released"):
            view.owner = None
        elif t == "run.cancel_requested":
            view.status = "cancelling"
        elif t == "run.compaction_started":
            view.status = "compacting"
        elif t == "run.compaction_finished":
            view.status = "running"
        elif t == "run.finished":
            del self._views[e.run_id]
        self._schedule_consider()

    def _schedule_consider(self) -> None:
        # after the events already handed over are applied, not after each one
        if not self._consider_scheduled:
            self._consider_scheduled = True
            asyncio.get_running_loop().call_soon(self._consider)

    def _consider(self) -> None:
        self._consider_scheduled = False
        for run_id, view in self._views.items():
            if view.owner is None and view.status in _STARTABLE and run_id not in self.executions:
                self._start(view.spec)

    def _start(self, spec: RunSpec) -> None:
        ex = Execution(self, spec)
        self.executions[spec.run_id] = ex
        task = asyncio.create_task(ex.main())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def forget(self, ex: Execution) -> None:
        if self.executions.get(ex.run_id) is ex:
            del self.executions[ex.run_id]

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
