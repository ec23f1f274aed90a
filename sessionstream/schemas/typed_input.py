"""A prompt's typed input: any JSON value JSON can carry, held parsed, travelling as its
compact JSON text (docs/protocol.md#typed-input). Re-exported by
`sessionstream.schemas.commands`."""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import AfterValidator, JsonValue, TypeAdapter

from sessionstream.schemas._base import AvroJsonText

__all__ = ["MAX_INPUT_DEPTH", "JsonInput", "json_text"]

#: how deeply a prompt's input may nest objects and arrays inside each other
MAX_INPUT_DEPTH: Final = 64


def _json_input(value: JsonValue) -> JsonValue:
    """Numbers JSON can write (no NaN, no Infinity: PostgreSQL's jsonb and JSON readers
    take neither), nesting at most `MAX_INPUT_DEPTH` deep."""
    todo: list[tuple[JsonValue, int]] = [(value, 1)]
    while todo:
        v, depth = todo.pop()
        if isinstance(v, float) and v - v != 0:  # inf - inf and nan - nan are nan, not 0
            raise ValueError(f"the input holds {v}, a number JSON cannot carry")
        if isinstance(v, dict | list):
            if depth > MAX_INPUT_DEPTH:
                raise ValueError(f"the input nests deeper than {MAX_INPUT_DEPTH} levels")
            todo.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    return value


#: a prompt's typed input: any JSON value (null: none), held parsed; Avro carries its
#: JSON text
JsonInput = Annotated[JsonValue, AfterValidator(_json_input), AvroJsonText()]

_JSON: Final = TypeAdapter(JsonValue)


def json_text(value: JsonValue) -> str:
    """A JSON value's compact text (no spaces, non-ASCII kept, object keys in their order):
    what the state, the events and the open-runs record hold of a prompt's input."""
    return _JSON.dump_json(value).decode()
