"""Live `session.events` for Server-Sent-Events clients: one consumer, many subscribers.

The same consumer reads the token deltas (`deltas_topic`) from their end: a delta goes to
the subscribers of its session as a `Delta` — a view with no place in the log, never
replayed on resume, and the first thing dropped for a subscriber that falls behind.

One `read_committed` consumer per gateway reads every events partition from where it
ended when the gateway started and hands each event to the subscribers of its session
(the key `{session}/{run}/{seq}` is checked before anything is decoded). A subscriber is
an asyncio queue of bounded size; one that falls behind is closed (`Overflow`) and its
client resumes with `Last-Event-ID` rather than growing the gateway's memory.

Resume without gap or repeat: `subscribe` registers the queue and reads the partition's
delivered position under one lock that the consumer thread also holds while it hands
out events, so every event below that position went out before the subscriber existed
and every event from it on reaches the queue. The caller reads `[from, position)`
itself, a page at a time (`read_page`), and then the queue, skipping offsets it already
sent. A page is read on one of the catch-up threads, each with its own consumer kept
between pages; the thread is free again as soon as the page is in memory, so a client
that does not read holds no thread, only its page (`gateway_catch_up_page_bytes`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sessionstream.adapters.access import CLIENT_GROUP_PREFIX
from sessionstream.adapters.kafka import (
    LIVE_FETCH_WAIT_MS,
    Message,
    Reader,
    TopicPartition,
    new_admin,
    new_reader,
    record_failure,
    take,
)
from sessionstream.adapters.registry import reader_codec
from sessionstream.core.partitioning import partition_for
from sessionstream.errors import KafkaUnavailable
from sessionstream.schemas.errors import DecodeError
from sessionstream.schemas.events import Event
from sessionstream.settings import Settings

__all__ = ["Delta", "EventFanout", "Item", "Overflow", "Stopped", "Subscriber"]

log = logging.getLogger("sessionstream.apps.gateway")


#: records a catch-up page looks at, at most (a partition holds every session hashed to it:
#: a page of a quiet session among busy ones ends here, not at `page_bytes`)
PAGE_RECORDS = 5000
#: a page that is not read within this is a broker that does not answer
PAGE_TIMEOUT_S = 30.0
#: what a page consumer may fetch ahead (librdkafka's default is 64 MB a consumer)
_PAGE_FETCH: dict[str, Any] = {
    "queued.max.messages.kbytes": 2048,
    "fetch.max.bytes": 2 << 20,
    "max.partition.fetch.bytes": 1 << 20,
    "fetch.queue.backoff.ms": 10,
}


@dataclass(frozen=True)
class Item:
    """One event of a session with its place in the log and its size there (bytes)."""

    offset: int
    event: Event
    size: int = 0


@dataclass(frozen=True)
class Delta:
    """A token delta of one of the session's model calls (`model.delta`: `runId`,
    `callId`, `seq`, `text`, ...), as the worker published it; `size` its bytes."""

    data: dict[str, Any]
    size: int = 0


#: a delta record larger than this is not one a worker writes: skipped
MAX_DELTA_BYTES = 256 * 1024


class Overflow:
    """Put on a subscriber's queue when it is full: the stream ends there."""


class Stopped:
    """Put on every subscriber's queue when the events tail fails: the streams end (their
    clients reconnect and are told 503 until the gateway is restarted)."""


@dataclass(eq=False)
class Subscriber:
    """One event stream's queue; `queued_bytes` is what it holds (bounded by the fanout's
    `queue_bytes`, as its length by `queue_size`)."""

    session_id: str
    tenant_id: str
    partition: int
    queue: asyncio.Queue[Item | Delta | Overflow | Stopped]
    loop: asyncio.AbstractEventLoop
    max_bytes: int = 8 << 20
    closed: bool = False
    dropped: int = field(default=0)
    #: token deltas not queued because the queue was half full (a view: droppable)
    deltas_dropped: int = 0
    queued_bytes: int = 0

    def taken(self, got: Item | Delta | Overflow | Stopped) -> Item | Delta | Overflow | Stopped:
        """Account for what the stream took off the queue (call for each `get`)."""
        if isinstance(got, Item | Delta):
            self.queued_bytes -= got.size
        return got


