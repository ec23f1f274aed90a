"""Every Kafka client sessionstream makes is made here, by its role, and owned here: a
reader (assigned partitions only), a group member, a command producer, the processor's
transactional producer, an admin client. Each is a thin object around the driver's client
whose methods translate the driver's errors into `KafkaFailed` (`errors.translating`), so
nothing above the adapter handles a confluent-kafka exception; delivery reports and
rebalance callbacks get the translated error and the wrapping client. A configuration
librdkafka refuses is a `ConfigurationError` naming the role."""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka import (
    Consumer as _Consumer,
)
from confluent_kafka import (
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka import (
    Producer as _Producer,
)
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from sessionstream.adapters.kafka.config import (
    END_FETCH_WAIT_MS,
    client_config,
    command_producer_config,
    group_consumer_config,
    reader_config,
    transactional_producer_config,
)
from sessionstream.adapters.kafka.errors import failure, translating
from sessionstream.errors import ConfigurationError, KafkaFailed
from sessionstream.settings import Settings

__all__ = [
    "Admin",
    "CommandProducer",
    "DeliveryCallback",
    "GroupConsumer",
    "Reader",
    "RebalanceCallback",
    "TransactionalProducer",
    "close_in_background",
    "new_admin",
    "new_command_producer",
    "new_group_consumer",
    "new_reader",
    "new_transactional_producer",
]

C = TypeVar("C", _Consumer, _Producer, AdminClient)

#: a delivery report: the error (None: delivered) and the record
DeliveryCallback = Callable[[KafkaFailed | None, Message], None]


def _made(kind: type[C], role: str, conf: dict[str, Any]) -> C:
    try:
        return kind(conf)
    except (KafkaException, ValueError, TypeError) as e:
        raise ConfigurationError(f"the Kafka {role} could not be made: {e}") from e


class Reader:
    """A consumer that is only ever assigned partitions (or, as `GroupConsumer`, a group
    member). `driver` is the confluent-kafka client, for the adapter's own functions."""

    __slots__ = ("driver",)

    def __init__(self, driver: _Consumer) -> None:
        self.driver = driver

    @translating
    def poll(self, timeout: float = -1) -> Message | None:
        return self.driver.poll(timeout)

    @translating
    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        return self.driver.consume(num_messages, timeout)

    @translating
    def assign(self, partitions: list[TopicPartition]) -> None:
        self.driver.assign(partitions)

    @translating
    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self.driver.incremental_assign(partitions)

    @translating
    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        self.driver.incremental_unassign(partitions)

    @translating
    def unassign(self) -> None:
        self.driver.unassign()

    @translating
    def assignment(self) -> list[TopicPartition]:
        return self.driver.assignment()

    @translating
    def seek(self, partition: TopicPartition) -> None:
        self.driver.seek(partition)

    @translating
    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return self.driver.position(partitions)

    @translating
    def committed(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]:
        return self.driver.committed(partitions, timeout)

    @translating
    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        low, high = self.driver.get_watermark_offsets(partition, timeout, cached)
        return int(low), int(high)

    @translating
    def offsets_for_times(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]:
        return self.driver.offsets_for_times(partitions, timeout)

    @translating
    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        return self.driver.list_topics(topic, timeout)

    @translating
    def pause(self, partitions: list[TopicPartition]) -> None:
        self.driver.pause(partitions)

    @translating
    def resume(self, partitions: list[TopicPartition]) -> None:
        self.driver.resume(partitions)

    @translating
    def close(self) -> None:
        self.driver.close()


#: a rebalance callback: the group consumer and the partitions
RebalanceCallback = Callable[["GroupConsumer", list[TopicPartition]], None]


class GroupConsumer(Reader):
    """A member of a consumer group; the caller subscribes it."""

    __slots__ = ()

    @translating
    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        def bound(cb: RebalanceCallback | None) -> Any:
            # the driver calls back with its own client: the callback gets this one
            return None if cb is None else (lambda _c, parts: cb(self, parts))

        kwargs = {
            k: v
            for k, v in (
                ("on_assign", bound(on_assign)),
                ("on_revoke", bound(on_revoke)),
                ("on_lost", bound(on_lost)),
            )
            if v is not None
        }
        self.driver.subscribe(topics, **kwargs)

    @translating
    def consumer_group_metadata(self) -> Any:
        return self.driver.consumer_group_metadata()

    @translating
    def commit(self, offsets: list[TopicPartition]) -> list[TopicPartition]:
        """Commit `offsets`, synchronously."""
        return self.driver.commit(offsets=offsets, asynchronous=False)

    @translating
    def commit_async(self, offsets: list[TopicPartition]) -> None:
        """Commit `offsets` in the background: queued, not waited for (its outcome is
        served by a later poll)."""
        self.driver.commit(offsets=offsets, asynchronous=True)


class _Delivered:
    """A delivery report with the driver's error translated."""

    __slots__ = ("callback",)

    def __init__(self, callback: DeliveryCallback) -> None:
        self.callback = callback

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        self.callback(None if err is None else failure(err), msg)


class CommandProducer:
    """A producer (commands, or any plain records). `driver` is the confluent-kafka
    client."""

    __slots__ = ("driver",)

    def __init__(self, driver: _Producer) -> None:
        self.driver = driver

    @translating
    def produce(
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        partition: int = -1,
        on_delivery: DeliveryCallback | None = None,
        timestamp: int = 0,
        headers: Any = None,
    ) -> None:
        """Queue a record (BufferError: the local queue is full, as the driver says)."""
        self.driver.produce(
            topic,
            value=value,
            key=key,
            partition=partition,
            on_delivery=None if on_delivery is None else _Delivered(on_delivery),
            timestamp=timestamp,
            headers=headers,
        )

    @translating
    def poll(self, timeout: float = -1) -> int:
        return self.driver.poll(timeout)

    @translating
    def flush(self, timeout: float = -1) -> int:
        return self.driver.flush(timeout)

    @translating
    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        return self.driver.list_topics(topic, timeout)

    def __len__(self) -> int:
        return len(self.driver)


class TransactionalProducer(CommandProducer):
    """The processor's producer: one transactional id, one transaction at a time."""

    __slots__ = ()

    @translating
    def init_transactions(self, timeout: float = -1) -> None:
        self.driver.init_transactions(timeout)

    @translating
    def begin_transaction(self) -> None:
        self.driver.begin_transaction()

    @translating
    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float = -1
    ) -> None:
        self.driver.send_offsets_to_transaction(positions, group_metadata, timeout)

    @translating
    def commit_transaction(self, timeout: float = -1) -> None:
        self.driver.commit_transaction(timeout)

    @translating
    def abort_transaction(self, timeout: float = -1) -> None:
        self.driver.abort_transaction(timeout)


