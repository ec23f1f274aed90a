"""The Confluent wire format: what the codec writes with registry ids, and how it
reads records of other ids and of the single-object encoding written before — checked
against the format's definition (a zero byte, the 4-byte big-endian id, the Avro binary
of the writer schema), with a stand-in registry (the integration tests use Apicurio)."""

from __future__ import annotations

import json
import threading
from importlib import resources
from typing import Any

import fastavro
import pytest

from sessionstream.schemas._avro import command_schema, event_schema
from sessionstream.schemas.codec import CONFLUENT_MAGIC, Codec
from sessionstream.schemas.errors import UnknownSchema
from tests.unit._samples import COMMAND_TYPES, EVENT_TYPES, command, event


class Registry:
    """Ids -> schemas, as a registry holds them; counts what is asked."""

    def __init__(self, ids: dict[str, int], schemas: dict[int, dict[str, Any]]) -> None:
        self.ids = ids
        self.schemas = schemas
        self.asked: list[int] = []
        self.lock = threading.Lock()

    def writer_id(self, kind: str) -> int | None:
        return self.ids.get(kind)

    def schema(self, schema_id: int) -> dict[str, Any]:
        with self.lock:
            self.asked.append(schema_id)
        if schema_id not in self.schemas:
            raise UnknownSchema(f"no schema {schema_id}", schema_id=schema_id)
        return self.schemas[schema_id]


def _history(name: str) -> dict[str, Any]:
    text = (resources.files("sessionstream.schemas") / "avro" / "history" / name).read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def _registry() -> Registry:
    return Registry(
        {"command": 7, "event": 9},
        {7: command_schema(), 9: event_schema(), 3: _history("event-v1.avsc")},
    )


@pytest.mark.parametrize("type_", EVENT_TYPES)
def test_an_event_is_framed_with_its_schema_id_and_reads_back(type_: str) -> None:
    codec = Codec(schemas=_registry())
    e = event(type_)
    data = codec.encode_event(e)
    assert data[:1] == CONFLUENT_MAGIC and int.from_bytes(data[1:5], "big") == 9
    # after the header: plain Avro binary of the writer schema, as any Confluent reader sees it
    import io

    plain = fastavro.schemaless_reader(io.BytesIO(data[5:]), fastavro.parse_schema(event_schema()))
    assert plain["sessionId"] == e.session_id and plain["type"] == e.type
    assert codec.decode_event(data) == e
    assert codec.decode_event(data, validate=True) == e
    # the body is the single-object encoding's body: only the header differs
    assert data[5:] == Codec().encode_event(e)[10:]


@pytest.mark.parametrize("type_", COMMAND_TYPES)
def test_a_command_is_framed_with_its_schema_id_and_reads_back(type_: str) -> None:
    codec = Codec(schemas=_registry())
    c = command(type_)
    data = codec.encode_command(c)
    assert data[:5] == b"\x00\x00\x00\x00\x07"
    assert codec.decode_command(data) == c


def test_the_same_event_is_the_same_bytes_for_every_codec_of_the_same_registry() -> None:
    e = event("run.started")
    assert Codec(schemas=_registry()).encode_event(e) == Codec(schemas=_registry()).encode_event(e)


def test_a_mixed_log_reads_through_old_framing_then_new() -> None:
    """A log written before the switch (single-object) and after it (registry ids)."""
    old, new = Codec(), Codec(schemas=_registry())
    events = [event(t) for t in EVENT_TYPES]
    log = [old.encode_event(e) for e in events] + [new.encode_event(e) for e in events]
    assert [new.decode_event(b) for b in log] == events + events
    # and a reader with no registry still reads the old part
    assert [old.decode_event(b) for b in log[: len(events)]] == events


def test_a_record_of_an_older_registered_schema_is_resolved_into_the_current_one() -> None:
    reg = _registry()
    v1 = fastavro.parse_schema(_history("event-v1.avsc"))
    import io

    buf = io.BytesIO()
    buf.write(b"\x00" + (3).to_bytes(4, "big"))
    record = {
        "sessionId": "acme:s1",
        "runId": "r1",
        "seq": 1,
        "type": "run.steered",
        "payload": ("sessionstream.event.Steered", {"text": "go"}),
        "generation": 1,
        "commandId": "c1",
        "ts": 5,
        "tenantId": "acme",
    }
    names = {f["name"] for f in _history("event-v1.avsc")["fields"]}
    fastavro.schemaless_writer(buf, v1, {k: v for k, v in record.items() if k in names})
    got = Codec(schemas=reg).decode_event(buf.getvalue())
    assert (got.session_id, got.type, got.run_id) == ("acme:s1", "run.steered", "r1")
    assert 3 in reg.asked


def test_an_id_the_registry_does_not_have_is_unknown_schema_with_the_id() -> None:
    data = b"\x00" + (404).to_bytes(4, "big") + b"\x02"
    with pytest.raises(UnknownSchema) as e:
        Codec(schemas=_registry()).decode_command(data)
    assert e.value.schema_id == 404 and e.value.reason == "unknown_schema"


def test_each_id_is_asked_once_however_many_threads_meet_it() -> None:
    reg = Registry({"command": 7}, {7: command_schema(), 8: command_schema()})
    codec = Codec(schemas=reg)
    data = b"\x00" + (8).to_bytes(4, "big") + Codec().encode_command(command("prompt"))[10:]
    threads = [threading.Thread(target=codec.decode_command, args=(data,)) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert reg.asked == [8]
    codec.decode_command(data)
    assert reg.asked == [8]
