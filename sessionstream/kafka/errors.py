"""Driver errors into sessionstream's: callers never need confluent_kafka to handle one."""

from __future__ import annotations

from confluent_kafka import KafkaException

from sessionstream.errors import KafkaUnavailable
from sessionstream.settings import Settings

__all__ = ["unavailable"]


def unavailable(
    what: str, error: KafkaException | BaseException, settings: Settings
) -> KafkaUnavailable:
    """`raise unavailable("reading offsets", e, settings) from e`: one line saying what
    failed, with the driver's reason and where Kafka was looked for."""
    reason = error.args[0] if isinstance(error, KafkaException) and error.args else error
    return KafkaUnavailable(f"{what}: {reason}", bootstrap=settings.kafka_bootstrap)
