"""Whatever bytes arrive, the codec answers with a command or a typed DecodeError, and a
command it accepts can always be decided and its events written: a poison record goes to the
dead-letter topic, it never stops the processor."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstream.core.decider import decide
from sessionstream.schemas._avro import command_schema, event_schema
from sessionstream.schemas.codec import Codec, single_object_header
from sessionstream.schemas.commands import Command
from sessionstream.schemas.errors import DecodeError
from tests.unit._samples import COMMAND_TYPES, EVENT_TYPES, command, event

CODEC = Codec()
HEADERS = [single_object_header(command_schema()), single_object_header(event_schema())]
VALID = [CODEC.encode_command(command(t)) for t in COMMAND_TYPES] + [
    CODEC.encode_event(event(t)) for t in EVENT_TYPES
]
FUZZ = settings(max_examples=300, deadline=None)


def decodes_or_fails_typed(data: bytes) -> None:
    for decode in (CODEC.decode_command, CODEC.decode_event):
        with contextlib.suppress(DecodeError):
            decode(data)


@FUZZ
@given(st.binary(max_size=300))
def test_arbitrary_bytes(data: bytes) -> None:
    decodes_or_fails_typed(data)


@FUZZ
@given(st.sampled_from(HEADERS), st.binary(max_size=300))
def test_known_header_random_body(header: bytes, body: bytes) -> None:
    decodes_or_fails_typed(header + body)


@FUZZ
@given(st.sampled_from(VALID), st.data())
def test_mutated_records(valid: bytes, data: st.DataObject) -> None:
    buf = bytearray(valid)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(2, len(buf) - 1))
        buf[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(buf)))
    decodes_or_fails_typed(bytes(buf[:cut]))
    decodes_or_fails_typed(bytes(buf))


#: values a JSON producer can send that Avro or UTF-8 cannot hold, plus anything else
EDGES = st.sampled_from([2**53, 2**63, 2**64, -(2**63) - 1, 10**30, "\ud800", "a\udfffb", 1e300])
JSON_VALUES = EDGES | st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True)
    | st.text(alphabet=st.characters(codec=None, categories=["L", "N", "P", "Cs", "So"])),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)


def _paths(value: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    return out


def _set(record: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        record = record[key]
    record[path[-1]] = value


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(COMMAND_TYPES), st.data())
def test_accepted_json_commands_can_be_decided_and_written(type_: str, data: st.DataObject) -> None:
    record = json.loads(Codec.command_to_json(command(type_)))
    path = data.draw(st.sampled_from(_paths(record)))
    _set(record, path, data.draw(JSON_VALUES))
    raw = json.dumps(record).encode()  # ensure_ascii: surrogates travel as \\udXXX escapes
    try:
        cmd = CODEC.decode_command(raw)
    except DecodeError:
        return
    assert CODEC.decode_command(CODEC.encode_command(cmd)) == cmd
    assert isinstance(cmd, Command)
    for e in decide(None, cmd).events:
        CODEC.encode_event(e)
