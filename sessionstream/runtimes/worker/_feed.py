"""Kafka side of a worker (the Kafka adapter's readers, one thread per consumer; see
docs/workers.md).

No consumer group: partition ownership has nothing to do with who runs what, the lease
does. Three feeds, each handing decoded records to the asyncio loop with
`call_soon_threadsafe`:

* `OpenRunsFeed` reads the whole `session.open-runs` topic (every partition, from the
  start: it is compacted to the runs that need a holder now) and follows it;
* `PresenceFeed` reads the whole `session.workers` topic: who else is alive;
* `ControlFeed` follows the events partitions of the runs this worker acquires or executes
  (grants, cancels, steers, fencing), from their end at the moment it is asked to.
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

from pydantic import ValidationError

from sessionstream.adapters.kafka import (
    LIVE_FETCH_WAIT_MS,
    Reader,
    TopicPartition,
    end_offset,
    new_reader,
    read_records,
    record_failure,
)
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.discovery import OpenRun, WorkerPresence
from sessionstream.schemas.errors import DecodeError
from sessionstream.schemas.events import Event
from sessionstream.settings import Settings

__all__ = ["ControlFeed", "OpenRunsFeed", "PresenceFeed"]

log = logging.getLogger("sessionstream.worker")

OnEvent = Callable[[Event, int], None]
#: (session id, partition, the open run or None once it is taken or ended)
OnOpenRun = Callable[[str, int, OpenRun | None], None]
#: (worker id, its presence or None when it left, the record's broker time in ms)
OnPresence = Callable[[str, WorkerPresence | None, int], None]


def _decode(codec: Codec, value: bytes | None) -> Event | None:
    if value is None:
        return None  # a tombstone: an erased session's event (docs/protocol.md, erasure)
    try:
        return codec.decode_event(value or b"")
    except DecodeError as e:  # the processor wrote it, so this is a version skew: skip loudly
        log.error("undecodable event skipped: %s", e)
        return None


def _key_text(key: bytes, topic: str) -> str | None:
    """A record's key as text; one that is not UTF-8 (no producer of ours wrote it) is
    skipped loudly. It used to end the feed, and with it every worker, on every restart:
    all of them read the whole compacted topic."""
    try:
        return key.decode()
    except UnicodeDecodeError:
        log.error("a %s record with a key that is not UTF-8 skipped: %r", topic, key[:80])
        return None


def _reader(settings: Settings, **extra: Any) -> Reader:
    """An assign-only consumer (its group id is never joined nor committed)."""
    return new_reader(settings, group_id=f"sessionstream-worker-{uuid.uuid4()}", **extra)


class _Thread:
    def __init__(self, name: str) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        #: told (on this thread) what ended the feed; the worker stops on it. Unset: the
        #: process is sent SIGTERM, which stops a `sessionstream worker` the same way
        self.on_failure: Callable[[BaseException], None] | None = None

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)

    def _main(self) -> None:
        try:
            self.run()
        except Exception as e:
            # a worker whose feed is dead is deaf to cancels and grants: stop it
            # (gracefully: its leases are released) so a supervisor restarts it
            log.critical("%s died; stopping the worker", self.thread.name, exc_info=True)
            if self.on_failure is not None:
                self.on_failure(e)
            else:
                os.kill(os.getpid(), signal.SIGTERM)

    def run(self) -> None:
        raise NotImplementedError


class _WholeTopic(_Thread):
    """Reads every partition of a small compacted topic from its start, then follows it.
    `caught_up` is set once the records present at start have been handed over."""

    def __init__(self, name: str, settings: Settings, topic: str) -> None:
        super().__init__(name)
        self.settings = settings
        self.topic = topic
        self.caught_up = threading.Event()

    def handle(self, key: bytes, value: bytes | None, partition: int, ts: int) -> None:
        raise NotImplementedError

    def run(self) -> None:
        for r in read_records(
            self.settings,
            {self.topic: None},
            follow=self.stop,
            on_caught_up=self.caught_up.set,
            group_id=f"sessionstream-worker-{uuid.uuid4()}",
            poll_s=0.05,
        ):
            if r.key is not None:
                self.handle(r.key, r.value, r.partition, r.timestamp)


class OpenRunsFeed(_WholeTopic):
    """The runs that need a holder, across all partitions."""

    def __init__(
        self, settings: Settings, loop: asyncio.AbstractEventLoop, on_open: OnOpenRun
    ) -> None:
        super().__init__("worker-open-runs", settings, settings.open_runs_topic)
        self.loop, self.on_open = loop, on_open

    def handle(self, key: bytes, value: bytes | None, partition: int, ts: int) -> None:
        run: OpenRun | None = None
        if value is not None:
            try:
                run = OpenRun.model_validate_json(value)
            except ValidationError as e:
                log.error("undecodable open-runs record skipped: %s", e)
                return
        session = _key_text(key, self.topic)
        if session is not None:
            self.loop.call_soon_threadsafe(self.on_open, session, partition, run)


class PresenceFeed(_WholeTopic):
    """Every worker's presence records."""

    def __init__(
        self, settings: Settings, loop: asyncio.AbstractEventLoop, on_presence: OnPresence
    ) -> None:
        super().__init__("worker-presence", settings, settings.workers_topic)
        self.loop, self.on_presence = loop, on_presence

    def handle(self, key: bytes, value: bytes | None, partition: int, ts: int) -> None:
        p: WorkerPresence | None = None
        if value is not None:
            try:
                p = WorkerPresence.model_validate_json(value)
            except ValidationError as e:
                log.error("undecodable presence record skipped: %s", e)
                return
        worker = _key_text(key, self.topic)
        if worker is not None:
            self.loop.call_soon_threadsafe(self.on_presence, worker, p, ts)


class ControlFeed(_Thread):
    """Follows the events partitions of the runs this worker acquires or executes."""

    def __init__(
        self,
        settings: Settings,
        loop: asyncio.AbstractEventLoop,
        on_event: OnEvent,
        codec: Codec | None = None,
    ) -> None:
        super().__init__("worker-control")
        self.settings = settings
        self.loop = loop
        self.on_event = on_event
        self.codec = codec or Codec()
        self._requests: queue.Queue[tuple[int, asyncio.Future[None]]] = queue.Queue()
        self._watching: set[int] = set()
        self.consumer = _reader(settings, fetch_wait_ms=LIVE_FETCH_WAIT_MS)

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
                topic = self.settings.events_topic
                end = end_offset(self.consumer, topic, p, self.stop)
                self.consumer.incremental_assign([TopicPartition(topic, p, end)])
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
                    err = record_failure(msg)
                    if err is None:
                        event = _decode(self.codec, msg.value())
                        if event is not None:
                            p = msg.partition() or 0
                            self.loop.call_soon_threadsafe(self.on_event, event, p)
                    elif not err.partition_eof:
                        log.warning("control consumer: %s", err.reason)
                    msg = c.poll(0)
        finally:
            c.close()


def _resolve(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_result(None)
