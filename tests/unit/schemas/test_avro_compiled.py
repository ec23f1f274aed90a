"""The compiled Avro writers and readers against fastavro, the reference implementation.

For every command and event payload type, envelopes with generated field values (edge
lengths, multi-byte varints, non-ASCII text, empty and long arrays, None in every optional
field) must encode to fastavro's bytes exactly and read back to what fastavro reads; cut or
damaged records are refused by the compiled reader (the codec then asks fastavro, which says
what is wrong), never misread.
"""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from sessionstream.schemas._avro import command_schema, event_schema
from sessionstream.schemas._avro_compiled import ReadError
from sessionstream.schemas._base import construct
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.commands import COMMAND_PAYLOADS, Command
from sessionstream.schemas.errors import DecodeError
from sessionstream.schemas.events import EVENT_PAYLOADS, Event
from tests.unit._samples import COMMAND_TYPES, EVENT_TYPES, command, event

CODEC = Codec()
KINDS: dict[str, tuple[Any, dict[str, Any], Any, dict[str, Any]]] = {
    "command": (CODEC._cmd, command_schema(), Command, COMMAND_PAYLOADS),
    "event": (CODEC._evt, event_schema(), Event, EVENT_PAYLOADS),
}
LONGS = st.one_of(
    st.integers(-64, 63),
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([-(2**63), 2**63 - 1, 63, 64, -65, 127, 128, 2**31, 2**53]),
)
TEXT = st.one_of(st.text(max_size=70), st.text(min_size=60, max_size=300), st.just(""))


#: any JSON value (a `logicalType: json` string holds its text)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | LONGS | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=5),
    max_leaves=12,
)


LABELS = st.none() | st.dictionaries(TEXT, TEXT, min_size=1, max_size=5)


def value_for(t: Any) -> st.SearchStrategy[Any]:
    if isinstance(t, dict) and t.get("logicalType") == "json":
        return JSON_VALUES
    if t == "string":
        return TEXT
    if t in ("long", "int"):
        return LONGS
    if t == "boolean":
        return st.booleans()
    if t == "double":  # NaN reads back as NaN, which equals nothing: left out
        return st.floats(allow_nan=False)
    if isinstance(t, list):
        return st.one_of(st.none(), value_for(t[1]))
    if isinstance(t, dict) and t["type"] == "array":
        return st.lists(value_for(t["items"]), max_size=70)
    raise AssertionError(f"the test does not generate {t!r}")


def names(model: type[BaseModel]) -> dict[str, str]:
    return {(i.alias or n): n for n, i in model.model_fields.items()}


@st.composite
def envelopes(draw: st.DrawFn, kind: str) -> Any:
    """A model of the kind with any values the wire types allow (built without validation:
    the writer's bytes are the subject, not the models' own constraints)."""
    _, schema, envelope, payloads = KINDS[kind]
    type_name = draw(st.sampled_from(sorted(payloads)))
    model = payloads[type_name]
    record = next(r for r in schema["fields"][-1]["type"] if r["name"] == model.__name__)
    pn = names(model)
    payload = construct(
        model,
        {
            # a run's labels are JSON text in Avro, a string map in the model
            pn[f["name"]]: draw(LABELS if f["name"] == "metadata" else value_for(f["type"]))
            for f in record["fields"]
        },
    )
    en = names(envelope)
    values = {en[f["name"]]: draw(value_for(f["type"])) for f in schema["fields"][:-1]}
    values["type"] = type_name
    values["payload"] = payload
    return construct(envelope, {n: values[n] for n in envelope.model_fields})


def fastavro_bytes(kind: str, model: Any) -> bytes:
    k = KINDS[kind][0]
    record = model.model_dump(by_alias=True)
    record["payload"] = (k.payload_names[type(model.payload)], record["payload"])
    buf = io.BytesIO()
    buf.write(k.header)
    fastavro.schemaless_writer(buf, k.schema, record)
    return buf.getvalue()


