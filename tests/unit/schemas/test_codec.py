"""The wire contract: Avro single-object encoding, JSON commands, evolution, typed errors."""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Callable
from typing import Any

import fastavro
import pytest
from fastavro.schema import fingerprint, to_parsing_canonical_form

from sessionstream.core.decider import decide, evolve
from sessionstream.core.state import SessionState
from sessionstream.schemas._avro import command_schema, event_schema
from sessionstream.schemas.codec import MAGIC, Codec, crc64_avro, single_object_header
from sessionstream.schemas.commands import COMMAND_PAYLOADS, MAX_WIRE_INT, Command
from sessionstream.schemas.errors import (
    DecodeError,
    MalformedRecord,
    OversizedRecord,
    SchemaViolation,
    UnknownSchema,
    UnknownType,
)
from sessionstream.schemas.events import EVENT_PAYLOADS
from tests.unit._samples import COMMAND_TYPES, EVENT_TYPES, command, event

CODEC = Codec()


def test_samples_cover_every_type() -> None:
    assert set(COMMAND_TYPES) == set(COMMAND_PAYLOADS)
    assert set(EVENT_TYPES) == set(EVENT_PAYLOADS)


@pytest.mark.parametrize("type_", COMMAND_TYPES)
def test_command_avro_round_trip(type_: str) -> None:
    cmd = command(type_)
    data = CODEC.encode_command(cmd)
    assert data[:2] == MAGIC
    assert CODEC.decode_command(data) == cmd


@pytest.mark.parametrize("type_", COMMAND_TYPES)
def test_command_json_round_trip(type_: str) -> None:
    cmd = command(type_)
    data = Codec.command_to_json(cmd)
    assert b'"commandId"' in data and b"command_id" not in data
    assert CODEC.decode_command(data) == cmd


@pytest.mark.parametrize("type_", EVENT_TYPES)
def test_event_avro_round_trip(type_: str) -> None:
    evt = event(type_)
    data = CODEC.encode_event(evt)
    assert CODEC.decode_event(data) == evt
    assert CODEC.encode_event(CODEC.decode_event(data)) == data  # same event, same bytes


def test_json_command_from_another_language() -> None:
    raw = b""" \n\t {"commandId": "c-1", "sessionId": "s-1", "tenantId": "acme",
        "type": "prompt", "ts": 1700000000000,
        "payload": {"text": "find flights", "policy": "enqueue", "timeoutMs": 60000}}"""
    cmd = CODEC.decode_command(raw)
    assert (cmd.command_id, cmd.session_id, cmd.tenant_id, cmd.ts) == (
        "c-1",
        "s-1",
        "acme",
        1_700_000_000_000,
    )
    assert cmd.payload.model_dump() == {
        "text": "find flights",
        "policy": "enqueue",
        "context_ref": None,
        "timeout_ms": 60_000,
        "retry_of": None,
    }


def test_seed_event_json_is_camel_case() -> None:
    out = Codec.event_to_json(event("run.finished"))
    assert set(out) == {
        "sessionId",
        "runId",
        "seq",
        "type",
        "payload",
        "generation",
        "commandId",
        "ts",
        "tenantId",
        "producerTs",
    }
    assert out["payload"]["terminalStatus"] == "timed_out"


# -- the single-object header ---------------------------------------------------------------------


def test_crc64_avro_matches_the_spec_and_fastavro() -> None:
    assert crc64_avro(b'"null"') == 7195948357588979594  # the Avro spec's own example
    for schema in (command_schema(), event_schema()):
        canonical = to_parsing_canonical_form(schema)
        fp = crc64_avro(canonical.encode()).to_bytes(8, "little")
        assert fp.hex() == fingerprint(canonical, "CRC-64-AVRO")
        assert single_object_header(schema) == b"\xc3\x01" + fp


def test_records_carry_their_writer_fingerprint() -> None:
    cmd_fp = single_object_header(command_schema())
    evt_fp = single_object_header(event_schema())
    assert cmd_fp != evt_fp
    assert CODEC.encode_command(command("prompt"))[:10] == cmd_fp
    assert CODEC.encode_event(event("run.started"))[:10] == evt_fp


# -- schema evolution, both directions ------------------------------------------------------------


def newer_command_schema() -> dict[str, Any]:
    """The current schema plus a field with a default in the envelope and in a payload."""
    schema = copy.deepcopy(command_schema())
    schema["fields"].insert(-1, {"name": "priority", "type": "int", "default": 0})
    prompt = next(r for r in schema["fields"][-1]["type"] if r["name"] == "PromptPayload")
    prompt["fields"].append({"name": "locale", "type": ["null", "string"], "default": None})
    return schema


