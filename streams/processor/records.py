"""What the loop reads off a consumed record, and what makes an open-runs record new."""

from __future__ import annotations

from confluent_kafka import Message

from schemas.discovery import OpenRun

__all__ = ["coords", "log_time", "opening_key"]


def opening_key(run: OpenRun | None) -> tuple[str, int, str] | None:
    """What makes an open-runs record new (the clock it carries does not)."""
    return None if run is None else (run.run_id, run.generation, run.status)


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