class EventFanout:
    """The gateway's one tail of `session.events`, fanned out to subscribers by session."""

    def __init__(
        self,
        settings: Settings,
        *,
        queue_size: int = 1000,
        queue_bytes: int = 8 << 20,
        catch_up_threads: int = 8,
    ) -> None:
        self.settings = settings
        self.queue_size = queue_size
        self.queue_bytes = queue_bytes
        self.partitions = 0
        self._subs: dict[str, set[Subscriber]] = {}
        #: per partition, the offset after the last event handed out
        self._position: dict[int, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.codec = reader_codec(settings, stop=self._stop)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gateway-events", daemon=True)
        self._error: BaseException | None = None
        self.delivered = 0
        #: the threads that read catch-up pages (`read_page`): their own, so a page read
        #: never waits behind other work; each keeps one consumer between pages
        self.catch_up_threads = ThreadPoolExecutor(
            catch_up_threads, thread_name_prefix="gateway-catch-up"
        )
        self._local = threading.local()
        self._page_consumers: list[Reader] = []

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
        self.catch_up_threads.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            consumers, self._page_consumers = self._page_consumers, []
        for c in consumers:
            c.close()

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
            session_id,
            tenant_id,
            p,
            asyncio.Queue(self.queue_size),
            asyncio.get_running_loop(),
            self.queue_bytes,
        )
        with self._lock:
            self._subs.setdefault(session_id, set()).add(sub)
            return sub, self._position[p]

    def position(self, partition: int) -> int:
        """Where the tail stands in an events partition: every event below was handed out."""
        with self._lock:
            return self._position[partition]

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

    def read_page(
        self, session_id: str, tenant_id: str, start: int, end: int, max_bytes: int
    ) -> tuple[list[Item], int]:
        """The session's events from offset `start` on, below `end`: as many as fit in
        `max_bytes` (at least one) or are found in `PAGE_RECORDS` records, and the offset
        the next page starts at (`end` when this one reached it). Blocking: a catch-up
        thread runs it, with that thread's own consumer."""
        if start >= end:
            return [], end
        consumer = self._page_consumer()
        topic = self.settings.events_topic
        p = self.partition_of(session_id)
        prefix = f"{session_id}/".encode()
        items: list[Item] = []
        size = 0
        seen = 0
        nxt = start
        consumer.assign([TopicPartition(topic, p, start)])
        deadline = time.monotonic() + PAGE_TIMEOUT_S
        try:
            while nxt < end and seen < PAGE_RECORDS and (size < max_bytes or not items):
                if time.monotonic() > deadline:
                    raise KafkaUnavailable(
                        f"catch-up of {topic}[{p}] from {nxt}: no records for {PAGE_TIMEOUT_S}s",
                        bootstrap=self.settings.kafka_bootstrap,
                    )
                for msg in take(consumer, 500, 0.1):
                    err = record_failure(msg)
                    if err is not None:
                        if err.partition_eof:
                            nxt = end  # read_committed: nothing more below the LSO
                            break
                        if err.fatal:
                            raise KafkaUnavailable(
                                f"catch-up of {topic}[{p}]: {err.reason}",
                                bootstrap=self.settings.kafka_bootstrap,
                            ) from err
                        log.warning("gateway: catch-up read: %s", err.reason)
                        continue
                    offset = msg.offset() or 0
                    if offset >= end:
                        nxt = end
                        break
                    nxt = offset + 1
                    seen += 1
                    value = msg.value() or b""
                    if (msg.key() or b"").startswith(prefix):
                        event = self._decode(value)
                        # the key's first part is not proof: a session named before ids
                        # refused '/' could share the prefix ("X/y" under "X")
                        if (
                            event is not None
                            and event.session_id == session_id
                            and event.tenant_id == tenant_id
                        ):
                            items.append(Item(offset, event, len(value)))
                            size += len(value)
                    if seen >= PAGE_RECORDS or (size >= max_bytes and items):
                        break
        finally:
            # stop fetching and drop what was fetched ahead: an idle thread holds nothing
            consumer.unassign()
        return items, nxt

    def _page_consumer(self) -> Reader:
        consumer: Reader | None = getattr(self._local, "consumer", None)
        if consumer is None:
            consumer = new_reader(
                self.settings,
                group_id=f"{CLIENT_GROUP_PREFIX}sse-{uuid.uuid4()}",
                eof=True,
                fetch_wait_ms=5,
                # what one page may prefetch, not librdkafka's 64 MB a consumer
                **_PAGE_FETCH,
            )
            self._local.consumer = consumer
            with self._lock:
                self._page_consumers.append(consumer)
        return consumer

    # -- the consumer thread ----------------------------------------------------------------
    def _ends(self) -> tuple[dict[int, int], dict[int, int]]:
        """Where each events partition ends for a read_committed reader (its LSO), and
        where each deltas partition ends now (asked, not `OFFSET_END`: that is resolved
        only when the partition is first fetched, and a delta appended meanwhile — seen:
        a run's first — would be skipped; none, and no token deltas, when that topic is
        missing)."""
        admin = new_admin(self.settings)

        def ends(topic: str, *, committed: bool) -> dict[int, int] | None:
            meta = admin.list_topics(topic, timeout=10).topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                return None
            got = admin.latest_offsets([(topic, p) for p in meta.partitions], committed=committed)
            return {p: offset for (_topic, p), offset in got.items()}

        events = ends(self.settings.events_topic, committed=True)
        if events is None:
            raise RuntimeError(f"events topic {self.settings.events_topic} is not there")
        deltas = ends(self.settings.deltas_topic, committed=False)
        if deltas is None:
            log.warning(
                "gateway: no token deltas: topic %s is not there", self.settings.deltas_topic
            )
        return events, deltas or {}

    def _run(self) -> None:
        try:
            ends, deltas = self._ends()
            consumer = new_reader(
                self.settings,
                group_id=f"{CLIENT_GROUP_PREFIX}sse-{uuid.uuid4()}",
                fetch_wait_ms=LIVE_FETCH_WAIT_MS,
            )
            topic = self.settings.events_topic
            consumer.assign(
                [TopicPartition(topic, p, o) for p, o in ends.items()]
                + [TopicPartition(self.settings.deltas_topic, p, o) for p, o in deltas.items()]
            )
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
        deliveries: dict[Subscriber, list[Item | Delta]] = {}
        deltas_topic = self.settings.deltas_topic
        with self._lock:
            for msg in batch:
                err = record_failure(msg)
                if err is not None:
                    if not err.partition_eof:
                        log.warning("gateway: reading events: %s", err.reason)
                    continue
                if msg.topic() == deltas_topic:
                    self._delta(msg.value() or b"", deliveries)
                    continue
                p, offset = msg.partition() or 0, msg.offset() or 0
                self._position[p] = offset + 1
                key: bytes = msg.key() or b""
                session = key.split(b"/", 1)[0].decode(errors="replace")
                subs = self._subs.get(session)
                if not subs:
                    continue
                value = msg.value() or b""
                event = self._decode(value)
                if event is None:
                    continue
                item = Item(offset, event, len(value))
                for sub in subs:
                    # the session itself, not only its key's first part ("X/y/..." of a
                    # session named before ids refused '/' is not X's)
                    if sub.tenant_id == event.tenant_id and sub.session_id == event.session_id:
                        deliveries.setdefault(sub, []).append(item)
        for sub, items in deliveries.items():
            sub.loop.call_soon_threadsafe(_deliver, sub, items)

    def _delta(self, value: bytes, deliveries: dict[Subscriber, list[Item | Delta]]) -> None:
        """Hand a token delta to its session's subscribers (called with the lock held)."""
        if len(value) > MAX_DELTA_BYTES:
            return
        try:
            data = json.loads(value)
        except ValueError:
            return
        if not isinstance(data, dict) or data.get("type") != "model.delta":
            return
        session, tenant = data.get("sessionId"), data.get("tenantId")
        subs = self._subs.get(session) if isinstance(session, str) else None
        if not subs:
            return
        delta = Delta(data, len(value))
        for sub in subs:
            if sub.tenant_id == tenant:
                deliveries.setdefault(sub, []).append(delta)

    def _decode(self, value: bytes | None) -> Event | None:
        if value is None:
            return None  # a tombstone: an erased session's event
        try:
            return self.codec.decode_event(value or b"")
        except DecodeError as e:
            log.warning("gateway: an event this version cannot read (%s): skipped", e)
            return None


def _deliver(sub: Subscriber, items: list[Item | Delta]) -> None:
    if sub.closed:
        return
    for item in items:
        if isinstance(item, Delta) and (
            sub.queue.qsize() * 2 >= sub.queue.maxsize or sub.queued_bytes * 2 >= sub.max_bytes
        ):
            sub.deltas_dropped += 1  # a view: dropped before any event would be
            continue
        full = sub.queue.qsize() >= sub.queue.maxsize - 1 or (
            sub.queued_bytes + item.size > sub.max_bytes and sub.queued_bytes > 0
        )
        if full:
            # keep one place for the marker: the stream ends, the client resumes later
            sub.closed = True
            sub.dropped += 1
            sub.queue.put_nowait(Overflow())
            return
        sub.queued_bytes += item.size
        sub.queue.put_nowait(item)


def _stop(sub: Subscriber) -> None:
    if sub.closed:  # an overflowed queue already ends with its marker
        return
    sub.closed = True
    sub.queue.put_nowait(Stopped())
