"""Base class of every wire model: frozen, camelCase on the wire, strict about extras."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


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
