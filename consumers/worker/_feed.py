"""Kafka side of a worker (confluent-kafka, one thread per consumer; see docs/workers.md).

Two consumers, because two different questions are asked of `session.events`:

* the *group* consumer (subscribe, group `worker_group`) answers "which runs in my
  partitions may be started?": on assignment it reads the processor's state changelog
  (`session.state`) for a snapshot of active runs, then follows the events from the end;
* the *control* consumer (assign, no group) follows the partitions of the runs this worker
  is acquiring or executing. Execution is governed by the lease, not by partition ownership:
  a rebalance must not cut a run's worker off its cancel, steer and fencing events.

Both hand decoded events to the asyncio loop with `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import signal
import threading
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from schemas.codec import Codec
from schemas.errors import DecodeError
from schemas.events import Event
from sessionstream._kafka import client_config
from sessionstream.settings import Settings
from streams.core import decode_state
from streams.state import SessionState

__all__ = ["ControlFeed", "GroupFeed"]

log = logging.getLogger("sessionstream.worker")

OnEvent = Callable[[Event, int], None]
OnAssign = Callable[[int, list[SessionState]], None]
OnRevoke = Callable[[list[int]], None]


def _decode(codec: Codec, value: bytes | None) -> Event | None:
    try:
        return codec.decode_event(value or b"")
    except DecodeError as e:  # the processor wrote it, so this is a version skew: skip loudly
        log.error("undecodable event skipped: %s", e)
        return None


class _Thread:
    def __init__(self, name: str) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)

    def _main(self) -> None:
        try:
            self.run()
        except Exception:
            # a worker whose feed is dead is deaf to cancels and grants: stop the whole
            # process (gracefully: its leases are released) so a supervisor restarts it
            log.critical("%s died; stopping the worker", self.thread.name, exc_info=True)
            os.kill(os.getpid(), signal.SIGTERM)
            raise

    def run(self) -> None:
        raise NotImplementedError


class GroupFeed(_Thread):
    """Discovery of startable runs through the worker group."""

    def __init__(
        self,
        settings: Settings,
        loop: asyncio.AbstractEventLoop,
        on_event: OnEvent,
        on_assign: OnAssign,
        on_revoke: OnRevoke,
        session_timeout_ms: int = 6000,
    ) -> None:
        super().__init__("worker-group")
        self.settings = settings
        self.loop = loop
        self.on_event, self.on_assign_cb, self.on_revoke_cb = on_event, on_assign, on_revoke
        self.codec = Codec()
        self.assigned = threading.Event()
        self.consumer = Consumer(
            client_config(
                settings,
                **{
                    "group.id": settings.worker_group,
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "session.timeout.ms": session_timeout_ms,
                    "heartbeat.interval.ms": max(500, session_timeout_ms // 6),
                    "fetch.wait.max.ms": 10,
                    "partition.assignment.strategy": "range",
                },
            )
        )

    def run(self) -> None:
        c = self.consumer
        c.subscribe(
            [self.settings.events_topic],
            on_assign=self._assign,
            on_revoke=self._revoke,
            on_lost=self._revoke,
        )
        try:
            while not self.stop.is_set():
                msg = c.poll(0.05)
                if msg is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        log.warning("group consumer: %s", err)
                    continue
                event = _decode(self.codec, msg.value())
                if event is not None:
                    self.loop.call_soon_threadsafe(self.on_event, event, msg.partition() or 0)
        finally:
            c.close()

    def _assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        s = self.settings
        start = []
        for tp in partitions:
            # Step 1: where the committed events end now (read_committed: the stable offset)
            end = _end_offset(consumer, TopicPartition(s.events_topic, tp.partition), self.stop)
            # Step 2: the state snapshot, which already holds every event below `end`
            states = _read_states(s, tp.partition)
            self.loop.call_soon_threadsafe(self.on_assign_cb, tp.partition, states)
            # Step 3: follow from `end`; events the snapshot already holds are re-applied
            start.append(TopicPartition(s.events_topic, tp.partition, end))
        consumer.assign(start)
        log.info("worker assigned %s", sorted(tp.partition for tp in partitions))
        self.assigned.set()

    def _revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        parts = [tp.partition for tp in partitions]
        self.loop.call_soon_threadsafe(self.on_revoke_cb, parts)
        log.info("worker revoked %s", sorted(parts))


def _end_offset(consumer: Consumer, tp: TopicPartition, stop: threading.Event) -> int:
    """Where the partition ends now. A broker restarting answers NOT_LEADER or times out
    for a while: that is waited out, or the feed thread would die and the worker go deaf."""
    while True:
        try:
            return int(consumer.get_watermark_offsets(tp, timeout=30, cached=False)[1])
        except KafkaException as e:
            if e.args[0].fatal() or stop.is_set():
                raise
            log.warning("end of %s[%s]: %s; retrying", tp.topic, tp.partition, e.args[0])
            stop.wait(0.5)


def _read_states(settings: Settings, partition: int) -> list[SessionState]:
    reader = Consumer(
        client_config(
            settings,
            **{
                "group.id": f"sessionstream-worker-snapshot-{uuid.uuid4()}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "fetch.wait.max.ms": 10,
            },
        )
    )
    states: dict[str, SessionState] = {}
    try:
        reader.assign([TopicPartition(settings.state_topic, partition, OFFSET_BEGINNING)])
        while True:
            msg = reader.poll(1.0)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    break
                if err.fatal():
                    raise KafkaException(err)
                log.warning("state snapshot: %s", err)  # a broker restarting: read on
                continue
            value = msg.value()
            if value is None:
                states.pop((msg.key() or b"").decode(), None)
            else:
                state = decode_state(value)
                states[state.session_id] = state
    finally:
        reader.close()
    return list(states.values())


class ControlFeed(_Thread):
    """Follows the partitions of the runs this worker acquires or executes."""

    def __init__(
        self, settings: Settings, loop: asyncio.AbstractEventLoop, on_event: OnEvent
    ) -> None:
        super().__init__("worker-control")
        self.settings = settings
        self.loop = loop
        self.on_event = on_event
        self.codec = Codec()
        self._requests: queue.Queue[tuple[int, asyncio.Future[None]]] = queue.Queue()
        self._watching: set[int] = set()
        self.consumer = Consumer(
            client_config(
                settings,
                **{
                    "group.id": f"sessionstream-worker-control-{uuid.uuid4()}",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "fetch.wait.max.ms": 5,
                },
            )
        )

    async def watch(self, partition: int) -> None:
        """Return once the partition is followed from (at the latest) its end now."""
        fut: asyncio.Future[None] = self.loop.create_future()
        self._requests.put((partition, fut))
        await fut

    def _serve_requests(self) -> None:
        while True:
            try:
                p, fut = self._requests.get_nowait()
            except queue.Empty:
                return
            if p not in self._watching:
                tp = TopicPartition(self.settings.events_topic, p)
                end = _end_offset(self.consumer, tp, self.stop)
                self.consumer.incremental_assign([TopicPartition(tp.topic, p, end)])
                self._watching.add(p)
            self.loop.call_soon_threadsafe(_resolve, fut)

    def run(self) -> None:
        c = self.consumer
        try:
            while not self.stop.is_set():
                self._serve_requests()
                if not self._watching:
                    self.stop.wait(0.01)
                    continue
                msg = c.poll(0.02)
                while msg is not None:
                    err = msg.error()
                    if err is None:
                        event = _decode(self.codec, msg.value())
                        if event is not None:
                            p = msg.partition() or 0
                            self.loop.call_soon_threadsafe(self.on_event, event, p)
                    elif err.code() != KafkaError._PARTITION_EOF:
                        log.warning("control consumer: %s", err)
                    msg = c.poll(0)
        finally:
            c.close()


def _resolve(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_result(None)
