"""Live `session.events` for Server-Sent-Events clients: one consumer, many subscribers.

One `read_committed` consumer per gateway reads every events partition from where it
ended when the gateway started and hands each event to the subscribers of its session
(the key `{session}/{run}/{seq}` is checked before anything is decoded). A subscriber is
an asyncio queue of bounded size; one that falls behind is closed (`Overflow`) and its
client resumes with `Last-Event-ID` rather than growing the gateway's memory.

Resume without gap or repeat: `subscribe` registers the queue and reads the partition's
delivered position under one lock that the consumer thread also holds while it hands
out events, so every event below that position went out before the subscriber existed
and every event from it on reaches the queue. The caller reads `[from, position)`
itself (`catch_up`) and then the queue, skipping offsets it already sent.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from confluent_kafka import Consumer, IsolationLevel, KafkaError, Message, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from schemas.codec import Codec
from schemas.errors import DecodeError
from schemas.events import Event
from sessionstream.access import CLIENT_GROUP_PREFIX
from sessionstream.kafka import client_config, read_messages, reader_config, take
from sessionstream.settings import Settings
from streams.partitioning import partition_for

__all__ = ["EventFanout", "Item", "Overflow", "Stopped", "Subscriber"]

log = logging.getLogger("sessionstream.gateway")


#: catch-ups read at once; more wait their turn (each holds its thread until its client
#: has taken what it read, or `sse.STALL_S`)
CATCH_UP_THREADS = 8


@dataclass(frozen=True)
class Item:
    """One event of a session with its place in the log."""

    offset: int
    event: Event


class Overflow:
    """Put on a subscriber's queue when it is full: the stream ends there."""


class Stopped:
    """Put on every subscriber's queue when the events tail fails: the streams end (their
    clients reconnect and are told 503 until the gateway is restarted)."""


@dataclass(eq=False)
class Subscriber:
    session_id: str
    tenant_id: str
    partition: int
    queue: asyncio.Queue[Item | Overflow | Stopped]
    loop: asyncio.AbstractEventLoop
    closed: bool = False
    dropped: int = field(default=0)


