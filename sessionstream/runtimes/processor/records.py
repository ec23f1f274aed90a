"""What the loop reads off a consumed record."""

from __future__ import annotations

from sessionstream.adapters.kafka import Message

__all__ = ["coords", "log_time"]


def log_time(msg: Message) -> int:
    """The record's timestamp: the broker's append time on a `LogAppendTime` topic (the
    commands topic is created so; `topics check` verifies it)."""
    _kind, ts = msg.timestamp()
    return max(0, int(ts))


def coords(msg: Message) -> tuple[str, int, int]:
    """(topic, partition, offset) of a consumed record (never None for those)."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    return topic, partition, offset
