"""Driver errors into sessionstream's: callers never need confluent_kafka to handle one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from confluent_kafka import KafkaException

from sessionstream.errors import KafkaUnavailable
from sessionstream.settings import Settings

__all__ = ["kafka_cause", "unavailable", "unmasked"]


def unavailable(
    what: str, error: KafkaException | BaseException, settings: Settings
) -> KafkaUnavailable:
    """`raise unavailable("reading offsets", e, settings) from e`: one line saying what
    failed, with the driver's reason and where Kafka was looked for."""
    reason = error.args[0] if isinstance(error, KafkaException) and error.args else error
    return KafkaUnavailable(f"{what}: {reason}", bootstrap=settings.kafka_bootstrap)


def kafka_cause(error: BaseException) -> KafkaException | None:
    """The KafkaException `error` is, or stands for: the first one along its explicit
    causes (`__cause__` only: an exception merely being handled when `error` happened is
    another error). confluent-kafka's error callback turns a fatal error (a fenced
    producer) into a KafkaException it leaves set while librdkafka goes on serving
    callbacks; the next one it calls (a delivery report, a log line) then fails with
    "SystemError: ... returned a result with an exception set", which CPython makes
    *caused by* that KafkaException (the problem of the open pull request
    confluent-kafka-python#1146; seen in CI: flush() of a fenced processor producer)."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        if isinstance(e, KafkaException):
            return e
        seen.add(id(e))
        e = e.__cause__
    return None


@contextlib.contextmanager
def unmasked() -> Iterator[None]:
    """Around calls into confluent-kafka that serve callbacks (poll, consume, flush,
    commit_transaction, abort_transaction): a SystemError that stands for a KafkaException
    is raised as that KafkaException, so `except KafkaException` sees the real error."""
    try:
        yield
    except SystemError as e:
        cause = kafka_cause(e)
        if cause is None:
            raise
        raise cause from e
