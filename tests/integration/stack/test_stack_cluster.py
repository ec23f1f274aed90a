"""The 3-node cluster (`SESSIONSTREAM_KAFKA_BROKERS=3 make up`): replication as in production.

Starts the profile (idempotent `stack.sh up`, next to the default stack) and leaves it
running. A topic gets replication factor 3 and `min.insync.replicas=2`; with one node
killed (-9) it stays writable with acks=all, transactions go on (their coordinator being
the node killed), and the node rejoins every ISR once started again.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from sessionstream.adapters.topics import check_topics, ensure_topics
from sessionstream.settings import Settings
from stack.worlds import world_topics
from tests.integration.helpers import wait_until
from tests.integration.procs import TOPIC_FIELDS
from tests.integration.stack_profiles import (
    Profile,
    isr_full,
    partitions,
    running,
    stack,
    txn_coordinator,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster() -> Iterator[Profile]:
    with running("cluster") as profile:
        yield profile


@pytest.fixture
def admin(cluster: Profile) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap})


@pytest.fixture
def topic(admin: AdminClient) -> Iterator[str]:
    """A new topic with the cluster's default replication (3) and 3 partitions."""
    name = f"it-cluster-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(name, num_partitions=3)])[name].result(timeout=30)
    wait_until(lambda: isr_full(admin, name, 3), timeout=30, what=f"{name} fully replicated")
    yield name
    admin.delete_topics([name])[name].result(timeout=60)


def _produce_all(bootstrap: str, topic: str, n: int, timeout: float = 60.0) -> list[str]:
    """n records with acks=all over every partition; the delivery errors (empty: all in)."""
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "message.timeout.ms": int(timeout * 1000),
        }
    )
    errors: list[str] = []

    def done(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    for i in range(n):
        p.produce(topic, f"v{i}".encode(), partition=i % 3, on_delivery=done)
    left = p.flush(timeout + 10)
    return errors + ([f"{left} not acknowledged"] if left else [])


def _transaction(bootstrap: str, transactional_id: str, topic: str, n: int) -> None:
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": 30000,
        }
    )
    p.init_transactions(60)
    p.begin_transaction()
    for i in range(n):
        p.produce(topic, f"t{i}".encode(), partition=i % 3)
    p.commit_transaction(60)


def _read_committed(bootstrap: str, topic: str) -> list[bytes]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"it-cluster-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(3)])
        values: list[bytes] = []
        ended: set[int] = set()

        def all_read() -> bool:
            msg = c.poll(0.2)
            if msg is not None:
                err = msg.error()
                if err is None:
                    values.append(msg.value() or b"")
                elif err.code() == KafkaError._PARTITION_EOF:
                    ended.add(msg.partition() or 0)
            return len(ended) == 3

        wait_until(all_read, timeout=60, interval=0, what=f"reading {topic} to its end")
        return values
    finally:
        c.close()


def test_three_brokers_replicate_everything(cluster: Profile, admin: AdminClient) -> None:
    assert cluster.nodes == 3
    assert sorted(admin.list_topics(timeout=10).brokers) == [1, 2, 3]
    # the broker defaults a production cluster has (read from node 1)
    res = ConfigResource(ConfigResource.Type.BROKER, "1")
    broker = {k: v.value for k, v in admin.describe_configs([res])[res].result().items()}
    assert broker["default.replication.factor"] == "3"
    assert broker["min.insync.replicas"] == "2"
    assert broker["offsets.topic.replication.factor"] == "3"
    assert broker["transaction.state.log.replication.factor"] == "3"
    assert broker["transaction.state.log.min.isr"] == "2"
    # sessionstream's own topics, created as on a real cluster
    tag = uuid.uuid4().hex[:8]
    s = Settings(kafka_bootstrap=cluster.bootstrap, replication_factor=3).model_copy(
        update={f: f"it.cluster.{f.removesuffix('_topic')}.{tag}" for f in TOPIC_FIELDS}
    )
    ensure_topics(s)
    check_topics(s)
    for name in world_topics(s):

        def replicated(n: str = name) -> bool:
            return isr_full(admin, n, 3)

        wait_until(replicated, timeout=30, what=f"{name} replicated")
        for _leader, replicas, isr in partitions(admin, name).values():
            assert sorted(replicas) == [1, 2, 3] and sorted(isr) == [1, 2, 3], name
        res = ConfigResource(ConfigResource.Type.TOPIC, name)
        config = admin.describe_configs([res])[res].result()
        assert config["min.insync.replicas"].value == "2", name


def test_one_node_killed_the_cluster_stays_writable_and_it_rejoins(
    cluster: Profile, admin: AdminClient, topic: str
) -> None:
    txn_id = f"it-cluster-txn-{uuid.uuid4().hex[:8]}"
    # the transaction log exists (RF 3) once a first transaction ran
    _transaction(cluster.bootstrap, txn_id, topic, 3)
    victim = txn_coordinator(admin, txn_id)
    assert victim in (1, 2, 3)
    stack("cluster", "kill-node", str(victim))
    try:
        # the node is fenced and leaves every ISR; the others lead its partitions
        wait_until(
            lambda: victim not in admin.list_topics(timeout=10).brokers,
            timeout=30,
            what=f"node {victim} to be fenced",
        )
        wait_until(lambda: isr_full(admin, topic, 2), timeout=30, what="ISR of 2 everywhere")
        # acks=all still succeeds: two in-sync replicas are min.insync.replicas
        assert _produce_all(cluster.bootstrap, topic, 30) == []
        # a producer with the same transactional id finds the moved coordinator
        assert txn_coordinator(admin, txn_id) != victim
        _transaction(cluster.bootstrap, txn_id, topic, 6)
        values = _read_committed(cluster.bootstrap, topic)
        assert sum(v.startswith(b"t") for v in values) == 9
        assert sum(v.startswith(b"v") for v in values) == 30
    finally:
        stack("cluster", "start-node", str(victim))
    wait_until(
        lambda: isr_full(admin, topic, 3), timeout=90, what=f"node {victim} back in every ISR"
    )
    assert sorted(admin.list_topics(timeout=10).brokers) == [1, 2, 3]
