"""Transactions against the real broker, with confluent-kafka and with aiokafka.

A committed transaction is visible to a read_committed consumer, an aborted one is not (but
is in the log, which a read_uncommitted consumer shows), and a second producer with the
same transactional.id fences the first: the zombie gets the specific fencing error.
"""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import ProducerFenced
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from stack.worlds import delete_groups
from tests.integration.conftest import TopicFactory
from tests.integration.helpers import await_until, wait_until

pytestmark = pytest.mark.integration

END = b"end"


def _values_until_end(bootstrap: str, topic: str, isolation: str) -> list[bytes]:
    """Values of partition 0 up to the END marker (the last committed record of each test)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{topic}-{isolation}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []

    def at_end() -> bool:
        msg = consumer.poll(0.5)
        if msg is None:
            return False
        assert msg.error() is None, msg.error()
        value = msg.value()
        assert isinstance(value, bytes)
        if value == END:
            return True
        values.append(value)
        return False

    try:
        wait_until(
            at_end,
            timeout=30,
            interval=0,
            what=lambda: f"the END marker in {topic} ({isolation}); got {values}",
        )
    finally:
        consumer.close()
    return values


def _transactional(bootstrap: str, transactional_id: str) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "partitioner": "murmur2_random",
        }
    )
    producer.init_transactions(30)
    return producer


def _in_transaction(producer: Producer, topic: str, value: bytes, *, commit: bool) -> None:
    producer.begin_transaction()
    producer.produce(topic, key=b"k", value=value, partition=0)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.flush(30)  # the record really reaches the log before the abort
        producer.abort_transaction(30)


def test_confluent_committed_visible_aborted_not(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(partitions=1)
    producer = _transactional(kafka_bootstrap, f"it-tx-{uuid.uuid4()}")

    _in_transaction(producer, topic, b"committed-1", commit=True)
    _in_transaction(producer, topic, b"aborted", commit=False)
    _in_transaction(producer, topic, b"committed-2", commit=True)
    _in_transaction(producer, topic, END, commit=True)

    assert _values_until_end(kafka_bootstrap, topic, "read_committed") == [
        b"committed-1",
        b"committed-2",
    ]
    assert _values_until_end(kafka_bootstrap, topic, "read_uncommitted") == [
        b"committed-1",
        b"aborted",
        b"committed-2",
    ]


def test_confluent_zombie_is_fenced(kafka_bootstrap: str, topic_factory: TopicFactory) -> None:
    topic = topic_factory(partitions=1)
    transactional_id = f"it-tx-{uuid.uuid4()}"
    zombie = _transactional(kafka_bootstrap, transactional_id)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"zombie-open", partition=0)
    zombie.flush(30)

    # A newer instance with the same id bumps the epoch and aborts the zombie's open transaction.
    successor = _transactional(kafka_bootstrap, transactional_id)

    with pytest.raises(KafkaException) as caught:
        zombie.produce(topic, value=b"zombie-late", partition=0)
        zombie.flush(30)
        zombie.commit_transaction(30)
    error = caught.value.args[0]
    assert error.code() == KafkaError._FENCED, error
    assert error.fatal()

    _in_transaction(successor, topic, b"successor", commit=True)
    _in_transaction(successor, topic, END, commit=True)
    assert _values_until_end(kafka_bootstrap, topic, "read_committed") == [b"successor"]


async def _aio_values_until_end(bootstrap: str, topic: str, isolation: str) -> list[bytes]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level=isolation,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        consumer.assign([AioTopicPartition(topic, 0)])
        values: list[bytes] = []

        async def at_end() -> bool:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for record in records:
                    if record.value == END:
                        return True
                    values.append(record.value)
            return False

        await await_until(
            at_end,
            timeout=30,
            interval=0,
            what=lambda: f"the END marker in {topic} ({isolation}); got {values}",
        )
        return values
    finally:
        await consumer.stop()


async def _aio_transactional(bootstrap: str, transactional_id: str) -> AIOKafkaProducer:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id)
    await producer.start()
    return producer


async def test_aiokafka_committed_visible_aborted_not(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(partitions=1)
    producer = await _aio_transactional(kafka_bootstrap, f"it-tx-{uuid.uuid4()}")
    try:
        async with producer.transaction():
            await producer.send_and_wait(topic, b"committed-1", key=b"k", partition=0)
        await producer.begin_transaction()
        await producer.send_and_wait(topic, b"aborted", key=b"k", partition=0)
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send_and_wait(topic, b"committed-2", key=b"k", partition=0)
        async with producer.transaction():
            await producer.send_and_wait(topic, END, key=b"k", partition=0)
    finally:
        await producer.stop()

    assert await _aio_values_until_end(kafka_bootstrap, topic, "read_committed") == [
        b"committed-1",
        b"committed-2",
    ]
    assert await _aio_values_until_end(kafka_bootstrap, topic, "read_uncommitted") == [
        b"committed-1",
        b"aborted",
        b"committed-2",
    ]


async def test_aiokafka_zombie_is_fenced(kafka_bootstrap: str, topic_factory: TopicFactory) -> None:
    topic = topic_factory(partitions=1)
    transactional_id = f"it-tx-{uuid.uuid4()}"
    zombie = await _aio_transactional(kafka_bootstrap, transactional_id)
    successor: AIOKafkaProducer | None = None
    try:
        await zombie.begin_transaction()
        await zombie.send_and_wait(topic, b"zombie-open", partition=0)

        successor = await _aio_transactional(kafka_bootstrap, transactional_id)

        with pytest.raises(ProducerFenced):
            await zombie.send_and_wait(topic, b"zombie-late", partition=0)
            await zombie.commit_transaction()

        async with successor.transaction():
            await successor.send_and_wait(topic, b"successor", partition=0)
        async with successor.transaction():
            await successor.send_and_wait(topic, END, partition=0)
    finally:
        await zombie.stop()
        if successor is not None:
            await successor.stop()

    assert await _aio_values_until_end(kafka_bootstrap, topic, "read_committed") == [b"successor"]


def _delete_group(kafka_bootstrap: str, group: str) -> None:
    """The test's group holds committed offsets: it stays on the broker unless deleted."""
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    assert delete_groups(admin, [group]) == []


