"""`sessionstream webhooks run`: the events topic -> the subscribers' endpoints, at least once.

A member of the consumer group `webhooks_group` reading committed events (instances of
the group share the partitions; cooperative rebalancing, so a joining instance takes
partitions without stopping the others'). Each event is matched against the
subscriptions read after it was appended (`webhooks_refresh_ms`), turned into jobs, and
the `Dispatcher` delivers them. The offset committed per partition is the first event
not done for every endpoint, with what is done above it in the commit's metadata
(`ledger`); it is committed every second, when a partition is taken away and when the
process stops. Stopping (SIGTERM) lets the attempts in flight end first.

The Kafka client runs in a thread of its own; its rebalance callbacks hand the partitions
to the event loop and wait for it (a revoked partition's attempts end, then its offset is
committed, before the partition goes).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import psycopg

from sessionstream.adapters.kafka import (
    LIVE_FETCH_WAIT_MS,
    GroupConsumer,
    Message,
    TopicPartition,
    data_messages,
    new_group_consumer,
    take,
)
from sessionstream.adapters.postgres import Reconnecting
from sessionstream.adapters.postgres.migrate import migrate
from sessionstream.adapters.registry import reader_codec
from sessionstream.errors import IncompatibleEvent, KafkaFailed
from sessionstream.runtimes.webhooks.backoff import RetryPolicy
from sessionstream.runtimes.webhooks.dispatch import DeadLetter, Dispatcher, Job, Send
from sessionstream.runtimes.webhooks.guard import AddressPolicy, Resolver
from sessionstream.runtimes.webhooks.ledger import Done, Ledger, parse_metadata
from sessionstream.runtimes.webhooks.sealing import SealedSecrets
from sessionstream.runtimes.webhooks.sender import Sender
from sessionstream.runtimes.webhooks.store import (
    live_fingerprint,
    live_subscriptions,
    record_dead_letter,
)
from sessionstream.runtimes.webhooks.subscribers import Snapshot
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.errors import DecodeError
from sessionstream.schemas.events import Event
from sessionstream.settings import Settings
from sessionstream.settings.webhooks import parse_secret_keys

__all__ = ["Deliverer", "DelivererStats", "event_body", "sealer_of"]

log = logging.getLogger("sessionstream.webhooks")

T = TypeVar("T")

#: how often the offsets are committed while running
COMMIT_S: Final = 1.0
#: subscriptions are read again at least this often while no event comes (a deleted one
#: stops its retries)
IDLE_REFRESH_S: Final = 5.0
_BATCH: Final = 500


def sealer_of(settings: Settings) -> SealedSecrets:
    """The secrets' sealer of the settings; `ConfigurationError` when no key is set."""
    key = settings.webhooks_secret_key
    return SealedSecrets(parse_secret_keys(key.get_secret_value()) if key else [])


def event_body(event: Event) -> bytes:
    """A delivery's body: the event's JSON, as `sessionstream replay --json` prints it."""
    return json.dumps(
        Codec.event_to_json(event), separators=(",", ":"), ensure_ascii=False
    ).encode()


@dataclass
class DelivererStats:
    events: int = 0
    jobs: int = 0
    commits: int = 0
    refreshes: int = 0