def test_newer_reader_reads_records_of_the_current_writer() -> None:
    cmd = command("prompt")
    data = CODEC.encode_command(cmd)
    assert data[:10] == single_object_header(command_schema())
    writer = fastavro.parse_schema(command_schema())
    reader = fastavro.parse_schema(newer_command_schema())
    record = fastavro.schemaless_reader(
        io.BytesIO(data[10:]), writer, reader, return_record_name=True
    )
    name, payload = record.pop("payload")
    assert record.pop("priority") == 0  # the reader's default
    assert payload.pop("locale") is None
    assert name == "sessionstream.command.PromptPayload"
    expected = cmd.model_dump(by_alias=True)
    assert {**record, "payload": payload} == expected


def test_current_reader_reads_records_of_a_newer_writer() -> None:
    newer = newer_command_schema()
    cmd = command("prompt")
    record = cmd.model_dump(by_alias=True)
    record["priority"] = 7
    payload = {**record["payload"], "locale": "de"}
    record["payload"] = ("sessionstream.command.PromptPayload", payload)
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(newer), record)
    header = single_object_header(newer)
    data = header + body.getvalue()
    with pytest.raises(UnknownSchema) as err:
        Codec().decode_command(data)  # a codec that never heard of the newer schema
    assert err.value.fingerprint == header[2:]
    codec = Codec()
    assert codec.add_command_writer_schema(newer) == header
    assert codec.decode_command(data) == cmd  # the new fields are dropped by resolution


def test_current_event_reader_reads_a_newer_event_writer() -> None:
    newer = copy.deepcopy(event_schema())
    newer["fields"].insert(-1, {"name": "partition", "type": ["null", "int"], "default": None})
    evt = event("run.steered")
    record = evt.model_dump(by_alias=True)
    record["partition"] = 3
    record["payload"] = ("sessionstream.event.Steered", record["payload"])
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(newer), record)
    codec = Codec()
    header = codec.add_event_writer_schema(newer)
    assert codec.decode_event(header + body.getvalue()) == evt


# -- typed errors ---------------------------------------------------------------------------------

_OK = {
    "commandId": "c",
    "sessionId": "s",
    "tenantId": "t",
    "type": "prompt",
    "ts": 1,
    "payload": {"text": "x"},
}


def _json(**over: Any) -> bytes:
    return json.dumps({**_OK, **over}).encode()


def _avro_with_type(type_: str) -> bytes:
    record = command("prompt").model_dump(by_alias=True)
    record["type"] = type_
    record["payload"] = ("sessionstream.command.PromptPayload", record["payload"])
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(command_schema()), record)
    return single_object_header(command_schema()) + buf.getvalue()