def test_confluent_consumer_offsets_commit_with_the_transaction(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    """Consume-transform-produce: offsets are committed only when the transaction commits."""
    source = topic_factory(partitions=1)
    group = f"it-group-{uuid.uuid4()}"
    consumer = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    producer = _transactional(kafka_bootstrap, f"it-tx-{uuid.uuid4()}")
    try:
        producer.begin_transaction()
        producer.send_offsets_to_transaction(
            [TopicPartition(source, 0, 3)], consumer.consumer_group_metadata(), 30
        )
        producer.abort_transaction(30)
        assert consumer.committed([TopicPartition(source, 0)], 30)[0].offset < 0

        producer.begin_transaction()
        producer.send_offsets_to_transaction(
            [TopicPartition(source, 0, 5)], consumer.consumer_group_metadata(), 30
        )
        producer.commit_transaction(30)
        assert consumer.committed([TopicPartition(source, 0)], 30)[0].offset == 5
    finally:
        consumer.close()
    _delete_group(kafka_bootstrap, group)


async def test_aiokafka_consumer_offsets_commit_with_the_transaction(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    """The path faust's exactly_once takes: offsets ride in the producer's transaction.

    aiokafka's OffsetFetch does not ask for stable offsets (KIP-447 require_stable), so right
    after a commit it may still return the previous value until the markers are written:
    poll for the committed offset, and check the aborted one is never seen on the way.
    """
    source = topic_factory(partitions=1)
    group = f"it-group-{uuid.uuid4()}"
    partition = AioTopicPartition(source, 0)
    producer = await _aio_transactional(kafka_bootstrap, f"it-tx-{uuid.uuid4()}")
    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka_bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        await producer.begin_transaction()
        await producer.send_offsets_to_transaction({partition: 3}, group)
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send_offsets_to_transaction({partition: 5}, group)

        observed: list[int | None] = []

        async def committed_is_5() -> bool:
            observed.append(await consumer.committed(partition))
            return observed[-1] == 5

        await await_until(committed_is_5, timeout=30, what=f"offset 5 committed for {group}")
        assert 3 not in observed, observed
    finally:
        await consumer.stop()
        await producer.stop()
    _delete_group(kafka_bootstrap, group)
