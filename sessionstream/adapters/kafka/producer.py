"""Producing without losing a record to a full local queue."""

from __future__ import annotations

from typing import Any

from sessionstream.adapters.kafka.clients import CommandProducer
from sessionstream.errors import KafkaUnavailable

__all__ = ["produce"]


def produce(producer: CommandProducer, topic: str, *, attempts: int = 20, **kwargs: Any) -> None:
    """`producer.produce(topic, **kwargs)`; a full local queue (BufferError) is drained by
    serving delivery reports and tried again, up to `attempts` times (~10 s), then it is the
    broker's fault: KafkaUnavailable."""
    for _ in range(attempts):
        try:
            producer.produce(topic, **kwargs)
            return
        except BufferError:
            producer.poll(0.5)
    raise KafkaUnavailable(
        f"producer queue full for {topic}: the broker does not take records", bootstrap="?"
    )