def fastavro_dict(kind: str, data: bytes) -> dict[str, Any]:
    k = KINDS[kind][0]
    buf = io.BytesIO(data)
    buf.seek(10)
    record: Any = fastavro.schemaless_reader(buf, k.schema, None, return_record_name=True)
    assert buf.tell() == len(data) and isinstance(record, dict)
    record["payload"] = record["payload"][1]
    return record


def test_both_envelopes_compile() -> None:
    assert CODEC._cmd.compiled is not None and CODEC._evt.compiled is not None


@pytest.mark.parametrize("kind", ["command", "event"])
@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_bytes_are_fastavros_and_read_back(kind: str, data: st.DataObject) -> None:
    model = data.draw(envelopes(kind))
    compiled = KINDS[kind][0].compiled
    assert compiled is not None
    expected = fastavro_bytes(kind, model)
    assert compiled.write(model) == expected
    assert compiled.read_dict(expected, 10) == fastavro_dict(kind, expected)
    back = compiled.read(expected, 10)
    assert back.model_dump() == model.model_dump()
    assert type(back.payload) is type(model.payload)


@pytest.mark.parametrize("type_", EVENT_TYPES)
def test_every_sample_event_reads_equal_to_the_validated_event(type_: str) -> None:
    e = event(type_)
    data = CODEC.encode_event(e)
    assert data == fastavro_bytes("event", e)
    fast, validated = CODEC.decode_event(data), CODEC.decode_event(data, validate=True)
    assert fast == validated == e
    assert fast.model_dump(by_alias=True) == e.model_dump(by_alias=True)
    assert CODEC.encode_event(fast) == data


@pytest.mark.parametrize("type_", COMMAND_TYPES)
def test_every_sample_command_encodes_as_fastavro_does(type_: str) -> None:
    c = command(type_)
    data = CODEC.encode_command(c)
    assert data == fastavro_bytes("command", c)
    assert CODEC.decode_command(data) == c


@pytest.mark.parametrize("kind", ["command", "event"])
@pytest.mark.parametrize("type_", ["first", "last"])
def test_every_cut_of_a_record_is_refused(kind: str, type_: str) -> None:
    sample = (
        command(COMMAND_TYPES[0 if type_ == "first" else -1])
        if kind == "command"
        else (event(EVENT_TYPES[0 if type_ == "first" else -1]))
    )
    compiled = KINDS[kind][0].compiled
    assert compiled is not None
    data = compiled.write(sample)
    for cut in range(10, len(data)):
        with pytest.raises(ReadError):
            compiled.read_dict(data[:cut], 10)
        with pytest.raises(ReadError):
            compiled.read(data[:cut], 10)
        with pytest.raises(DecodeError):  # the codec's answer: a typed error
            (CODEC.decode_command if kind == "command" else CODEC.decode_event)(data[:cut])
    with pytest.raises(ReadError, match="trailing"):
        compiled.read(data + b"\x00", 10)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_damaged_event_is_refused_or_read_as_fastavro_reads_it(data: st.DataObject) -> None:
    """Flip one byte of an event: the compiled reader either refuses it or reads exactly
    what fastavro reads; it never invents a different record."""
    e = event(data.draw(st.sampled_from(EVENT_TYPES)))
    raw = bytearray(CODEC.encode_event(e))
    at = data.draw(st.integers(10, len(raw) - 1))
    raw[at] = data.draw(st.integers(0, 255))
    damaged = bytes(raw)
    compiled = CODEC._evt.compiled
    assert compiled is not None
    try:
        mine = compiled.read_dict(damaged, 10)
    except ReadError:
        return
    assert mine == fastavro_dict("event", damaged)


def test_an_event_whose_type_does_not_match_its_payload_is_validated_and_refused() -> None:
    e = event("run.started")
    other = next(t for t in EVENT_TYPES if EVENT_PAYLOADS[t] is not type(e.payload))
    forged = construct(Event, {**e.__dict__, "type": other})
    data = fastavro_bytes("event", forged)
    compiled = CODEC._evt.compiled
    assert compiled is not None
    with pytest.raises(ReadError, match="does not carry"):
        compiled.read(data, 10)
    with pytest.raises(DecodeError):
        CODEC.decode_event(data)
