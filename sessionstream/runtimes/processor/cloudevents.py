"""CloudEvents headers on every event record (the Kafka protocol binding, binary mode).

A router, a filter or a connector can learn an event's type, session, tenant and run from
the record's headers without decoding it: the value stays the event in the Confluent wire
format, and these name it (CloudEvents 1.0, https://github.com/cloudevents/spec):

| header | value |
|---|---|
| ``ce_specversion`` | ``1.0`` |
| ``ce_id`` | the event key ``{sessionId}/{runId}/{seq:010d}`` (unique in the topic) |
| ``ce_source`` | ``/sessionstream/{events topic}`` |
| ``ce_type`` | the event type (``run.started``, ...) |
| ``ce_time`` | the event's ``ts`` (the decider's clock), RFC 3339 in UTC with milliseconds |
| ``ce_subject`` | the session id |
| ``ce_tenantid``, ``ce_runid`` | extensions: the tenant, the run (``_session``: its log) |
| ``content-type`` | ``application/avro; schemaregistry=confluent`` (``00``, the id, Avro) |

Derived from the event alone, so a re-emitted event carries the same headers. (Each header
costs the processor about a third of a microsecond a record in confluent-kafka, so there
are no more than these: the schema is named by the id in the value itself.)
"""

from __future__ import annotations

import functools
import time
from typing import Final

from sessionstream.schemas.events import Event

__all__ = ["CONTENT_TYPE", "CloudEventHeaders", "rfc3339_ms"]

CONTENT_TYPE: Final = b"application/avro; schemaregistry=confluent"
#: records of a codec without a registry (single-object encoding)
CONTENT_TYPE_SINGLE_OBJECT: Final = b"application/avro; encoding=single-object"

Headers = list[tuple[str, str | bytes | None]]


@functools.lru_cache(maxsize=4096)
def rfc3339_ms(ts_ms: int) -> bytes:
    """``2026-12-05T23:15:51.123Z`` of epoch milliseconds."""
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts_ms // 1000)) + f".{ts_ms % 1000:03d}Z"
    ).encode()


class CloudEventHeaders:
    """The headers of an event record, for one events topic and one writer schema id."""

    def __init__(self, events_topic: str, registry_url: str, event_schema_id: int | None) -> None:
        self._fixed: Headers = [
            ("ce_specversion", b"1.0"),
            ("ce_source", f"/sessionstream/{events_topic}".encode()),
        ]
        content = CONTENT_TYPE_SINGLE_OBJECT if event_schema_id is None else CONTENT_TYPE
        self._tail: Headers = [("content-type", content)]

    def of(self, event: Event, key: bytes) -> Headers:
        return [
            *self._fixed,
            ("ce_id", key),
            ("ce_type", event.type.encode()),
            ("ce_time", rfc3339_ms(event.ts)),
            ("ce_subject", event.session_id.encode()),
            ("ce_tenantid", event.tenant_id.encode()),
            ("ce_runid", event.run_id.encode()),
            *self._tail,
        ]
