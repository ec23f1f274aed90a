"""Reading topics: one loop to the end of partitions (optionally following them), with one
error policy, for every reader sessionstream has (processor restore, worker feeds, log
checks, replay).

The policy: a partition's end (`_PARTITION_EOF`) finishes that partition; a fatal error
raises `KafkaUnavailable`; anything else (a broker restarting, a leader moving) is logged
and waited out — librdkafka reconnects by itself — until the deadline, if there is one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, Message
from confluent_kafka import TopicPartition as _TP

from sessionstream.adapters.kafka.clients import Reader, new_reader
from sessionstream.adapters.kafka.config import END_FETCH_WAIT_MS, LIVE_FETCH_WAIT_MS
from sessionstream.adapters.kafka.errors import failure
from sessionstream.errors import KafkaFailed, KafkaUnavailable
from sessionstream.settings import Settings

__all__ = [
    "LogRecord",
    "data_messages",
    "end_offset",
    "log_bounds",
    "offsets_at",
    "partitions_of",
    "read_messages",
    "read_records",
    "read_topic",
    "take",
]

log = logging.getLogger("sessionstream.adapters.kafka")

#: records fetched per call (the reader decodes nothing; its caller decides what to)
_BATCH = 5000

#: (topic, partition) -> first offset to read (OFFSET_BEGINNING by default)
Start = Mapping[tuple[str, int], int]


@dataclass(frozen=True)
class LogRecord:
    """One consumed record, detached from the client."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]
    #: the record's timestamp (ms): the broker's append time on a LogAppendTime topic
    timestamp: int = 0


def take(consumer: Reader, n: int, timeout: float) -> list[Message]:
    """Up to `n` messages: as soon as one is there (or [] after `timeout` s), with what else
    is already fetched. Not `consumer.consume(n, timeout)`: librdkafka's batch consume waits
    for `n` messages or the whole timeout, so a live reader would add up to `timeout` to
    every record it hands on (measured: 0-50 ms, p50 26 ms, for consume(1000, 0.05))."""
    first = consumer.poll(timeout)
    if first is None:
        return []
    return [first, *consumer.consume(n - 1, 0)] if n > 1 else [first]


def _record(msg: Message) -> LogRecord:
    topic, p, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and p is not None and offset is not None
    headers: dict[str, bytes] = {}
    raw: list[tuple[str, Any]] = list(msg.headers() or [])  # type: ignore[arg-type]
    for k, v in raw:
        headers[str(k)] = v if isinstance(v, bytes) else str(v or "").encode()
    return LogRecord(topic, p, offset, msg.key(), msg.value(), headers, msg.timestamp()[1])


def data_messages(batch: list[Message], logger: logging.Logger = log) -> list[Message]:
    """The records of a consumed batch. librdkafka also hands out error events (a broker
    going away, a partition at its end); those are logged and dropped — the client
    reconnects by itself — except fatal ones, which end the process."""
    out = []
    for msg in batch:
        err = msg.error()
        if err is None:
            out.append(msg)
        elif err.fatal() or err.code() == KafkaError._FATAL:
            # a fatal consumer error arrives as a _FATAL event whose fatal() is False
            raise failure(err, "consumer")
        else:
            logger.warning("consumer: %s", err)
    return out


#: how long a one-shot tool (replay, rebuild) waits for a topic's metadata
METADATA_WAIT_S = 30.0


