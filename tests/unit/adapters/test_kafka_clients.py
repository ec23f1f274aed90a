"""Kafka clients are made by role in one place (`sessionstream.adapters.kafka.clients`): a
configuration librdkafka refuses is a `ConfigurationError` naming the role, not a driver
error, and what each role is made with is its profile's. No broker needed: librdkafka
checks a configuration when the client is made."""

from __future__ import annotations

import pytest

from sessionstream.adapters.kafka import (
    new_admin,
    new_command_producer,
    new_group_consumer,
    new_reader,
    new_transactional_producer,
)
from sessionstream.errors import ConfigurationError
from sessionstream.settings import Settings

# nothing listens there: making a client connects lazily, in librdkafka's threads
S = Settings(kafka_bootstrap="127.0.0.1:1")


@pytest.mark.parametrize(
    ("make", "role"),
    [
        (lambda **kw: new_reader(S, **kw), "reader"),
        (lambda **kw: new_group_consumer(S, "g-1", **kw), "consumer of group g-1"),
        (lambda **kw: new_command_producer(S, **kw), "command producer"),
        (lambda **kw: new_admin(S, **kw), "admin client"),
    ],
)
def test_a_refused_configuration_names_the_role(make: object, role: str) -> None:
    with pytest.raises(ConfigurationError, match=f"the Kafka {role} could not be made"):
        make(**{"no.such.property": "1"})  # type: ignore[operator]


def test_every_role_s_profile_is_one_librdkafka_accepts() -> None:
    from confluent_kafka import Consumer, Producer

    reader, member = new_reader(S, eof=True), new_group_consumer(S, "g-2")
    producer, txn = new_command_producer(S), new_transactional_producer(S, "proc-a")
    try:
        assert isinstance(reader.driver, Consumer) and isinstance(member.driver, Consumer)
        assert isinstance(producer.driver, Producer) and isinstance(txn.driver, Producer)
        assert reader.assignment() == [] and member.assignment() == []
    finally:
        reader.close()
        member.close()


def test_a_command_producer_keeps_order_and_batches_what_queues_under_load() -> None:
    from sessionstream.adapters.kafka import command_producer_config

    conf = command_producer_config(S)
    # idempotent: a retried request neither duplicates nor reorders a session's commands
    assert conf["enable.idempotence"] is True and conf["acks"] == "all"
    # sent at once at light load; one request in flight a broker, so what queues meanwhile
    # goes out together (librdkafka's default of 5 sent one small request after another)
    assert conf["linger.ms"] == 0
    assert conf["max.in.flight.requests.per.connection"] == 1
    # a caller's override still wins (the workers pass their own)
    assert command_producer_config(S, **{"linger.ms": 3})["linger.ms"] == 3
