"""``sessionstream smoke``: one real record through Kafka and into PostgreSQL and back.

It proves the plumbing (broker reachable, topics creatable, produce/consume, database
writable) and nothing about the session protocol; it says so when it finishes.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg.types.json import Jsonb

from sessionstream.adapters.kafka import (
    DeliveryCallback,
    Message,
    Reader,
    TopicPartition,
    new_admin,
    new_command_producer,
    new_reader,
    record_failure,
)
from sessionstream.adapters.postgres import translated
from sessionstream.errors import DatabaseError, KafkaFailed, SessionstreamError
from sessionstream.settings import Settings

__all__ = ["SmokeError", "run_smoke"]

_TIMEOUT_S = 30.0

_DDL = """
create table if not exists smoke_roundtrip (
    smoke_id   uuid primary key,
    topic      text not null,
    kafka_partition integer not null,
    kafka_offset    bigint not null,
    payload    jsonb not null,
    written_at timestamptz not null default now()
)
"""


class SmokeError(SessionstreamError):
    """A step of the smoke round trip failed; the message names the step."""


def _where(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 5432}{parts.path}"


def run_smoke(settings: Settings, echo: Callable[[str], Any] = print) -> None:
    """Run the round trip, reporting each step through ``echo``; raise ``SmokeError``."""
    smoke_id = uuid.uuid4()
    topic = f"sessionstream-smoke-{smoke_id.hex[:12]}"
    where_pg = _where(settings.database_url)
    echo(f"smoke: Kafka at {settings.kafka_bootstrap}, PostgreSQL at {where_pg}")
    try:
        record = _kafka_round_trip(settings, topic, smoke_id, echo)
    except KafkaFailed as e:
        raise SmokeError(f"Kafka: {e.reason}") from e
    _postgres_round_trip(settings, record, echo)
    echo(
        "smoke: OK - one record went through Kafka and PostgreSQL and came back unchanged. "
        "This checks the plumbing only; it does not run the session protocol."
    )


def _kafka_round_trip(
    settings: Settings, topic: str, smoke_id: uuid.UUID, echo: Callable[[str], Any]
) -> dict[str, Any]:
    admin = new_admin(settings)
    # Step 1: a throwaway topic, so the smoke never touches real data.
    admin.create_topic(topic, partitions=1, timeout=_TIMEOUT_S)
    echo(f"kafka: created topic {topic} (1 partition)")
    try:
        # Step 2: produce one keyed record and wait for the broker's acknowledgement.
        value = json.dumps({"smoke_id": str(smoke_id), "sent_at_unix": time.time()}).encode()
        delivered: list[Message] = []
        producer = new_command_producer(settings)
        key = str(smoke_id).encode()
        producer.produce(topic, value=value, key=key, on_delivery=_collect(delivered))
        if producer.flush(_TIMEOUT_S) != 0 or not delivered:
            raise SmokeError(f"the record to {topic} was not acknowledged within {_TIMEOUT_S}s")
        sent = delivered[0]
        partition, offset = sent.partition(), sent.offset()
        failed = record_failure(sent)
        if failed is not None or partition is None or offset is None:
            raise SmokeError(f"producing to {topic} failed: {failed}")
        echo(f"kafka: produced {len(value)} bytes to {topic}[{partition}] at offset {offset}")

        # Step 3: read it back from exactly that offset.
        consumer = new_reader(settings, group_id=f"{topic}-reader")
        try:
            consumer.assign([TopicPartition(topic, partition, offset)])
            got = _poll_one(consumer)
        finally:
            consumer.close()
        if got.value() != value or got.key() != key:
            raise SmokeError(f"read back a different record from {topic}: {got.value()!r}")
        echo(f"kafka: consumed the same record back from {topic}[{got.partition()}]@{got.offset()}")
        return {
            "smoke_id": smoke_id,
            "topic": topic,
            "partition": got.partition(),
            "offset": got.offset(),
            "payload": json.loads(value),
        }
    finally:
        # Step 4: remove the throwaway topic even when a step failed.
        try:
            admin.delete_topics([topic], timeout=_TIMEOUT_S)
            echo(f"kafka: deleted topic {topic}")
        except Exception as e:  # cleanup must not hide the real failure
            echo(f"kafka: could not delete topic {topic}: {e}")


def _collect(sink: list[Message]) -> DeliveryCallback:
    def on_delivery(err: KafkaFailed | None, msg: Message) -> None:
        sink.append(msg)

    return on_delivery


def _poll_one(consumer: Reader) -> Message:
    deadline = time.monotonic() + _TIMEOUT_S
    while time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        failed = record_failure(msg)
        if failed is not None:
            raise SmokeError(f"consuming failed: {failed.reason}")
        return msg
    raise SmokeError(f"the record did not come back within {_TIMEOUT_S}s")


def _postgres_round_trip(
    settings: Settings, record: dict[str, Any], echo: Callable[[str], Any]
) -> None:
    conninfo = settings.database_conninfo
    try:
        with (
            translated(conninfo, queries=True),
            psycopg.connect(conninfo, connect_timeout=10) as conn,
        ):
            # Step 5: write the consumed record (table created on first use).
            conn.execute(_DDL)
            conn.execute(
                "insert into smoke_roundtrip"
                " (smoke_id, topic, kafka_partition, kafka_offset, payload)"
                " values (%s, %s, %s, %s, %s)",
                (
                    record["smoke_id"],
                    record["topic"],
                    record["partition"],
                    record["offset"],
                    Jsonb(record["payload"]),
                ),
            )
            conn.commit()
            echo(
                f"postgres: inserted smoke_id {record['smoke_id']} into smoke_roundtrip, committed"
            )
            # Step 6: read it back and compare.
            row = conn.execute(
                "select topic, kafka_partition, kafka_offset, payload"
                " from smoke_roundtrip where smoke_id = %s",
                (record["smoke_id"],),
            ).fetchone()
            total = conn.execute("select count(*) from smoke_roundtrip").fetchone()
    except DatabaseError as e:
        raise SmokeError(f"PostgreSQL: {e.reason}") from e
    expected = (record["topic"], record["partition"], record["offset"], record["payload"])
    if row != expected:
        raise SmokeError(f"PostgreSQL returned {row!r}, expected {expected!r}")
    echo(
        f"postgres: selected the row back, identical "
        f"(smoke_roundtrip holds {total[0] if total else '?'} row(s) from all smoke runs)"
    )