class Deliverer:
    """One instance of the group; `await run(stop)` until `stop` is set."""

    def __init__(
        self,
        settings: Settings,
        *,
        group: str | None = None,
        send: Send | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        self.settings = settings
        self.group = group or settings.webhooks_group
        self.sealer = sealer_of(settings)
        self.codec = reader_codec(settings)
        self.policy = RetryPolicy(
            settings.webhooks_max_attempts,
            settings.webhooks_backoff_s,
            settings.webhooks_backoff_max_s,
        )
        self._sender: Sender | None = None
        if send is None:
            self._sender = Sender(
                AddressPolicy.of(settings), settings.webhooks_timeout_s, resolver=resolver
            )
            send = self._sender
        self.dispatcher = Dispatcher(
            send,
            self._bury,
            self.policy,
            concurrency=settings.webhooks_concurrency,
            backlog=settings.webhooks_backlog,
        )
        self.snapshot = Snapshot.empty()
        self.stats = DelivererStats()
        self._refresh_s = settings.webhooks_refresh_ms / 1000
        self._grace_s = settings.webhooks_timeout_s + 1.0
        self._done: dict[int, Done] = {}
        self._committed: dict[int, tuple[int, str]] = {}
        #: partitions whose reading is paused (an endpoint cannot keep up)
        self._paused: set[int] = set()
        self._halt = threading.Event()  # the database retries' stop
        self._db = Reconnecting(settings, on_retry=self._db_retry)
        self._db_thread = ThreadPoolExecutor(1, thread_name_prefix="webhooks-db")
        self._kafka_thread = ThreadPoolExecutor(1, thread_name_prefix="webhooks-kafka")
        self._consumer: GroupConsumer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the loop ---------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        await self._database(
            "migrating",
            lambda _c: migrate(
                self.settings.database_conninfo, schema=self.settings.database_schema
            ),
        )
        await self._refresh()
        await self._kafka(self._subscribe)
        log.info(
            "webhooks: group %s delivering %s to %s subscription(s)",
            self.group,
            self.settings.events_topic,
            len(self.snapshot.ids),
        )
        last_commit = time.monotonic()
        try:
            while not stop.is_set():
                if self.dispatcher.failure is not None:
                    raise self.dispatcher.failure
                batch = await self._kafka(self._poll)
                if batch:
                    received = time.monotonic()
                    if self.snapshot.taken_at < received:
                        await self._refresh_after(received)
                    for msg in batch:
                        self._handle(msg)
                elif self.snapshot.age_s > IDLE_REFRESH_S:
                    await self._refresh()
                await self._backpressure()
                if time.monotonic() - last_commit >= COMMIT_S:
                    await self._commit()
                    last_commit = time.monotonic()
        finally:
            await self._shutdown()

    def _handle(self, msg: Message) -> None:
        p, offset = msg.partition(), msg.offset()
        assert p is not None and offset is not None
        if not self.dispatcher.owns(p):
            return  # fetched before its partition was taken away
        if msg.value() is None:
            return  # a tombstone: an erased session's event, nothing to deliver
        try:
            event = self.codec.decode_event(msg.value() or b"")
        except DecodeError as e:
            # the processor writes every event: one we cannot read is a newer schema, and
            # skipping it would drop deliveries for good
            raise IncompatibleEvent(
                f"undecodable event at {msg.topic()}[{p}]@{offset}: {e}; upgrade the deliverer"
            ) from e
        self.stats.events += 1
        finished = self._done.get(p, Done()).finished(offset)
        targets = (
            []
            if finished is None
            else [
                t
                for t in self.snapshot.targets(event, p, offset)
                if t.subscription_id not in finished
            ]
        )
        self.dispatcher.ledger(p).add(offset, {t.subscription_id for t in targets})
        if targets:
            self.stats.jobs += len(targets)
            appended = msg.timestamp()[1]
            job = Job(
                p, offset, event.key, event.session_id, event.type, event_body(event), appended
            )
            self.dispatcher.submit(job, targets)

    # -- subscriptions ----------------------------------------------------------------------
    async def _refresh_after(self, received: float) -> None:
        """A snapshot taken after `received`, asking at most every `webhooks_refresh_ms`."""
        wait = self.snapshot.taken_at + self._refresh_s - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        await self._refresh()

    async def _refresh(self) -> None:
        started = time.monotonic()
        # live_fingerprint started after `started`, and the reading of the rows after it:
        # a subscription made before the fingerprint was read is in the rows read
        fingerprint = await self._database("reading subscriptions", live_fingerprint)
        if fingerprint == self.snapshot.fingerprint:
            self.snapshot = self.snapshot.still(started)
            return
        rows = await self._database("reading subscriptions", live_subscriptions)
        snapshot = Snapshot.of(rows, self.sealer, started, fingerprint)
        for gone in self.snapshot.ids - snapshot.ids:
            log.info("webhooks: subscription %s deleted: its waiting deliveries dropped", gone)
            self.dispatcher.drop(gone)
        self.snapshot = snapshot
        self.stats.refreshes += 1

    async def _bury(self, dead: DeadLetter) -> None:
        await self._database("recording a dead letter", lambda c: record_dead_letter(c, dead))

    async def _backpressure(self) -> None:
        """Stop reading while an endpoint that answers holds its whole backlog, go on once
        it is down to half (`Dispatcher.saturated`); the group still sees us alive."""
        consumer = self._consumer
        assert consumer is not None
        topic = self.settings.events_topic
        if self.dispatcher.saturated():
            more = set(self.dispatcher.partitions) - self._paused
            if more:
                if not self._paused:
                    log.info(
                        "webhooks: an endpoint holds %s events: reading paused until it catches up",
                        self.settings.webhooks_backlog,
                    )
                parts = [TopicPartition(topic, p) for p in sorted(more)]
                await self._kafka(lambda: consumer.pause(parts))
                self._paused |= more
        elif self._paused and not self.dispatcher.saturated(0.5):
            parts = [
                TopicPartition(topic, p) for p in sorted(self._paused) if self.dispatcher.owns(p)
            ]
            self._paused.clear()
            if parts:
                await self._kafka(lambda: consumer.resume(parts))
            log.info("webhooks: reading again")

    # -- partitions (called by the Kafka thread, run on the loop) ----------------------------
    def _subscribe(self) -> None:
        self._consumer = new_group_consumer(
            self.settings,
            self.group,
            **{
                "partition.assignment.strategy": "cooperative-sticky",
                # a live reader: a parked fetch is answered at a commit, the wait only sets
                # how often an idle deliverer asks (docs/operations.md)
                "fetch.wait.max.ms": LIVE_FETCH_WAIT_MS,
            },
        )
        self._consumer.subscribe(
            [self.settings.events_topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def _poll(self) -> list[Message]:
        assert self._consumer is not None
        return data_messages(take(self._consumer, _BATCH, 0.2), log)

    def _on_assign(self, consumer: GroupConsumer, parts: list[TopicPartition]) -> None:
        if not parts:
            return
        try:
            committed = consumer.committed(parts, timeout=10)
        except KafkaFailed as e:
            # read from where the group's offsets say anyway (librdkafka asks again);
            # only what was done above them is not known: it is sent again
            log.warning("webhooks: committed offsets of %s: %s", [tp.partition for tp in parts], e)
            committed = [TopicPartition(tp.topic, tp.partition) for tp in parts]
        self._on_loop(self._opened(committed))

    def _on_revoke(self, consumer: GroupConsumer, parts: list[TopicPartition]) -> None:
        offsets = self._on_loop(self._closed([tp.partition for tp in parts]))
        if offsets:
            try:
                consumer.commit(offsets)
            except KafkaFailed as e:
                log.warning("webhooks: commit of revoked partitions failed: %s", e)

    def _on_lost(self, consumer: GroupConsumer, parts: list[TopicPartition]) -> None:
        # another member may own them already: nothing of ours is committed for them
        self._on_loop(self._closed([tp.partition for tp in parts]))

    def _on_loop(self, coro: Any) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _opened(self, committed: list[TopicPartition]) -> None:
        for tp in committed:
            start = tp.offset if tp.offset >= 0 else None
            self.dispatcher.open(tp.partition, Ledger(start))
            self._done[tp.partition] = (
                parse_metadata(start, tp.metadata) if start is not None else Done()
            )
        log.info(
            "webhooks: assigned %s from %s",
            sorted(tp.partition for tp in committed),
            {tp.partition: tp.offset for tp in committed},
        )

    async def _closed(self, partitions: list[int]) -> list[TopicPartition]:
        owned = [p for p in partitions if self.dispatcher.owns(p)]
        got = await asyncio.gather(*(self.dispatcher.close(p, self._grace_s) for p in owned))
        out = []
        for p, pos in zip(owned, got, strict=True):
            self._done.pop(p, None)
            self._paused.discard(p)
            self._committed.pop(p, None)
            if pos is not None:
                out.append(TopicPartition(self.settings.events_topic, p, pos[0], pos[1]))
        if owned:
            log.info("webhooks: released %s at %s", owned, {tp.partition: tp.offset for tp in out})
        return out

    async def _commit(self) -> None:
        changed = {
            p: pos
            for p, pos in self.dispatcher.positions().items()
            if self._committed.get(p) != pos
        }
        if not changed:
            return
        topic = self.settings.events_topic
        offsets = [TopicPartition(topic, p, o, meta) for p, (o, meta) in changed.items()]
        consumer = self._consumer
        assert consumer is not None
        try:
            await self._kafka(lambda: consumer.commit_async(offsets))
        except KafkaFailed as e:
            log.warning("webhooks: commit failed (asked again in %ss): %s", COMMIT_S, e)
            return
        self._committed.update(changed)
        self.stats.commits += 1

    async def _shutdown(self) -> None:
        """Let the attempts in flight end, commit, leave the group."""
        offsets = await self._closed(self.dispatcher.partitions)
        consumer = self._consumer
        if consumer is not None:

            def leave() -> None:
                if offsets:
                    try:
                        consumer.commit(offsets)
                    except KafkaFailed as e:
                        log.warning("webhooks: last commit failed: %s", e)
                consumer.close()

            try:
                await self._kafka(leave)
            except KafkaFailed as e:
                log.warning("webhooks: leaving the group: %s", e)
        await self.dispatcher.stop()
        if self._sender is not None:
            await self._sender.aclose()
        self._halt.set()
        self._kafka_thread.shutdown(wait=False)
        self._db_thread.shutdown(wait=False)
        await asyncio.to_thread(self._db.close)

    # -- threads ----------------------------------------------------------------------------
    async def _kafka(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._kafka_thread, fn)

    async def _database(
        self, what: str, fn: Callable[[psycopg.Connection[tuple[object, ...]]], T]
    ) -> T:
        def call() -> T:
            return self._db.run(what, fn, self._halt)

        return await asyncio.get_running_loop().run_in_executor(self._db_thread, call)

    def _db_retry(self, what: str, reason: str, delay: float) -> None:
        log.warning(
            "webhooks: %s: database unavailable (%s); retrying in %.1fs", what, reason, delay
        )