ERRORS: list[tuple[str, Callable[[], bytes], type[DecodeError]]] = [
    ("random-bytes", lambda: b"\x01\x17garbage\xff", MalformedRecord),
    ("confluent-truncated", lambda: b"\x00\x00\x01", MalformedRecord),
    # a registry id this reader cannot look up (it has no registry)
    ("confluent-unknown-id", lambda: b"\x00\x17garbage\xff", UnknownSchema),
    ("empty", lambda: b"", MalformedRecord),
    ("blank", lambda: b"  \n ", MalformedRecord),
    ("magic-only", lambda: MAGIC, MalformedRecord),
    ("truncated-header", lambda: CODEC.encode_command(command("prompt"))[:7], MalformedRecord),
    ("truncated-body", lambda: CODEC.encode_command(command("prompt"))[:-3], MalformedRecord),
    ("trailing-bytes", lambda: CODEC.encode_command(command("steer")) + b"\x00", MalformedRecord),
    ("unknown-fingerprint", lambda: MAGIC + b"\x01" * 8 + b"\x02c", UnknownSchema),
    ("event-fingerprint", lambda: CODEC.encode_event(event("run.steered")), UnknownSchema),
    ("json-wrong-type", lambda: _json(ts="yesterday"), SchemaViolation),
    ("json-missing-field", lambda: _json(payload={}), SchemaViolation),
    ("json-extra-field", lambda: _json(colour="red"), SchemaViolation),
    ("json-worker-without-run", lambda: _json(type="lease.renew", payload={}), SchemaViolation),
    (
        "json-payload-of-other-type",
        lambda: _json(type="steer", payload={"text": "x", "policy": "reject"}),
        SchemaViolation,
    ),
    ("json-unknown-type", lambda: _json(type="teleport"), UnknownType),
    ("json-type-not-string", lambda: _json(type=["prompt"]), UnknownType),
    ("avro-unknown-type", lambda: _avro_with_type("teleport"), UnknownType),
    ("avro-payload-of-other-type", lambda: _avro_with_type("steer"), SchemaViolation),
    ("json-not-utf8", lambda: b'{"commandId": "\xff\xfe"}', MalformedRecord),
    ("json-invalid", lambda: b'{"commandId": ', MalformedRecord),
    ("json-array", lambda: b'[{"commandId": "c"}]', MalformedRecord),
    ("json-bom", lambda: b"\xef\xbb\xbf" + _json(), MalformedRecord),
    # found by these tests: these crashed the decoder (or, later, the decider) before
    ("json-deep-nesting", lambda: b'{"a": ' + b"[" * 100_000, MalformedRecord),
    ("json-int-beyond-digit-limit", lambda: b'{"ts": ' + b"9" * 5_000 + b"}", MalformedRecord),
    ("json-lone-surrogate", lambda: _json(payload={"text": "a\ud800b"}), MalformedRecord),
    ("json-ts-beyond-long", lambda: _json(ts=2**63), SchemaViolation),
    ("json-ts-beyond-wire-int", lambda: _json(ts=MAX_WIRE_INT + 1), SchemaViolation),
    (
        "json-generation-beyond-long",
        lambda: _json(type="lease.renew", runId="r", workerId="w", generation=2**64, payload={}),
        SchemaViolation,
    ),
    (
        "json-lease-beyond-wire-int",
        lambda: _json(type="lease.acquire", runId="r", workerId="w", payload={"leaseMs": 2**62}),
        SchemaViolation,
    ),
]


@pytest.mark.parametrize(("make", "error"), [pytest.param(m, e, id=i) for i, m, e in ERRORS])
def test_typed_decode_errors(make: Callable[[], bytes], error: type[DecodeError]) -> None:
    data = make()
    with pytest.raises(error) as err:
        CODEC.decode_command(data)
    assert type(err.value) is error
    assert err.value.size == len(data) and str(err.value)


def test_oversized_record() -> None:
    data = _json(payload={"text": "x" * 200})
    with pytest.raises(OversizedRecord) as err:
        Codec(max_record_bytes=100).decode_command(data)
    assert err.value.size == len(data) and err.value.reason == "oversized"
    assert Codec(max_record_bytes=len(data)).decode_command(data).type == "prompt"


def test_events_are_avro_only() -> None:
    with pytest.raises(MalformedRecord):
        CODEC.decode_event(json.dumps(Codec.event_to_json(event("run.steered"))).encode())


def test_paired_surrogates_are_text_not_an_error() -> None:
    cmd = CODEC.decode_command(
        b'{"commandId":"c","sessionId":"s","tenantId":"t","type":"steer",'
        b'"ts":1,"payload":{"text":"\\ud83d\\ude00 \\u00e9"}}'
    )
    assert cmd.payload.model_dump() == {"text": "\U0001f600 é"}


def test_largest_wire_ints_still_encode_after_the_decider_adds_to_them() -> None:
    start = Command(
        command_id="c1",
        session_id="s",
        tenant_id="t",
        type="prompt",
        ts=MAX_WIRE_INT,
        payload={"text": "x", "timeout_ms": MAX_WIRE_INT},
    )
    [started] = decide(None, start).events
    acquire = Command(
        command_id="c2",
        session_id="s",
        tenant_id="t",
        type="lease.acquire",
        ts=MAX_WIRE_INT,
        run_id=started.run_id,
        worker_id="w",
        payload={"lease_ms": MAX_WIRE_INT},
    )
    state = evolve(SessionState.initial("s"), started)
    for e in [started, *decide(state, acquire).events]:
        assert CODEC.decode_event(CODEC.encode_event(e)) == e


def test_an_open_runs_record_of_a_later_version_is_still_taken() -> None:
    """A worker older than the processor reads an open-runs record with a field it does not
    know: it takes the run (a refused record would leave the run without a holder)."""
    from sessionstream.schemas.discovery import OpenRun

    later = (
        '{"sessionId": "s", "tenantId": "t", "runId": "r", "generation": 1, "status": "running",'
        ' "prompt": "p", "openedAt": 1, "actor": "user:ann", "aFieldOfLater": {"x": 1}}'
    )
    run = OpenRun.model_validate_json(later)
    assert (run.run_id, run.actor) == ("r", "user:ann")