def partitions_of(
    consumer: Reader,
    topic: str,
    stop: threading.Event | None = None,
    *,
    timeout: float | None = None,
    bootstrap: str = "",
) -> list[int]:
    """The topic's partitions; a broker restarting (or a topic not created yet) is waited
    out until `stop` is set (then: empty), or for `timeout` seconds (then `KafkaUnavailable`
    naming the topic: a one-shot tool must not wait forever for a misspelt topic)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        why: object
        try:
            t = consumer.list_topics(topic, timeout=10).topics.get(topic)
            if t is not None and t.error is None and t.partitions:
                return sorted(t.partitions)
            why = t and t.error
            log.warning("topic %s not available yet (%s); retrying", topic, why)
        except KafkaFailed as e:
            if e.fatal:
                raise
            why = e.reason
            log.warning("metadata of %s: %s; retrying", topic, why)
        if deadline is not None and time.monotonic() > deadline:
            raise KafkaUnavailable(
                f"topic {topic} is not available after {timeout:g}s ({why}): does it exist? "
                "(`sessionstream topics create` makes the protocol's topics)",
                bootstrap=bootstrap,
            )
        if stop is None:
            time.sleep(0.5)
        elif stop.wait(0.5):
            return []


def end_offset(consumer: Reader, topic: str, partition: int, stop: threading.Event) -> int:
    """Where the partition ends now (read_committed: its stable offset). A broker
    restarting answers NOT_LEADER or times out for a while: that is waited out."""
    tp = _TP(topic, partition)
    while True:
        try:
            return int(consumer.get_watermark_offsets(tp, timeout=30, cached=False)[1])
        except KafkaFailed as e:
            if e.fatal or stop.is_set():
                raise
            log.warning("end of %s[%s]: %s; retrying", topic, partition, e.reason)
            stop.wait(0.5)


#: what ListOffsets answers while a partition's leadership moves (a broker stopped or
#: killed, a new leader not yet caught up): asked again, within the caller's time
LEADER_MOVING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.REPLICA_NOT_AVAILABLE,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError._TRANSPORT,
    }
)


def watermarks(consumer: Reader, tp: _TP, deadline: float) -> tuple[int, int]:
    """`consumer.get_watermark_offsets(tp)`, asked again every 0.2 s while the answer is
    one of `LEADER_MOVING` and `deadline` (time.monotonic) has not passed."""
    while True:
        left = deadline - time.monotonic()
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=max(left, 0.1), cached=False)
            return int(low), int(high)
        except KafkaFailed as e:
            if e.code not in LEADER_MOVING or left <= 0.2:
                raise
            log.info("offsets of %s[%s]: %s; asking again", tp.topic, tp.partition, e.reason)
            time.sleep(0.2)


def log_bounds(
    settings: Settings, coords: Iterable[tuple[str, int]], timeout: float = 30.0
) -> dict[tuple[str, int], tuple[int, int]]:
    """(first offset, end offset) of each (topic, partition), read_committed (the end is
    the last stable offset). A leader moving meanwhile (`LEADER_MOVING`) is waited out
    for up to `timeout` in all: a processor restoring just after a broker died must not
    give up on the first NOT_LEADER."""
    consumer = new_reader(settings, read_committed=True)
    deadline = time.monotonic() + timeout
    try:
        out: dict[tuple[str, int], tuple[int, int]] = {}
        for topic, p in coords:
            out[(topic, p)] = watermarks(consumer, _TP(topic, p), deadline)
        return out
    except KafkaFailed as e:
        raise KafkaUnavailable(
            f"log offsets: {e.reason}",
            bootstrap=settings.kafka_bootstrap,
        ) from e
    finally:
        consumer.close()


def offsets_at(settings: Settings, topic: str, partitions: list[int], ts_ms: int) -> dict[int, int]:
    """Per partition of `topic`, the first offset whose record's timestamp is at or after
    `ts_ms` (epoch ms), or the partition's end when none is (Kafka's `offsets_for_times`)."""
    consumer = new_reader(settings)
    try:
        asked = [_TP(topic, p, ts_ms) for p in partitions]
        out = {}
        for tp in consumer.offsets_for_times(asked, timeout=METADATA_WAIT_S):
            if tp.offset < 0:  # nothing at or after the time: the partition's end
                _low, high = consumer.get_watermark_offsets(
                    _TP(topic, tp.partition), timeout=METADATA_WAIT_S, cached=False
                )
                out[tp.partition] = int(high)
            else:
                out[tp.partition] = int(tp.offset)
        return out
    except KafkaFailed as e:
        raise KafkaUnavailable(
            f"offsets of {topic} at {ts_ms}: {e.reason}", bootstrap=settings.kafka_bootstrap
        ) from e
    finally:
        consumer.close()


def read_records(
    settings: Settings,
    topics: Mapping[str, Iterable[int] | None],
    *,
    start: Start | None = None,
    end: Start | None = None,
    follow: threading.Event | None = None,
    on_caught_up: Callable[[], None] | None = None,
    timeout: float | None = 60.0,
    group_id: str | None = None,
    read_committed: bool = True,
    poll_s: float = 0.2,
) -> Iterator[LogRecord]:
    """The records of `topics` (topic -> partitions, None: all of them) from `start` (or
    their beginning), up to `end` (exclusive) or their end now. With `follow`, reading goes
    on past the end (`on_caught_up` is called once there) until `follow` is set."""
    for msg in read_messages(
        settings,
        topics,
        start=start,
        end=end,
        follow=follow,
        on_caught_up=on_caught_up,
        timeout=timeout,
        group_id=group_id,
        read_committed=read_committed,
        poll_s=poll_s,
    ):
        yield _record(msg)


def read_messages(
    settings: Settings,
    topics: Mapping[str, Iterable[int] | None],
    *,
    start: Start | None = None,
    end: Start | None = None,
    follow: threading.Event | None = None,
    on_caught_up: Callable[[], None] | None = None,
    timeout: float | None = 60.0,
    group_id: str | None = None,
    read_committed: bool = True,
    poll_s: float = 0.2,
) -> Iterator[Message]:
    """`read_records`, as the client's own messages (never an error message): for readers
    that look at most records' keys only (replay by session or run) or read every record
    in bulk (rebuild), where building a `LogRecord` per record would be most of the work."""
    consumer = new_reader(
        settings,
        group_id=group_id,
        read_committed=read_committed,
        eof=True,
        # a follower asks as seldom as a live reader does once it is at the end; its
        # catching up (the ends it must see) waits one such fetch
        fetch_wait_ms=END_FETCH_WAIT_MS if follow is None else LIVE_FETCH_WAIT_MS,
        # large fetches: a reader is after throughput (the processor's own consumer
        # keeps the defaults)
        **{"max.partition.fetch.bytes": 8 << 20},
    )
    halt = follow or threading.Event()
    try:
        assign = []
        for topic, parts in topics.items():
            for p in partitions_of(consumer, topic, halt) if parts is None else parts:
                first = (start or {}).get((topic, p), OFFSET_BEGINNING)
                last = None if end is None else end.get((topic, p))
                if last is not None and first != OFFSET_BEGINNING and first >= last:
                    continue
                assign.append(_TP(topic, p, first))
        consumer.assign(assign)
        pending = {(tp.topic, tp.partition) for tp in assign}
        deadline = None if timeout is None or follow is not None else time.monotonic() + timeout
        caught_up = not pending
        if caught_up and follow is None:
            return
        if caught_up and on_caught_up is not None:
            on_caught_up()
        while not halt.is_set():
            if deadline is not None and time.monotonic() > deadline:
                raise KafkaUnavailable(
                    f"reading {sorted(pending)}: not at their end after {timeout}s",
                    bootstrap=settings.kafka_bootstrap,
                )
            for msg in take(consumer, _BATCH, poll_s):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard((msg.topic() or "", msg.partition() or 0))
                    elif err.fatal():
                        raise KafkaUnavailable(
                            f"reading {msg.topic()}: {err}", bootstrap=settings.kafka_bootstrap
                        ) from failure(err)
                    else:
                        log.warning("reading %s: %s", msg.topic(), err)  # a broker restarting
                    continue
                if end is not None:
                    tp = (msg.topic() or "", msg.partition() or 0)
                    stop_at = end.get(tp)
                    if stop_at is not None and (msg.offset() or 0) >= stop_at:
                        pending.discard(tp)
                        continue
                yield msg
            if not pending and not caught_up:
                caught_up = True
                if follow is None:
                    return
                if on_caught_up is not None:
                    on_caught_up()
    finally:
        consumer.close()


def read_topic(
    settings: Settings,
    topic: str,
    *,
    read_committed: bool = True,
    timeout: float = 60.0,
    partitions: Iterable[int] | None = None,
    group_id: str | None = None,
) -> list[LogRecord]:
    """Every record of `topic` (or of its `partitions`) up to its end now."""
    return list(
        read_records(
            settings,
            {topic: partitions},
            timeout=timeout,
            group_id=group_id,
            read_committed=read_committed,
        )
    )
