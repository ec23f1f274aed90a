"""Base class of every wire model: frozen, camelCase on the wire, strict about extras."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

_M = TypeVar("_M", bound=BaseModel)
_new = object.__new__
_set = object.__setattr__
# BaseModel's slots, set through their descriptors (no attribute lookup per call)
_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_private = BaseModel.__dict__["__pydantic_private__"].__set__


def construct(
    cls: type[_M], values: dict[str, Any], fields: set[str] | frozenset[str] | None = None
) -> _M:
    """A model from values already of its fields' types, without validation: for records our
    own processes wrote (and validated when they made them). What `model_construct` does,
    minus its per-field default handling (every field is given), which costs 4x as much;
    the unit tests hold the result equal to the validated model. `values` becomes the
    model's `__dict__`, so it is not copied."""
    m = _new(cls)
    _set(m, "__dict__", values)
    _fields_set(m, set(values if fields is None else fields))
    _extra(m, None)
    _private(m, None)
    return m


#: per model: every field's default (factory fields left out), and the factory fields
_Spec = tuple[dict[str, Any], tuple[tuple[str, Any], ...]]
_SPECS: dict[type[BaseModel], _Spec] = {}


def _spec(cls: type[BaseModel]) -> _Spec:
    defaults: dict[str, Any] = {}
    factories: list[tuple[str, Any]] = []
    for name, info in cls.model_fields.items():
        if info.default_factory is not None:
            factories.append((name, info.default_factory))
        # in field order; a required field's placeholder is always overwritten below
        defaults[name] = info.get_default()
    spec = _SPECS[cls] = (defaults, tuple(factories))
    return spec


def make(cls: type[_M], **values: Any) -> _M:
    """`cls(**values)` without validation, defaults filled in: for models the decider builds
    from values that are already valid and typed (a validated command, an event, the
    state). The stateful unit tests validate every event and state it makes this way."""
    defaults, factories = _SPECS.get(cls) or _spec(cls)
    d = {**defaults, **values}
    if len(d) != len(defaults):
        raise TypeError(f"{cls.__name__} has no field(s) {sorted(values.keys() - defaults.keys())}")
    for name, factory in factories:
        if name not in values:
            d[name] = factory()
    return construct(cls, d, set(values))


def replace(model: _M, update: dict[str, Any]) -> _M:
    """`model.model_copy(update=update)` (no validation either) at a fraction of its cost:
    the decider's fold makes one or two of these per event."""
    values = model.__dict__.copy()
    values.update(update)
    return construct(type(model), values, model.__pydantic_fields_set__ | update.keys())


class AvroJsonText:
    """Field metadata: a JSON value the model holds parsed, which Avro carries as its JSON
    text (a string, `logicalType: json`): Avro has no type for any JSON value."""


class WireModel(BaseModel):
    """A frozen model whose JSON/Avro field names are camelCase (the seed's wire format)."""

    model_config = ConfigDict(
        frozen=True,
        populate_by_name=True,
        alias_generator=to_camel,
        extra="forbid",
        strict=False,
    )


class Payload(WireModel):
    """Base of command and event payloads; each concrete payload is bound to one type."""


def check_text(where: str, value: Any) -> None:
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError(f"{where} contains a NUL character (U+0000), which is not stored")
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(
                    f"{where} contains a lone surrogate: not text UTF-8 can encode"
                ) from None
    elif isinstance(value, (list, tuple)):
        for v in value:
            check_text(where, v)
    elif isinstance(value, dict):
        for k, v in value.items():
            check_text(where, k)
            check_text(where, v)


def validate_payload(registry: dict[str, type[Payload]], data: Any, kind: str) -> Any:
    """Shared `mode="before"` validation: pick the payload model from `type`."""
    if not isinstance(data, dict):
        return data
    type_name = data.get("type")
    model = registry.get(type_name) if isinstance(type_name, str) else None
    if model is None:
        raise ValueError(f"unknown {kind} type {type_name!r}")
    payload = data.get("payload", {})
    if payload is None:
        payload = {}
    if not isinstance(payload, model):
        if isinstance(payload, Payload):
            raise ValueError(f"payload {type(payload).__name__} does not fit type {type_name!r}")
        payload = model.model_validate(payload)
    return {**data, "payload": payload}
