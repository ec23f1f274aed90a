"""The Kafka adapter's clients translate every driver error once: what a caller above the
adapter sees is a `KafkaFailed` with flags, never a confluent-kafka exception — from a call,
from a SystemError that stands for a fatal error, in a delivery report and in a consumed
record. The drivers here are stand-ins that raise the driver's own errors."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from sessionstream.adapters.kafka import (
    CommandProducer,
    GroupConsumer,
    Reader,
    TransactionalProducer,
    failure,
    record_failure,
)
from sessionstream.errors import KafkaFailed, SessionstreamError


def raising(error: BaseException) -> Any:
    def call(*_: Any, **__: Any) -> Any:
        raise error

    return call


class Driver:
    """Every method raises what `fail` names for it, else returns `answer`."""

    def __init__(self, fail: dict[str, BaseException] | None = None, answer: Any = None) -> None:
        self.fail, self.answer = fail or {}, answer
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args, kwargs))
            if name in self.fail:
                raise self.fail[name]
            return self.answer

        return call


def masked(error: KafkaException) -> SystemError:
    try:
        try:
            raise error
        except KafkaException as k:
            raise SystemError("<callback> returned a result with an exception set") from k
    except SystemError as s:
        return s


@pytest.mark.parametrize(
    ("kerr", "flags"),
    [
        (KafkaError(KafkaError._FENCED, "fenced", fatal=True), {"fatal", "fenced"}),
        (KafkaError(KafkaError.PRODUCER_FENCED, "newer producer", fatal=True), {"fatal", "fenced"}),
        (
            KafkaError(KafkaError._TIMED_OUT, "no answer", retriable=True),
            {"retriable", "timed_out", "coordinator_busy"},
        ),
        (
            KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, "loading"),
            {"coordinator_busy"},
        ),
        (
            KafkaError(KafkaError.NOT_COORDINATOR, "moved", txn_requires_abort=True),
            {"requires_abort", "coordinator_busy"},
        ),
        (KafkaError(KafkaError._PARTITION_EOF, "end"), {"partition_eof"}),
        (KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large"), set()),
    ],
)
def test_each_driver_error_is_classified_once(kerr: KafkaError, flags: set[str]) -> None:
    got = failure(KafkaException(kerr))
    every = {
        "fatal",
        "retriable",
        "requires_abort",
        "fenced",
        "timed_out",
        "coordinator_busy",
        "partition_eof",
    }
    assert {f for f in every if getattr(got, f)} == flags
    assert isinstance(got, SessionstreamError) and got.name == kerr.name()
    assert got.reason == kerr.str() and kerr.name() in str(got)


def test_a_readers_call_raises_the_translated_error_caused_by_the_drivers() -> None:
    driver_error = KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))
    reader = Reader(Driver({"poll": driver_error}))  # type: ignore[arg-type]
    with pytest.raises(KafkaFailed) as got:
        reader.poll(0.1)
    assert got.value.__cause__ is driver_error and got.value.coordinator_busy


def test_a_system_error_standing_for_a_fence_is_the_fence() -> None:
    fence = KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    producer = TransactionalProducer(Driver({"flush": masked(fence)}))  # type: ignore[arg-type]
    with pytest.raises(KafkaFailed) as got:
        producer.flush(1)
    assert got.value.fatal and got.value.fenced


def test_a_driver_call_whose_error_a_callback_lost_is_a_fatal_failure() -> None:
    lost = SystemError(
        "<method 'flush' of 'cimpl.Producer' objects> returned NULL without setting an exception"
    )
    producer = TransactionalProducer(Driver({"flush": lost}))  # type: ignore[arg-type]
    with pytest.raises(KafkaFailed) as got:
        producer.flush(1)
    assert got.value.fatal and not got.value.fenced and got.value.__cause__ is lost


def test_other_errors_pass_unchanged() -> None:
    producer = CommandProducer(  # type: ignore[arg-type]
        Driver({"produce": BufferError("queue full"), "flush": SystemError("interpreter")})
    )
    with pytest.raises(BufferError):  # the local queue: `adapters.kafka.produce` drains it
        producer.produce("t", b"v")
    with pytest.raises(SystemError):
        producer.flush(1)


def test_delivery_reports_get_the_translated_error() -> None:
    driver = Driver()
    producer = CommandProducer(driver)  # type: ignore[arg-type]
    reports: list[KafkaFailed | None] = []
    producer.produce("t", b"v", key=b"k", on_delivery=lambda err, _msg: reports.append(err))
    ((_, _, kwargs),) = driver.calls
    callback = kwargs["on_delivery"]
    callback(None, object())
    callback(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large"), object())
    assert reports[0] is None
    assert isinstance(reports[1], KafkaFailed) and reports[1].name == "MSG_SIZE_TOO_LARGE"


def test_rebalance_callbacks_get_the_adapters_consumer() -> None:
    driver = Driver()
    member = GroupConsumer(driver)  # type: ignore[arg-type]
    seen: list[object] = []
    member.subscribe(["t"], on_assign=lambda c, parts: seen.append((c, parts)))
    ((_, _, kwargs),) = driver.calls
    assert set(kwargs) == {"on_assign"}  # callbacks not given are not passed on
    kwargs["on_assign"](object(), ["tp"])  # the driver calls back with its own client
    assert seen == [(member, ["tp"])]


class Record:
    def __init__(self, err: KafkaError | None) -> None:
        self.err = err

    def error(self) -> KafkaError | None:
        return self.err


def test_a_consumed_records_error_is_translated() -> None:
    assert record_failure(Record(None)) is None  # type: ignore[arg-type]
    eof = record_failure(Record(KafkaError(KafkaError._PARTITION_EOF, "end")))  # type: ignore[arg-type]
    assert eof is not None and eof.partition_eof and not eof.fatal
