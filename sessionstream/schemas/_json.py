"""Python values as the JSON the protocol carries: pydantic models and dataclasses dumped to
their JSON values (a prompt's typed input from the SDK, a handler's result), everything
else left to the strict checks of whoever takes it."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from pydantic import BaseModel, TypeAdapter

__all__ = ["dump_model", "jsonable"]


@functools.lru_cache(maxsize=256)
def _adapter(cls: type) -> TypeAdapter[Any]:
    return TypeAdapter(cls)


def dump_model(value: object) -> Any:
    """A pydantic model's or a dataclass instance's JSON value (as its own serialisation
    says: aliases, dates as text, ...); TypeError for anything else, as `json.dumps` says
    it (a `default=` for `json.dumps` that keeps refusing what is not JSON)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _adapter(type(value)).dump_python(value, mode="json")
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def jsonable(value: Any) -> Any:
    """`value` with every pydantic model and dataclass in it (at any depth of dicts, lists
    and tuples) dumped to its JSON value; the rest as it is."""
    if isinstance(value, BaseModel) or (
        dataclasses.is_dataclass(value) and not isinstance(value, type)
    ):
        return dump_model(value)
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value
