"""Round trips through the real broker with both Python clients the project uses."""

from __future__ import annotations

import time
from collections import defaultdict

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import (
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource

from sessionstream.adapters.kafka import TransactionalProducer, take
from sessionstream.errors import KafkaFailed
from tests.integration.conftest import TopicFactory
from tests.integration.helpers import wait_until

pytestmark = pytest.mark.integration

KEYS = [f"session-{i:03d}".encode() for i in range(64)]


def test_compacted_topic_is_created_with_its_config(
    kafka_admin: AdminClient, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(partitions=4, config={"cleanup.policy": "compact"})

    metadata = kafka_admin.list_topics(topic=topic, timeout=10)
    assert len(metadata.topics[topic].partitions) == 4

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = kafka_admin.describe_configs([resource])[resource].result(timeout=10)
    assert configs["cleanup.policy"].value == "compact"
    assert not configs["cleanup.policy"].is_default


def _produce_with_confluent(bootstrap: str, topic: str, partitioner: str) -> dict[bytes, int]:
    placed: dict[bytes, int] = {}

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        assert err is None, err
        key, partition = msg.key(), msg.partition()
        assert isinstance(key, bytes) and partition is not None
        placed[key] = partition

    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": partitioner})
    for key in KEYS:
        producer.produce(
            topic, key=key, value=b"confluent:" + partitioner.encode(), on_delivery=on_delivery
        )
    assert producer.flush(30) == 0
    assert len(placed) == len(KEYS)
    return placed


async def _produce_with_aiokafka(bootstrap: str, topic: str) -> dict[bytes, int]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)  # Java-compatible murmur2
    await producer.start()
    try:
        placed = {}
        for key in KEYS:
            meta = await producer.send_and_wait(topic, key=key, value=b"aiokafka")
            placed[key] = meta.partition
        return placed
    finally:
        await producer.stop()


def _read_partitions(bootstrap: str, topic: str, partitions: int, count: int) -> list[Message]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"{topic}-reader", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    seen: list[Message] = []

    def all_read() -> bool:
        msg = consumer.poll(0.5)
        if msg is not None:
            assert msg.error() is None, msg.error()
            seen.append(msg)
        return len(seen) >= count

    try:
        wait_until(
            all_read,
            timeout=30,
            interval=0,
            what=lambda: f"{count} records back from {topic} (read {len(seen)})",
        )
    finally:
        consumer.close()
    return seen


async def test_same_key_same_partition_from_confluent_and_aiokafka(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(partitions=4, config={"cleanup.policy": "compact"})

    by_confluent = _produce_with_confluent(kafka_bootstrap, topic, "murmur2_random")
    by_aiokafka = await _produce_with_aiokafka(kafka_bootstrap, topic)

    assert by_confluent == by_aiokafka
    assert len(set(by_confluent.values())) == 4, "64 keys should spread over all 4 partitions"

    # What the broker stored agrees with what the producers reported: one partition per key.
    partitions_of_key: dict[bytes, set[int]] = defaultdict(set)
    for msg in _read_partitions(kafka_bootstrap, topic, 4, count=2 * len(KEYS)):
        key, partition = msg.key(), msg.partition()
        assert isinstance(key, bytes) and partition is not None
        partitions_of_key[key].add(partition)
    assert {k: v for k, v in partitions_of_key.items() if len(v) != 1} == {}


def test_librdkafka_default_partitioner_would_split_a_session(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    """Why every confluent-kafka producer must set murmur2_random (see DESIGN.md, topics)."""
    topic = topic_factory(partitions=4)

    default = _produce_with_confluent(kafka_bootstrap, topic, "consistent_random")
    murmur2 = _produce_with_confluent(kafka_bootstrap, topic, "murmur2_random")

    assert any(default[k] != murmur2[k] for k in KEYS)


def test_take_hands_on_what_is_there_without_waiting_for_a_full_batch(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    """Every live reader (the gateway's SSE fan-out, the workers' event feeds, `follow`
    reads) gets records through `take`: librdkafka's `consume(n, timeout)` returns only
    when n records came or the whole timeout passed, which put up to that timeout on every
    live event. `take` returns as soon as one record is there, with the rest already
    fetched, and [] only once its timeout is over."""
    topic = topic_factory(partitions=1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(3):
        producer.produce(topic, key=b"s", value=str(i).encode())
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": f"{topic}-take",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[bytes | None] = []
        t0 = time.monotonic()
        while len(got) < 3 and time.monotonic() - t0 < 30:
            # a batch of 500 with a 60 s timeout: consume() would sit here for the full 60 s
            got += [m.value() for m in take(consumer, 500, 60)]
        took = time.monotonic() - t0
        assert got == [b"0", b"1", b"2"]
        assert took < 30, f"take waited {took:.1f}s for a batch that could never fill"
        t0 = time.monotonic()
        assert take(consumer, 500, 0.2) == []  # nothing more: [] once the timeout is over
        assert time.monotonic() - t0 >= 0.15
    finally:
        consumer.close()


def test_a_group_a_stopped_static_member_holds_is_deleted_once_its_session_ends(
    kafka_bootstrap: str, kafka_admin: AdminClient, topic_factory: TopicFactory
) -> None:
    """Processors are static members: closing one does not leave its group, which stays
    non-empty until the member's session times out, so a test world's or benchmark's
    processor group could not be deleted at teardown and stayed on the broker. Asked again
    for long enough, it goes; asked once, it is reported, not lost silently."""
    import uuid

    from stack.worlds import delete_groups

    topic = topic_factory(partitions=1)
    group = f"it-static-{uuid.uuid4().hex[:8]}"
    member = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": group,
            "group.instance.id": "static-1",
            "session.timeout.ms": 6000,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    member.subscribe([topic])

    def assigned() -> list[TopicPartition]:
        member.poll(0.2)
        return member.assignment()

    wait_until(assigned, timeout=30, interval=0, what="the static member to be assigned")
    member.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    member.close()  # a static member does not leave

    once = delete_groups(kafka_admin, [group])
    assert len(once) == 1 and group in once[0] and "NON_EMPTY" in once[0].upper(), once
    assert delete_groups(kafka_admin, [group], patience_s=20) == []
    left = kafka_admin.list_consumer_groups().result(timeout=30)
    assert group not in {g.group_id for g in left.valid}


def _fenced_flush(bootstrap: str, topic: str, tid: str) -> KafkaFailed | None:
    """A transactional producer (the adapter's client) with records not yet sent is fenced
    by a new producer with its id; what its flush() raises (None: nothing)."""
    conf = {"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 1000}
    reports: list[KafkaFailed | None] = []

    def on_delivery(err: KafkaFailed | None, msg: Message) -> None:
        reports.append(err)

    old = TransactionalProducer(Producer(conf))
    old.init_transactions(30)
    old.begin_transaction()
    for i in range(10):  # held back by the linger until the new producer fenced the id
        old.produce(topic, value=b"x", partition=i % 2, on_delivery=on_delivery)
    new = Producer(conf)
    new.init_transactions(30)  # fences `old`
    with pytest.raises(KafkaFailed) as committed:
        old.commit_transaction(30)  # commits flush: the same callbacks as flush()
    assert committed.value.fatal
    try:
        old.flush(10)
    except KafkaFailed as e:
        return e
    finally:  # the new producer owns the id: its transaction commits
        new.begin_transaction()
        new.produce(topic, value=b"y", partition=0)
        new.commit_transaction(30)
    return None


def test_a_fenced_producers_flush_reads_as_the_fence_through_the_adapter(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    """confluent-kafka may report a fenced transactional producer's flush as "SystemError:
    <the delivery callback> returned a result with an exception set": its error callback
    leaves the fatal KafkaException set while librdkafka serves the delivery reports
    (seen in CI: a processor exiting with a SystemError instead of its fence; here in
    4 of 6 separate processes, and in fewer within one, as it depends on the order the
    fatal error and the reports are served). Through the adapter's client a flush of a
    fenced producer raises nothing, the fatal fence, or (its error lost in a callback) a
    fatal failure, each as a `KafkaFailed`, never a
    SystemError (`tests/unit/runtimes/processor/test_commit_slots.py` pins the conversion
    itself)."""
    topic = topic_factory(partitions=2)
    for attempt in range(5):
        error = _fenced_flush(kafka_bootstrap, topic, f"{topic}-fenced-{attempt}")
        if error is not None:
            # the fence, or (its error lost in a delivery report's callback) a fatal failure
            assert error.fatal and (error.fenced or error.name == "_FATAL"), error
