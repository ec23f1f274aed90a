"""Every Kafka client sessionstream makes is made here, by its role: a reader (assigned
partitions only), a group member, a command producer, the processor's transactional
producer, an admin client. A configuration librdkafka refuses is a `ConfigurationError`
naming the role, translated here once."""

from __future__ import annotations

from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from sessionstream.adapters.kafka.config import (
    client_config,
    command_producer_config,
    group_consumer_config,
    reader_config,
    transactional_producer_config,
)
from sessionstream.errors import ConfigurationError
from sessionstream.settings import Settings

__all__ = [
    "new_admin",
    "new_command_producer",
    "new_group_consumer",
    "new_reader",
    "new_transactional_producer",
]

C = TypeVar("C", Consumer, Producer, AdminClient)


def _made(kind: type[C], role: str, conf: dict[str, Any]) -> C:
    try:
        return kind(conf)
    except (KafkaException, ValueError, TypeError) as e:
        raise ConfigurationError(f"the Kafka {role} could not be made: {e}") from e


def new_reader(
    settings: Settings,
    *,
    group_id: str | None = None,
    read_committed: bool = True,
    eof: bool = False,
    fetch_wait_ms: int = 10,
    **overrides: Any,
) -> Consumer:
    """A consumer that is only ever assigned partitions (`reader_config`)."""
    conf = reader_config(
        settings,
        group_id=group_id,
        read_committed=read_committed,
        eof=eof,
        fetch_wait_ms=fetch_wait_ms,
        **overrides,
    )
    return _made(Consumer, "reader", conf)


def new_group_consumer(settings: Settings, group_id: str, **overrides: Any) -> Consumer:
    """A member of `group_id` (`group_consumer_config`); the caller subscribes it."""
    return _made(
        Consumer,
        f"consumer of group {group_id}",
        group_consumer_config(settings, group_id, **overrides),
    )


def new_command_producer(settings: Settings, **overrides: Any) -> Producer:
    """A producer of commands (`command_producer_config`)."""
    return _made(Producer, "command producer", command_producer_config(settings, **overrides))


def new_transactional_producer(settings: Settings, transactional_id: str) -> Producer:
    """The processor's producer with `transactional_id` (not initialized yet)."""
    conf = transactional_producer_config(settings, transactional_id)
    return _made(Producer, f"transactional producer {transactional_id}", conf)


def new_admin(settings: Settings, **overrides: Any) -> AdminClient:
    """An admin client."""
    return _made(AdminClient, "admin client", client_config(settings, **overrides))
