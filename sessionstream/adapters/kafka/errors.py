"""Driver errors into sessionstream's, once: what leaves the Kafka adapter is a
`KafkaFailed` (classified: fatal, retriable, fenced, ...) or a `KafkaUnavailable`, never a
confluent-kafka exception, so nothing above the adapter imports the driver to handle one."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

from confluent_kafka import KafkaError, KafkaException, Message

from sessionstream.errors import KafkaFailed, KafkaUnavailable
from sessionstream.settings import Settings

__all__ = [
    "COORDINATOR_BUSY",
    "FENCING",
    "failure",
    "kafka_cause",
    "record_failure",
    "translated",
    "translating",
    "unavailable",
]

#: the errors that mean a newer producer has our transactional id
FENCING = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)
#: answers of a broker whose transaction coordinator is not (yet) serving: asked again
COORDINATOR_BUSY = frozenset(
    {
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
    }
)


def failure(error: KafkaError | KafkaException, what: str = "") -> KafkaFailed:
    """The driver's error as a `KafkaFailed`, classified; `what` (e.g. "commit") leads its
    message."""
    kerr = error.args[0] if isinstance(error, KafkaException) and error.args else error
    if not isinstance(kerr, KafkaError):  # a KafkaException around a plain message
        return KafkaFailed(f"{what}: {kerr}" if what else str(kerr))
    code = kerr.code()
    reason = kerr.str()
    return KafkaFailed(
        f"{what}: {reason}" if what else reason,
        name=kerr.name(),
        code=code,
        fatal=kerr.fatal(),
        retriable=kerr.retriable(),
        requires_abort=kerr.txn_requires_abort(),
        fenced=code in FENCING,
        timed_out=code == KafkaError._TIMED_OUT,
        coordinator_busy=code in COORDINATOR_BUSY,
        partition_eof=code == KafkaError._PARTITION_EOF,
    )


def record_failure(msg: Message) -> KafkaFailed | None:
    """The error a consumed record carries (a partition's end, a broker gone, a fatal
    consumer error), translated; None for a record with data."""
    err = msg.error()
    return None if err is None else failure(err)


def unavailable(what: str, error: BaseException, settings: Settings) -> KafkaUnavailable:
    """`raise unavailable("reading offsets", e, settings) from e`: one line saying what
    failed, with the driver's reason and where Kafka was looked for."""
    if isinstance(error, KafkaException) and error.args:
        reason: object = error.args[0]
    elif isinstance(error, KafkaFailed):
        reason = error.reason
    else:
        reason = error
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


#: what CPython says when a driver call returned an error whose exception a callback run
#: meanwhile consumed (the same confluent-kafka problem as `kafka_cause`'s; seen on the
#: real broker: a fenced producer's flush, in 3 of 7 runs once delivery reports did more
#: Python work)
_LOST_ERROR = "returned NULL without setting an exception"


def _driver_failure(error: KafkaException | SystemError, what: str = "") -> KafkaFailed | None:
    """The `KafkaFailed` a driver exception stands for; None for a SystemError that
    stands for none (a real interpreter problem: raised as it is). A driver call that
    failed with its error lost is a fatal failure of unknown kind (not a fence: nothing
    says another instance exists; a client replaced after it learns of one soon enough)."""
    cause = error if isinstance(error, KafkaException) else kafka_cause(error)
    if cause is not None:
        return failure(cause, what)
    if _LOST_ERROR in str(error):
        reason = f"the Kafka client failed and its error was lost in a callback ({error})"
        return KafkaFailed(f"{what}: {reason}" if what else reason, name="_FATAL", fatal=True)
    return None


@contextlib.contextmanager
def translated(what: str = "") -> Iterator[None]:
    """Around calls into confluent-kafka: its KafkaException becomes a `KafkaFailed`, and
    so does a SystemError that stands for one (`kafka_cause`: a fenced producer's error
    surfacing from the next callback librdkafka serves). Other errors pass unchanged."""
    try:
        yield
    except (KafkaException, SystemError) as e:
        failed = _driver_failure(e, what)
        if failed is None:
            raise
        raise failed from e


P = ParamSpec("P")
R = TypeVar("R")


def translating(method: Callable[P, R]) -> Callable[P, R]:
    """`translated` as a decorator: the adapter's clients wrap each driver call in it."""

    @functools.wraps(method)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except (KafkaException, SystemError) as e:
            failed = _driver_failure(e)
            if failed is None:
                raise
            raise failed from e

    return call
