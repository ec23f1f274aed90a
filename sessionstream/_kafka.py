"""Base configuration shared by every Kafka client sessionstream creates.

`client_config` is the one place where confluent-kafka clients get their address and
credentials; `aiokafka_config` and `faust_credentials` give aiokafka and faust the same.
"""

from __future__ import annotations

import logging
import ssl
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from sessionstream.settings import Settings

__all__ = [
    "LogRecord",
    "aiokafka_config",
    "client_config",
    "data_messages",
    "faust_credentials",
    "read_topic",
    "security_config",
]

#: librdkafka's own log lines go here, not straight to stderr: a broker that is down
#: would otherwise print a line every 50 ms; the error reaches the user as an exception
KAFKA_LOG = logging.getLogger("sessionstream.kafka")


def _sasl(settings: Settings) -> tuple[str, str] | None:
    """(user, password) when the protocol is SASL_*; Settings guarantees both are set."""
    if not settings.kafka_security_protocol.startswith("SASL"):
        return None
    assert settings.kafka_username is not None and settings.kafka_password is not None
    return settings.kafka_username, settings.kafka_password.get_secret_value()


def security_config(settings: Settings) -> dict[str, str]:
    """librdkafka's security properties for the settings (empty for PLAINTEXT)."""
    sasl = _sasl(settings)
    if sasl is None:
        return {}
    return {
        "security.protocol": settings.kafka_security_protocol.lower(),
        "sasl.mechanism": settings.kafka_sasl_mechanism,
        "sasl.username": sasl[0],
        "sasl.password": sasl[1],
    }


def client_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """bootstrap.servers, credentials and the logger; `overrides` win."""
    conf: dict[str, Any] = {"bootstrap.servers": settings.kafka_bootstrap, "logger": KAFKA_LOG}
    conf.update(security_config(settings))
    conf.update(overrides)
    return conf


def aiokafka_config(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for aiokafka's clients: address and credentials."""
    conf: dict[str, Any] = {
        "bootstrap_servers": settings.kafka_bootstrap,
        "security_protocol": settings.kafka_security_protocol,
    }
    sasl = _sasl(settings)
    if sasl is not None:
        conf.update(
            sasl_mechanism=settings.kafka_sasl_mechanism,
            sasl_plain_username=sasl[0],
            sasl_plain_password=sasl[1],
        )
        if settings.kafka_security_protocol == "SASL_SSL":
            conf["ssl_context"] = ssl.create_default_context()
    return conf


def faust_credentials(settings: Settings) -> Any:
    """``faust.App(broker_credentials=...)`` for the settings (None for PLAINTEXT)."""
    sasl = _sasl(settings)
    if sasl is None:
        return None
    import faust

    return faust.SASLCredentials(
        username=sasl[0],
        password=sasl[1],
        mechanism=settings.kafka_sasl_mechanism,
        ssl_context=(
            ssl.create_default_context() if settings.kafka_security_protocol == "SASL_SSL" else None
        ),
    )


def data_messages(batch: list[Message], log: logging.Logger) -> list[Message]:
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
            raise KafkaException(err)
        else:
            log.warning("consumer: %s", err)
    return out


@dataclass(frozen=True)
class LogRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]


def read_topic(
    settings: Settings,
    topic: str,
    *,
    read_committed: bool = True,
    timeout: float = 60.0,
    partitions: Iterable[int] | None = None,
    group_id: str | None = None,
) -> list[LogRecord]:
    """Every record of `topic` (or of its `partitions`) up to its end now. `group_id` is
    never joined (the partitions are assigned); a role's ACLs may still require one of its
    own names."""
    consumer = Consumer(
        client_config(
            settings,
            **{
                "group.id": group_id or f"sessionstream-reader-{uuid.uuid4()}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed" if read_committed else "read_uncommitted",
                "enable.partition.eof": True,
                "fetch.wait.max.ms": 10,
            },
        )
    )
    try:
        meta = consumer.list_topics(topic, timeout=timeout)
        parts = sorted(meta.topics[topic].partitions if partitions is None else partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        pending = set(parts)
        out: list[LogRecord] = []
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic}: partitions {sorted(pending)} not at end")
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            p = msg.partition()
            assert p is not None
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(p)
                    continue
                raise KafkaException(err)
            offset = msg.offset()
            assert offset is not None
            headers: dict[str, bytes] = {}
            raw_headers: list[tuple[str, Any]] = list(msg.headers() or [])  # type: ignore[arg-type]
            for k, v in raw_headers:
                headers[str(k)] = v if isinstance(v, bytes) else str(v or "").encode()
            out.append(LogRecord(p, offset, msg.key(), msg.value(), headers))
        return out
    finally:
        consumer.close()
