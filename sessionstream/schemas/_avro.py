"""Derive the Avro schemas of the envelopes from the pydantic models.

The checked-in `sessionstream/schemas/avro/*.avsc` files are the contract; `python -m
sessionstream.schemas.gen` rewrites
them from the models and a unit test fails when the two disagree. Evolution rule: only add
fields that have a default, never rename or retype one; old files move to `avro/history/` so
their records stay readable.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal, get_args, get_origin

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from sessionstream.schemas._base import AvroJsonText, Payload

NAMESPACE = "sessionstream"

#: a JSON value as its JSON text: Avro readers that do not know the logical type read the
#: string (the Avro spec: an unknown logical type is its underlying type)
JSON_TEXT: dict[str, str] = {"type": "string", "logicalType": "json"}

_PRIMITIVES: dict[Any, str] = {str: "string", int: "long", bool: "boolean", float: "double"}


def _avro_type(annotation: Any) -> tuple[Any, bool]:
    """Return (avro type, nullable) for a field annotation."""
    origin = get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"unsupported union {annotation!r}")
        inner, _ = _avro_type(args[0])
        return ["null", inner], True
    if origin is Literal:
        return "string", False
    if origin is list:
        (item,) = get_args(annotation)
        inner, _ = _avro_type(item)
        return {"type": "array", "items": inner}, False
    if annotation in _PRIMITIVES:
        return _PRIMITIVES[annotation], False
    raise TypeError(f"unsupported field type {annotation!r}")


def _field(name: str, info: FieldInfo) -> dict[str, Any]:
    if any(isinstance(m, AvroJsonText) for m in info.metadata):
        # any JSON value, null among them: null is the union's null, the rest their text
        avro_type, nullable = ["null", dict(JSON_TEXT)], True
    else:
        avro_type, nullable = _avro_type(info.annotation)
    field: dict[str, Any] = {"name": info.alias or name, "type": avro_type}
    if info.default_factory is not None:
        field["default"] = info.default_factory()  # type: ignore[call-arg]
    elif info.default is not PydanticUndefined:
        field["default"] = info.default
    elif nullable:
        field["default"] = None
    return field


def payload_record(model: type[Payload], namespace: str) -> dict[str, Any]:
    """The Avro record of one payload model."""
    return {
        "type": "record",
        "name": model.__name__,
        "namespace": namespace,
        "doc": (model.__doc__ or model.__name__).strip().splitlines()[0],
        "fields": [_field(n, f) for n, f in model.model_fields.items()],
    }


def envelope_schema(
    name: str,
    doc: str,
    envelope_fields: list[dict[str, Any]],
    payloads: dict[str, type[Payload]],
) -> dict[str, Any]:
    """An envelope record whose `payload` is a union of the distinct payload records."""
    namespace = f"{NAMESPACE}.{name.lower()}"
    seen: list[type[Payload]] = []
    for model in payloads.values():
        if model not in seen:
            seen.append(model)
    return {
        "type": "record",
        "name": name,
        "namespace": NAMESPACE,
        "doc": doc,
        "fields": [
            *envelope_fields,
            {"name": "payload", "type": [payload_record(m, namespace) for m in seen]},
        ],
    }


def command_schema() -> dict[str, Any]:
    from sessionstream.schemas.commands import COMMAND_PAYLOADS

    opt_str = ["null", "string"]
    return envelope_schema(
        "Command",
        "A command to a session (sessionstream wire contract).",
        [
            {"name": "commandId", "type": "string"},
            {"name": "sessionId", "type": "string"},
            {"name": "tenantId", "type": "string"},
            {"name": "type", "type": "string"},
            {"name": "ts", "type": "long"},
            {"name": "runId", "type": opt_str, "default": None},
            {"name": "workerId", "type": opt_str, "default": None},
            {"name": "generation", "type": ["null", "long"], "default": None},
            {"name": "actor", "type": opt_str, "default": None},
        ],
        COMMAND_PAYLOADS,
    )


def event_schema() -> dict[str, Any]:
    from sessionstream.schemas.events import EVENT_PAYLOADS

    return envelope_schema(
        "Event",
        "An event of a session's run (sessionstream wire contract).",
        [
            {"name": "sessionId", "type": "string"},
            {"name": "runId", "type": "string"},
            {"name": "seq", "type": "long"},
            {"name": "type", "type": "string"},
            {"name": "generation", "type": "long", "default": 0},
            {"name": "commandId", "type": "string"},
            {"name": "ts", "type": "long"},
            {"name": "tenantId", "type": "string"},
            {"name": "producerTs", "type": ["null", "long"], "default": None},
        ],
        EVENT_PAYLOADS,
    )


def outcome_schema() -> dict[str, Any]:
    """The record of `session.outcomes` (`sessionstream.schemas.outcomes.CommandOutcome`)."""
    from sessionstream.schemas.outcomes import CommandOutcome

    return {
        "type": "record",
        "name": "Outcome",
        "namespace": NAMESPACE,
        "doc": "What became of one command the processor read (sessionstream wire contract).",
        "fields": [_field(n, f) for n, f in CommandOutcome.model_fields.items()],
    }