class Admin:
    """An admin client, for what the layers above need of one. `driver` is the
    confluent-kafka client."""

    __slots__ = ("driver",)

    def __init__(self, driver: AdminClient) -> None:
        self.driver = driver

    @translating
    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        return self.driver.list_topics(topic, timeout=timeout)

    @translating
    def latest_offsets(
        self,
        partitions: list[tuple[str, int]],
        *,
        committed: bool,
        timeout: float = 10.0,
    ) -> dict[tuple[str, int], int]:
        """Where each (topic, partition) ends now, asked in one request: the last stable
        offset (`committed`: what a read_committed reader gets to) or the high watermark."""
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
        got = self.driver.list_offsets(
            {TopicPartition(t, p): latest for t, p in partitions},
            isolation_level=level,
            request_timeout=timeout,
        )
        try:
            return {
                (tp.topic, tp.partition): int(f.result(timeout=timeout).offset)
                for tp, f in got.items()
            }
        except concurrent.futures.TimeoutError as e:
            raise KafkaFailed(
                f"end offsets: no answer in {timeout:g} s", name="_TIMED_OUT", timed_out=True
            ) from e

    @translating
    def create_topic(self, name: str, partitions: int = 1, timeout: float = 30.0) -> None:
        """Create a plain topic (replication factor 1): the smoke test's throwaway."""
        futures = self.driver.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1)]
        )
        futures[name].result(timeout=timeout)

    @translating
    def delete_topics(self, names: list[str], timeout: float = 30.0) -> None:
        for f in self.driver.delete_topics(names, operation_timeout=timeout).values():
            f.result(timeout=timeout)


def new_reader(
    settings: Settings,
    *,
    group_id: str | None = None,
    read_committed: bool = True,
    eof: bool = False,
    fetch_wait_ms: int = END_FETCH_WAIT_MS,
    **overrides: Any,
) -> Reader:
    """A consumer that is only ever assigned partitions (`reader_config`)."""
    conf = reader_config(
        settings,
        group_id=group_id,
        read_committed=read_committed,
        eof=eof,
        fetch_wait_ms=fetch_wait_ms,
        **overrides,
    )
    return Reader(_made(_Consumer, "reader", conf))


def new_group_consumer(settings: Settings, group_id: str, **overrides: Any) -> GroupConsumer:
    """A member of `group_id` (`group_consumer_config`); the caller subscribes it."""
    return GroupConsumer(
        _made(
            _Consumer,
            f"consumer of group {group_id}",
            group_consumer_config(settings, group_id, **overrides),
        )
    )


def close_in_background(consumer: GroupConsumer) -> None:
    """Close a group consumer given up for stuck, on a daemon thread of its own: a client
    stuck in its group membership may not close promptly, and the caller already runs a
    new one. Whatever the close raises is of no use to anyone."""

    def close() -> None:
        with contextlib.suppress(KafkaFailed, SystemError, RuntimeError):
            consumer.close()

    threading.Thread(target=close, name="close-stuck-consumer", daemon=True).start()


def new_command_producer(settings: Settings, **overrides: Any) -> CommandProducer:
    """A producer of commands (`command_producer_config`)."""
    conf = command_producer_config(settings, **overrides)
    return CommandProducer(_made(_Producer, "command producer", conf))


def new_transactional_producer(settings: Settings, transactional_id: str) -> TransactionalProducer:
    """The processor's producer with `transactional_id` (not initialized yet)."""
    conf = transactional_producer_config(settings, transactional_id)
    return TransactionalProducer(
        _made(_Producer, f"transactional producer {transactional_id}", conf)
    )


def new_admin(settings: Settings, **overrides: Any) -> Admin:
    """An admin client."""
    return Admin(_made(AdminClient, "admin client", client_config(settings, **overrides)))