class EventFanout:
    """The gateway's one tail of `session.events`, fanned out to subscribers by session."""

    def __init__(self, settings: Settings, *, queue_size: int = 1000) -> None:
        self.settings = settings
        self.queue_size = queue_size
        self.codec = Codec()
        self.partitions = 0
        self._subs: dict[str, set[Subscriber]] = {}
        #: per partition, the offset after the last event handed out
        self._position: dict[int, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gateway-events", daemon=True)
        self._error: BaseException | None = None
        self.delivered = 0
        #: the threads that read catch-ups (`catch_up`): their own, so a catch-up that
        #: waits on its client never holds a thread other work needs
        self.catch_up_threads = ThreadPoolExecutor(
            CATCH_UP_THREADS, thread_name_prefix="gateway-catch-up"
        )

    def start(self, timeout: float = 30.0) -> None:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("the gateway's events consumer did not start")
        if self._error is not None:
            raise self._error

    @property
    def alive(self) -> bool:
        """The events tail runs (it stops only on `close` or a failure)."""
        return self._thread.is_alive()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self.catch_up_threads.shutdown(wait=False, cancel_futures=True)

    def partition_of(self, session_id: str) -> int:
        return partition_for(session_id.encode(), self.partitions)

    # -- subscribers (event loop) -----------------------------------------------------------
    def subscribe(self, session_id: str, tenant_id: str) -> tuple[Subscriber, int]:
        """A queue of the session's events from now on (only those of `tenant_id`), and
        the partition's position: every event below it was handed out before.
        `RuntimeError` if the events tail has stopped."""
        if not self.alive:
            raise RuntimeError("the gateway's events tail has stopped")
        p = self.partition_of(session_id)
        sub = Subscriber(
            session_id, tenant_id, p, asyncio.Queue(self.queue_size), asyncio.get_running_loop()
        )
        with self._lock:
            self._subs.setdefault(session_id, set()).add(sub)
            return sub, self._position[p]

    def unsubscribe(self, sub: Subscriber) -> None:
        sub.closed = True
        with self._lock:
            subs = self._subs.get(sub.session_id)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._subs[sub.session_id]

    @property
    def subscribers(self) -> int:
        with self._lock:
            return sum(len(s) for s in self._subs.values())

    def catch_up(self, session_id: str, tenant_id: str, start: int, end: int) -> Iterator[Item]:
        """The session's events at offsets `[start, end)` (blocking: run it in a thread)."""
        if start >= end:
            return
        p = self.partition_of(session_id)
        prefix = f"{session_id}/".encode()
        topic = self.settings.events_topic
        for msg in read_messages(
            self.settings,
            {topic: [p]},
            start={(topic, p): start},
            end={(topic, p): end},
            group_id=f"{CLIENT_GROUP_PREFIX}sse-{uuid.uuid4()}",
            timeout=30,
        ):
            if not (msg.key() or b"").startswith(prefix):
                continue
            event = self._decode(msg.value())
            if event is not None and event.tenant_id == tenant_id:
                yield Item(msg.offset() or 0, event)

    # -- the consumer thread ----------------------------------------------------------------
    def _ends(self) -> dict[int, int]:
        """Where each events partition ends for a read_committed reader (its LSO)."""
        admin = AdminClient(client_config(self.settings))
        topic = self.settings.events_topic
        meta = admin.list_topics(topic, timeout=10).topics[topic]
        if meta.error is not None:
            raise RuntimeError(f"events topic {topic}: {meta.error}")
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        req = {TopicPartition(topic, p): latest for p in meta.partitions}
        got = admin.list_offsets(req, isolation_level=IsolationLevel.READ_COMMITTED)
        return {tp.partition: int(f.result(timeout=10).offset) for tp, f in got.items()}

    def _run(self) -> None:
        try:
            ends = self._ends()
            consumer = Consumer(
                reader_config(
                    self.settings,
                    group_id=f"{CLIENT_GROUP_PREFIX}sse-{uuid.uuid4()}",
                    fetch_wait_ms=5,
                )
            )
            topic = self.settings.events_topic
            consumer.assign([TopicPartition(topic, p, o) for p, o in ends.items()])
            self.partitions = len(ends)
            self._position = dict(ends)
        except BaseException as e:
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        try:
            while not self._stop.is_set():
                batch = take(consumer, 500, 0.05)
                if batch:
                    self._hand_out(batch)
        except Exception:
            log.exception("gateway: the events consumer failed")
            with self._lock:
                subs = [sub for group in self._subs.values() for sub in group]
            for sub in subs:
                sub.loop.call_soon_threadsafe(_stop, sub)
            raise
        finally:
            consumer.close()

    def _hand_out(self, batch: list[Message]) -> None:
        deliveries: dict[Subscriber, list[Item]] = {}
        with self._lock:
            for msg in batch:
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        log.warning("gateway: reading events: %s", err)
                    continue
                p, offset = msg.partition() or 0, msg.offset() or 0
                self._position[p] = offset + 1
                key: bytes = msg.key() or b""
                session = key.split(b"/", 1)[0].decode(errors="replace")
                subs = self._subs.get(session)
                if not subs:
                    continue
                event = self._decode(msg.value())
                if event is None:
                    continue
                for sub in subs:
                    if sub.tenant_id == event.tenant_id:
                        deliveries.setdefault(sub, []).append(Item(offset, event))
        for sub, items in deliveries.items():
            sub.loop.call_soon_threadsafe(_deliver, sub, items)

    def _decode(self, value: bytes | None) -> Event | None:
        try:
            return self.codec.decode_event(value or b"")
        except DecodeError as e:
            log.warning("gateway: an event this version cannot read (%s): skipped", e)
            return None


def _deliver(sub: Subscriber, items: list[Item]) -> None:
    if sub.closed:
        return
    for item in items:
        if sub.queue.qsize() >= sub.queue.maxsize - 1:
            # keep one place for the marker: the stream ends, the client resumes later
            sub.closed = True
            sub.dropped += 1
            sub.queue.put_nowait(Overflow())
            return
        sub.queue.put_nowait(item)


def _stop(sub: Subscriber) -> None:
    if sub.closed:  # an overflowed queue already ends with its marker
        return
    sub.closed = True
    sub.queue.put_nowait(Stopped())
