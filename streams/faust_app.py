"""The session processor as a faust-streaming app (`sessionstream processor --engine faust`).

Same decider, same topics and keys as the transactional loop in `streams.txn_processor`; the
state lives in a faust Table whose changelog faust manages. Records are raw bytes on both
sides (we decode inside the agent, so a bad record becomes a dead letter instead of
crashing the agent). See docs/decisions/0001-processor-runtime.md for how it fares under
`exactly_once` on Kafka 4 and why the confluent-kafka loop is the default.
"""

from __future__ import annotations

from typing import Any

import faust

from schemas.codec import Codec
from sessionstream.settings import Settings
from streams.core import CommandStep, decode_state, encode_state
from streams.decider import DeciderConfig
from streams.state import SessionState

__all__ = ["build_app"]


def build_app(
    settings: Settings, *, guarantee: str = "exactly_once", app_id: str | None = None
) -> Any:
    """A faust App running the decider over `session.commands`."""
    n = settings.partitions
    app = faust.App(
        app_id or f"{settings.processor_group}-faust",
        broker=f"kafka://{settings.kafka_bootstrap}",
        processing_guarantee=guarantee,
        key_serializer="raw",
        value_serializer="raw",
        topic_partitions=n,
        topic_replication_factor=settings.replication_factor,
        store="memory://",
        broker_commit_every=500,
        broker_commit_interval=0.02,
        broker_session_timeout=6,
        broker_heartbeat_interval=1,
        web_enabled=False,
    )
    commands = app.topic(
        settings.commands_topic,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=n,
    )
    events = app.topic(
        settings.events_topic,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=n,
    )
    dlq = app.topic(
        settings.dlq_topic,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
    )
    table = app.Table("session-state", default=None, key_type=bytes, value_type=bytes, partitions=n)
    step = CommandStep(
        Codec(), DeciderConfig(max_payload_bytes=settings.max_payload_bytes), partitions=n
    )

    def state_of(sid: str) -> SessionState | None:
        raw = table.get(sid.encode())
        return decode_state(raw) if raw else None

    @app.agent(commands)
    async def process(stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            outcome = step(event.key, event.value, msg.partition, state_of)
            for key, value in outcome.records:
                await events.send(key=key, value=value, partition=msg.partition)
            if outcome.events and outcome.state is not None:
                table[outcome.state.session_id.encode()] = encode_state(outcome.state)
            if outcome.dead_letter is not None:
                d = outcome.dead_letter
                await dlq.send(
                    key=event.key,
                    value=event.value,
                    headers={
                        "source.topic": msg.topic.encode(),
                        "source.partition": str(msg.partition).encode(),
                        "source.offset": str(msg.offset).encode(),
                        "error.reason": d.reason.encode(),
                        "error.message": d.error.encode()[:4000],
                    },
                )

    @app.agent(events)
    async def _events_partitions_known(stream: Any) -> None:
        # faust picks the transactional producer from the consumer's metadata of the
        # DESTINATION topic; without an agent on it, an explicit partition is dropped and
        # the send bypasses the transaction (docs/decisions/0001-processor-runtime.md)
        async for _ in stream:
            pass

    app.sessionstream_agent = process  # type: ignore[attr-defined]
    return app
