"""What creating a subscription takes besides its row (the gateway and the CLI both ask):
its URL checked by the SSRF guard, resolved now, and where the events topic ends, so the
subscription is sent the events from there on and no history."""

from __future__ import annotations

import time

from sessionstream.adapters.kafka import new_admin
from sessionstream.errors import KafkaFailed, KafkaUnavailable
from sessionstream.runtimes.webhooks.guard import (
    AddressPolicy,
    Resolver,
    check_url,
    checked_addresses,
)
from sessionstream.settings import Settings

__all__ = ["admit_url", "events_ends"]

#: what the ends are asked again on (as `sessionstream.adapters.kafka.reader` does)
_LEADER_MOVING = frozenset(
    {
        "NOT_LEADER_FOR_PARTITION",
        "LEADER_NOT_AVAILABLE",
        "REPLICA_NOT_AVAILABLE",
        "OFFSET_NOT_AVAILABLE",
        "UNKNOWN_TOPIC_OR_PART",
        "_TRANSPORT",
    }
)


async def admit_url(settings: Settings, url: str, resolver: Resolver | None = None) -> None:
    """`UrlRefused` unless the guard lets `url` through (its form, and every address its
    host resolves to now; the deliverer checks again at every connection)."""
    target = check_url(url)
    await checked_addresses(target.host, target.port, AddressPolicy.of(settings), resolver)


def events_ends(settings: Settings, timeout_s: float = 15.0) -> dict[int, int]:
    """Per partition of the events topic, where a read_committed reader ends now. A
    leader moving (or not elected yet: a topic just made) is asked again, `timeout_s`."""
    topic = settings.events_topic
    admin = new_admin(settings)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            meta = admin.list_topics(topic, timeout=10).topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                raise KafkaUnavailable(
                    f"events topic {topic} is not there", bootstrap=settings.kafka_bootstrap
                )
            got = admin.latest_offsets([(topic, p) for p in meta.partitions], committed=True)
            return {p: offset for (_topic, p), offset in got.items()}
        except KafkaFailed as e:
            moving = e.retriable or e.name in _LEADER_MOVING
            if not moving or time.monotonic() > deadline:
                raise KafkaUnavailable(
                    f"the end of {topic}: {e.reason}", bootstrap=settings.kafka_bootstrap
                ) from e
            time.sleep(0.2)
