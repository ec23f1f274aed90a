"""`watermarks` (what `log_bounds` reads per partition) waits out a leader moving — the
answers a broker that just died leaves for a moment — and gives up at once on anything
else, or when its time is up. The consumer is the adapter's client around a stand-in
driver that answers from a script."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as TP

from sessionstream.adapters.kafka import Reader
from sessionstream.adapters.kafka.reader import watermarks
from sessionstream.errors import KafkaFailed


class Scripted:
    """A driver: raises the scripted errors in turn, then answers (3, 42)."""

    def __init__(self, *errors: int) -> None:
        self.errors = list(errors)
        self.calls = 0

    def get_watermark_offsets(self, tp: TP, timeout: float, cached: bool) -> tuple[int, int]:
        self.calls += 1
        assert timeout > 0 and cached is False
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))
        return 3, 42


def test_a_moving_leader_is_waited_out() -> None:
    c = Scripted(KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.OFFSET_NOT_AVAILABLE)
    assert watermarks(Reader(c), TP("t", 0), time.monotonic() + 10) == (3, 42)  # type: ignore[arg-type]
    assert c.calls == 3


def test_another_error_is_raised_at_once() -> None:
    c = Scripted(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(KafkaFailed) as e:
        watermarks(Reader(c), TP("t", 0), time.monotonic() + 10)  # type: ignore[arg-type]
    assert e.value.name == "TOPIC_AUTHORIZATION_FAILED"
    assert c.calls == 1


def test_a_leader_that_never_settles_is_given_up_when_the_time_is_up() -> None:
    c = Scripted(*[KafkaError.NOT_LEADER_FOR_PARTITION] * 100)
    t0 = time.monotonic()
    with pytest.raises(KafkaFailed) as e:
        watermarks(Reader(c), TP("t", 0), t0 + 1.0)  # type: ignore[arg-type]
    assert e.value.name == "NOT_LEADER_FOR_PARTITION"
    assert time.monotonic() - t0 < 5.0  # its deadline, not a speed
    assert 2 <= c.calls < 100
