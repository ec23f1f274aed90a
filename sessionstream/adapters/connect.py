"""The run stream into a warehouse table with Kafka Connect (docs/analytics.md).

Apache Kafka's own Connect runtime (`stack/stack.sh connect-up`, `make connect`) runs two
plugins from Maven Central: Apicurio's Avro converter, reading the Confluent framing our
events carry (a zero byte, the registry's 4-byte content id, Avro), and Debezium's JDBC sink
connector. `connector_config` is the sink's configuration for a deployment's settings (the
repo ships the default one as `stack/connect/analytics-events.json`); `deploy` puts it on a
Connect worker through its REST API, and `status` reads the connector's and tasks' states.

What the table holds: one row per event, keyed `(session_id, run_id, seq)` and written as
an upsert, so an event Connect delivers twice (after a worker's kill -9, Connect redelivers
from its last committed offset) stays one row. The Avro record is flattened (the payload
union becomes one nullable column per branch field, `payload_run_finished_terminal_status`)
and the names are snake_case; `run.cancel_acknowledged`'s four lists are left out (the
JDBC sink cannot add an optional array column). The consumer reads `read_committed`.
A record the converter cannot decode (an unknown schema id, a foreign byte) fails the task
with the reason (`errors.tolerance=none`): the connector stops, it never skips.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from typing import Any, Final
from urllib.parse import urlsplit

from sessionstream.adapters.kafka import (
    Reader,
    TopicPartition,
    new_group_consumer,
    new_reader,
)
from sessionstream.errors import ConfigurationError, SessionstreamError
from sessionstream.schemas._avro import event_schema
from sessionstream.settings import Settings

__all__ = [
    "CONNECTOR_NAME",
    "DEFAULT_TABLE",
    "ConnectError",
    "connector_config",
    "delete",
    "deploy",
    "framed_starts",
    "start_past_old_framing",
    "status",
]

CONNECTOR_NAME: Final = "sessionstream-analytics-events"
DEFAULT_TABLE: Final = "analytics.run_events"
#: the lists of `run.cancel_acknowledged`'s payload: no optional array column in the sink
_CCOMPAT: Final = "/apis/ccompat/v7"


def array_columns() -> list[str]:
    """The flattened names (`payload_{Record}_{field}`) of every array field of the events'
    payloads, read from the event schema: the JDBC sink can neither add an optional array
    column nor resolve an array's default, so they are left out (the projection's
    `agent_run_events.payload` has them)."""
    out: list[str] = []

    def walk(t: Any) -> None:
        if isinstance(t, list):
            for x in t:
                walk(x)
        elif isinstance(t, dict) and t.get("type") == "record":
            for f in t["fields"]:
                kinds = f["type"] if isinstance(f["type"], list) else [f["type"]]
                for k in kinds:
                    if isinstance(k, dict) and k.get("type") == "array":
                        out.append(f"payload_{t['name']}_{f['name']}")
                    walk(k)

    payload = next(f for f in event_schema()["fields"] if f["name"] == "payload")
    walk(payload["type"])
    return sorted(set(out))


class ConnectError(SessionstreamError):
    """The Connect worker refused a request or did not answer."""


def registry_v2_url(settings: Settings) -> str:
    """Apicurio's own API next to its Confluent-compatible one (the converter speaks it)."""
    url = settings.schema_registry_url.rstrip("/")
    if not url.endswith(_CCOMPAT):
        raise ConfigurationError(
            f"SESSIONSTREAM_SCHEMA_REGISTRY_URL={url!r}: the Connect converter is Apicurio's and "
            f"needs an Apicurio Registry (its Confluent-compatible URL ends in {_CCOMPAT})"
        )
    return url.removesuffix(_CCOMPAT) + "/apis/registry/v2"


