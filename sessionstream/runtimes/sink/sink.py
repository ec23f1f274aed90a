"""`sessionstream sink`: `session.events` -> PostgreSQL, exactly once.

A `read_committed` consumer; each batch is one PostgreSQL transaction holding the events,
the projection and the sink's offsets (`sink_offsets`). On assignment the consumer seeks to
the offsets stored in PostgreSQL, so whatever Kafka's committed offsets say (they are
committed afterwards, only so that lag shows in the usual tools), no event is skipped and
none is written twice. A lost database is retried with backoff; a single-writer violation
stops the sink loudly.

A consumer that stays out of the group's steady state for `sink_stall_s` (it lost its
partitions and never rejoined, or its client stopped reporting) is replaced by a new one:
librdkafka's statistics say which state the group membership is in.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from functools import partial

import psycopg

from sessionstream.adapters import metrics
from sessionstream.adapters.kafka import (
    LIVE_FETCH_WAIT_MS,
    OFFSET_BEGINNING,
    CommandProducer,
    GroupConsumer,
    Message,
    TopicPartition,
    close_in_background,
    data_messages,
    new_command_producer,
    new_group_consumer,
)
from sessionstream.adapters.postgres import Reconnecting
from sessionstream.adapters.postgres.migrate import migrate
from sessionstream.adapters.registry import SchemaRegistry
from sessionstream.errors import ErasureIncomplete, IncompatibleEvent, KafkaFailed
from sessionstream.runtimes.sink.writer import PendingEvent, WriteMode, write_batch
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.errors import DecodeError
from sessionstream.settings import Settings

__all__ = ["Sink", "SinkStats"]

log = logging.getLogger("sessionstream.sink")


@dataclass
class SinkStats:
    batches: int = 0
    events: int = 0
    retries: int = 0
    consumers_replaced: int = 0
    last_batch_ms: float = 0.0
    batch_ms: list[float] = field(default_factory=list)


class Sink:
    """Consume events, write them in batches; one instance per process."""

    def __init__(
        self,
        settings: Settings,
        *,
        batch_size: int = 1000,
        linger_ms: int = 20,
        mode: WriteMode = "copy",
        schema: str | None = None,
        group: str | None = None,
        max_backoff_s: float = 10.0,
    ) -> None:
        self.settings = settings
        self.batch_size = batch_size
        self.linger_ms = linger_ms
        self.mode: WriteMode = mode
        self.schema = schema or settings.database_schema
        self.group = group or f"{settings.processor_group}-sink"
        #: reads events of any registry id; told to stop waiting for the registry by run()
        self.registry = SchemaRegistry(settings) if settings.schema_registry_url else None
        self.codec = Codec(schemas=self.registry)
        self.stats = SinkStats()
        self.ready = threading.Event()
        self._db = Reconnecting(
            settings, self.schema, max_backoff_s=max_backoff_s, on_retry=self._retried
        )
        self._consumer: GroupConsumer | None = None
        #: tombstones of erased sessions' event keys; made at the first erasure
        self._producer: CommandProducer | None = None
        #: the next offset past the last tombstone of the batch read, per partition
        self._passed: dict[tuple[str, int], int] = {}
        self.stall_s = settings.sink_stall_s
        self._watch_new_consumer()
        # the end of the last batch written: the loop did not poll while it wrote (a
        # database outage can hold it for minutes), so silence and rejoining count from here
        self._wrote_at = 0.0

    # -- database ---------------------------------------------------------------------------
    def _retried(self, what: str, reason: str, delay: float) -> None:
        self.stats.retries += 1
        log.warning("%s: database unavailable (%s); retrying in %.1fs", what, reason, delay)

    def _retrying(self, what: str, fn, stop: threading.Event | None = None):  # type: ignore[no-untyped-def]
        """Run `fn(conn)`; on a lost database, reconnect with exponential backoff."""
        return self._db.run(what, fn, stop)

    def stored_offsets(self, conn: psycopg.Connection[tuple[object, ...]]) -> dict[int, int]:
        rows = conn.execute(
            "select partition, next_offset from sink_offsets where topic = %s",
            (self.settings.events_topic,),
        ).fetchall()
        conn.commit()
        return {int(p): int(o) for p, o in rows}  # type: ignore[call-overload]

    # -- kafka ------------------------------------------------------------------------------
    def start(self) -> None:
        # a database restarting while the sink starts is waited out, as in the loop
        self._retrying(
            "migrating", lambda _conn: migrate(self.settings.database_conninfo, schema=self.schema)
        )
        self._subscribe()

    def _subscribe(self) -> None:
        # offsets live in PostgreSQL with the rows: the group only assigns partitions
        self._watch_new_consumer()
        self._consumer = new_group_consumer(
            self.settings,
            self.group,
            **{
                "fetch.wait.max.ms": LIVE_FETCH_WAIT_MS,
                "statistics.interval.ms": int(min(5.0, self.stall_s / 3) * 1000),
                "stats_cb": self._on_stats,
            },
        )
        self._consumer.subscribe([self.settings.events_topic], on_assign=self._on_assign)

    def _watch_new_consumer(self) -> None:
        """The group membership as librdkafka's statistics last reported it: a new consumer
        is not steady yet."""
        now = time.monotonic()
        self._steady, self._unsteady_since, self._last_stats = False, now, now
        self._join_state = "init"

    def _on_stats(self, raw: str) -> None:
        cgrp = json.loads(raw).get("cgrp") or {}
        now = time.monotonic()
        self._last_stats = now
        self._join_state = f"{cgrp.get('state', '?')}/{cgrp.get('join_state', '?')}"
        steady = cgrp.get("state") == "up" and cgrp.get("join_state") == "steady"
        if self._steady and not steady:
            self._unsteady_since = now
        self._steady = steady

    def _stalled(self) -> str | None:
        """Why the consumer must be replaced, or None while it is healthy."""
        now = time.monotonic()
        silent = now - max(self._last_stats, self._wrote_at)
        if silent > self.stall_s:
            return f"its client reported nothing for {silent:.0f}s"
        unsteady = now - max(self._unsteady_since, self._wrote_at)
        if not self._steady and unsteady > self.stall_s:
            return (
                f"it has been out of the group's steady state for {unsteady:.0f}s "
                f"(now {self._join_state})"
            )
        return None

    def _replace_consumer(self, why: str) -> None:
        """A new member in place of a stuck one; the old one closes in the background (a
        stuck client may not close promptly) and its partitions come back after its session
        ends. Writing resumes from PostgreSQL's offsets, so nothing is skipped or doubled."""
        log.warning("the sink's consumer is stuck: %s; replacing it", why)
        metrics.SINK_CONSUMER_REPLACED.inc()
        self.stats.consumers_replaced += 1
        old, self._consumer = self._consumer, None
        if old is not None:
            close_in_background(old)
        self._subscribe()

    def _on_assign(self, consumer: GroupConsumer, partitions: list[TopicPartition]) -> None:
        stored = self._retrying("reading sink offsets", self.stored_offsets)
        start = [
            TopicPartition(tp.topic, tp.partition, stored.get(tp.partition, OFFSET_BEGINNING))
            for tp in partitions
        ]
        consumer.assign(start)
        log.info(
            "assigned %s from offsets %s",
            sorted(tp.partition for tp in partitions),
            {tp.partition: stored.get(tp.partition, 0) for tp in partitions},
        )
        self.ready.set()

    def _collect(self) -> list[Message]:
        assert self._consumer is not None
        first = self._consumer.poll(0.1)
        if first is None:
            return []
        batch = [first]
        deadline = time.monotonic() + self.linger_ms / 1000
        while len(batch) < self.batch_size:
            left = deadline - time.monotonic()
            more = self._consumer.consume(self.batch_size - len(batch), timeout=max(left, 0))
            batch += more
            if left <= 0 or not more:
                break
        return batch

    def _decode(self, batch: list[Message]) -> list[PendingEvent]:
        """The batch's events; the tombstones' positions go to `self._passed`."""
        out = []
        self._passed = {}
        for msg in data_messages(batch, log):
            topic, p, offset = msg.topic(), msg.partition(), msg.offset()
            assert topic is not None and p is not None and offset is not None
            if msg.value() is None:
                # a tombstone: an erased session's key (our own, docs/protocol.md); nothing
                # to write, but the sink's position moves past it
                self._passed[(topic, p)] = offset + 1
                continue
            try:
                event = self.codec.decode_event(msg.value() or b"")
            except DecodeError as e:
                # the processor writes every event; one we cannot read means a schema we do
                # not know yet (a newer processor): stop rather than skip history
                raise IncompatibleEvent(
                    f"undecodable event at {topic}[{p}]@{offset}: {e}; upgrade the sink"
                ) from e
            out.append(PendingEvent(event, topic, p, offset))
        return out

    def _write(
        self, pending: list[PendingEvent], conn: psycopg.Connection[tuple[object, ...]]
    ) -> dict[tuple[str, int], int]:
        return write_batch(conn, pending, self.mode, self._erase_keys, self._passed)

    def _erase_keys(self, partition: int, keys: list[bytes]) -> None:
        """Tombstones for an erased session's event keys, on the broker before the rows
        go (`sessionstream.runtimes.sink.erasure`)."""
        if self._producer is None:
            self._producer = new_command_producer(self.settings)
        failed: list[str] = []

        def delivered(err: object, _msg: object) -> None:
            if err is not None:
                failed.append(str(err))

        topic = self.settings.events_topic
        for key in keys:
            self._producer.produce(
                topic, key=key, value=None, partition=partition, on_delivery=delivered
            )
        left = self._producer.flush(30)
        if left or failed:
            raise ErasureIncomplete(
                f"{left} tombstones undelivered, {len(failed)} failed"
                + (f": {failed[0]}" if failed else "")
            )

    def run(self, stop: threading.Event | None = None) -> None:
        if self._consumer is None:
            self.start()
        assert self._consumer is not None
        stop = stop or threading.Event()
        if self.registry is not None:
            self.registry.stop = stop
        try:
            while not stop.is_set():
                why = self._stalled()
                if why is not None:
                    self._replace_consumer(why)
                batch = self._collect()
                if not batch:
                    continue
                pending = self._decode(batch)
                if not pending and not self._passed:
                    continue
                t0 = time.perf_counter()
                nxt = self._retrying("writing a batch", partial(self._write, pending), stop)
                self._wrote_at = time.monotonic()
                ms = (time.perf_counter() - t0) * 1000
                self.stats.batches += 1
                self.stats.events += len(pending)
                self.stats.last_batch_ms = ms
                metrics.SINK_EVENTS.inc(len(pending))
                metrics.SINK_BATCH_SECONDS.observe(ms / 1000)
                self._report_lag(nxt)
                # informational: lets the usual tools show the sink's lag
                self._consumer.commit_async([TopicPartition(t, p, o) for (t, p), o in nxt.items()])
        finally:
            self.close()

    def _report_lag(self, nxt: dict[tuple[str, int], int]) -> None:
        """Lag per partition from the watermarks the last fetch brought (no extra request)."""
        assert self._consumer is not None
        for (topic, p), offset in nxt.items():
            try:
                _low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, p), cached=True
                )
            except KafkaFailed:
                continue
            if high >= 0:
                metrics.SINK_LAG.labels(str(p)).set(max(0, high - offset))

    def close(self) -> None:
        if self._consumer is not None:
            _close_quietly(self._consumer)
            self._consumer = None
        self._db.close()


def _close_quietly(consumer: GroupConsumer) -> None:
    with contextlib.suppress(KafkaFailed, RuntimeError):
        consumer.close()
