"""Base configuration shared by every confluent-kafka client sessionstream creates."""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message

from sessionstream.settings import Settings

__all__ = ["client_config", "data_messages"]

#: librdkafka's own log lines go here, not straight to stderr: a broker that is down
#: would otherwise print a line every 50 ms; the error reaches the user as an exception
KAFKA_LOG = logging.getLogger("sessionstream.kafka")


def client_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """bootstrap.servers plus the logger; `overrides` win."""
    conf: dict[str, Any] = {"bootstrap.servers": settings.kafka_bootstrap, "logger": KAFKA_LOG}
    conf.update(overrides)
    return conf


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