def _jdbc(settings: Settings) -> tuple[str, str, str]:
    """(JDBC URL, user, password) of the settings' PostgreSQL."""
    parts = urlsplit(settings.database_url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ConfigurationError(
            f"SESSIONSTREAM_DATABASE_URL: not a postgresql:// URL: {parts.scheme}"
        )
    password = (
        settings.database_password.get_secret_value()
        if settings.database_password is not None
        else (parts.password or "")
    )
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 5432
    query = f"?{parts.query}" if parts.query else ""
    return f"jdbc:postgresql://{host}:{port}{parts.path}{query}", parts.username or "", password


def connector_config(
    settings: Settings, *, table: str = DEFAULT_TABLE, start: str = "earliest"
) -> dict[str, str]:
    """The Debezium JDBC sink's configuration: `settings.events_topic` into `table`
    (`schema.table`; the schema must exist: `sessionstream db migrate` makes `analytics`)."""
    if start not in ("earliest", "latest"):
        raise ConfigurationError(f"start must be earliest or latest, not {start!r}")
    if table.count(".") != 1 or not all(p.replace("_", "").isalnum() for p in table.split(".")):
        raise ConfigurationError(
            f"table must be schema.table in plain letters, digits and _: {table!r}"
        )
    url, user, password = _jdbc(settings)
    prefix = "value.converter.apicurio."
    config = {
        "connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector",
        "tasks.max": "1",
        "topics": settings.events_topic,
        "connection.url": url,
        "connection.username": user,
        "connection.password": password,
        "insert.mode": "upsert",
        "primary.key.mode": "record_value",
        "primary.key.fields": "session_id,run_id,seq",
        "schema.evolution": "basic",
        "collection.name.format": table,
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "io.apicurio.registry.utils.converter.AvroConverter",
        f"{prefix}registry.url": registry_v2_url(settings),
        # the Confluent framing: the 4-byte id in the value is the registry's content id
        f"{prefix}registry.as-confluent": "true",
        f"{prefix}registry.use-id": "contentId",
        f"{prefix}registry.headers.enabled": "false",
        "transforms": "flatten,lists,names",
        "transforms.flatten.type": "org.apache.kafka.connect.transforms.Flatten$Value",
        "transforms.flatten.delimiter": "_",
        "transforms.lists.type": "org.apache.kafka.connect.transforms.ReplaceField$Value",
        "transforms.lists.exclude": ",".join(array_columns()),
        "transforms.names.type": "io.debezium.connector.jdbc.transforms.FieldNameTransformation",
        "transforms.names.column.naming.style": "snake_case",
        "errors.tolerance": "none",
        "consumer.override.isolation.level": "read_committed",
        "consumer.override.auto.offset.reset": start,
    }
    if settings.schema_registry_username:
        config[f"{prefix}auth.username"] = settings.schema_registry_username
        if settings.schema_registry_password is not None:
            config[f"{prefix}auth.password"] = settings.schema_registry_password.get_secret_value()
    return config


def _first_byte_at(consumer: Reader, topic: str, partition: int, offset: int) -> int | None:
    """The first byte of the value of the first record at or after `offset` (None: none)."""
    consumer.assign([TopicPartition(topic, partition, offset)])
    deadline = time.monotonic() + 15.0
    while time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), 10)
            position = consumer.position([TopicPartition(topic, partition)])[0].offset
            if position >= high or offset >= high:
                return None
            continue
        if msg.error() is not None:
            continue
        value = msg.value() or b""
        return value[0] if value else -1
    raise ConnectError(f"{topic}[{partition}] @ {offset}: no record read within 15 s")


def framed_starts(
    settings: Settings, topic: str | None = None, *, every_partition: bool = False
) -> dict[int, tuple[int, int]]:
    """Per partition of the events topic whose log begins with records written before the
    switch to the registry's framing (Avro single-object encoding, `C3 01` + fingerprint,
    which no registry-aware converter reads): `(first framed offset, low watermark)`
    (`every_partition`: the others too, as `(low, low)`). The switch is one-way, so a
    binary search over offsets finds it in a few reads."""
    topic = topic or settings.events_topic
    consumer = new_reader(settings, group_id=f"sessionstream-connect-probe-{uuid.uuid4().hex[:8]}")
    out: dict[int, tuple[int, int]] = {}
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        for p in sorted(meta.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), 10)
            if high <= low or _first_byte_at(consumer, topic, p, low) in (0, None):
                if every_partition:
                    out[p] = (low, low)
                continue
            lo, hi = low, high  # the record at lo is old; find the first offset whose is not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if _first_byte_at(consumer, topic, p, mid) in (0, None):
                    hi = mid
                else:
                    lo = mid
            out[p] = (hi, low)
    finally:
        consumer.close()
    return out


def start_past_old_framing(settings: Settings, name: str) -> dict[int, tuple[int, int]]:
    """For a connector not created yet: commit its consumer group's offsets past the
    records in the old framing (`framed_starts`), so it starts where the converter can
    read instead of failing on the first record. Returns what it skipped; nothing when the
    group has offsets already (a connector that ran keeps its position)."""
    starts = framed_starts(settings)
    if not starts:
        return {}
    topic = settings.events_topic
    consumer = new_group_consumer(settings, f"connect-{name}")
    try:
        tps = [TopicPartition(topic, p) for p in starts]
        committed = consumer.committed(tps, timeout=10)
        if any(tp.offset >= 0 for tp in committed):
            return {}
        consumer.commit([TopicPartition(topic, p, o) for p, (o, _) in starts.items()])
    finally:
        consumer.close()
    return starts


def _request(method: str, url: str, body: Any = None, timeout: float = 30.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    req.add_header("Accept", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")[:2000]
        raise ConnectError(f"{method} {url}: HTTP {e.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as e:
        raise ConnectError(f"{method} {url}: Kafka Connect does not answer ({e})") from None
    return json.loads(raw) if raw else None


def deploy(connect_url: str, name: str, config: dict[str, str]) -> dict[str, Any]:
    """Create or update connector `name` (idempotent: `PUT /connectors/{name}/config`)."""
    result: dict[str, Any] = _request(
        "PUT", f"{connect_url.rstrip('/')}/connectors/{name}/config", config
    )
    return result


def status(connect_url: str, name: str) -> dict[str, Any]:
    """The connector's state and each task's (`trace` holds a failed task's reason)."""
    result: dict[str, Any] = _request("GET", f"{connect_url.rstrip('/')}/connectors/{name}/status")
    return result


def delete(connect_url: str, name: str) -> None:
    _request("DELETE", f"{connect_url.rstrip('/')}/connectors/{name}")
