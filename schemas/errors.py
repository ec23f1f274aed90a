"""Typed errors of the wire contract. The processor routes every one of them to the DLQ."""

from __future__ import annotations

__all__ = [
    "DecodeError",
    "MalformedRecord",
    "OversizedRecord",
    "SchemaViolation",
    "UnknownSchema",
    "UnknownType",
    "WireError",
]


class WireError(Exception):
    """Root of the wire contract's errors."""

    #: short machine-readable reason, recorded in the DLQ and in metrics
    reason: str = "wire_error"


class DecodeError(WireError):
    """A record could not be turned into a command or an event."""

    reason = "decode_error"

    def __init__(self, message: str, *, size: int | None = None) -> None:
        super().__init__(message)
        self.size = size


class MalformedRecord(DecodeError):
    """Bytes that are neither Avro single-object encoding nor a UTF-8 JSON object."""

    reason = "malformed"


class OversizedRecord(DecodeError):
    """A record larger than the configured maximum."""

    reason = "oversized"


class UnknownSchema(DecodeError):
    """Avro single-object encoding whose writer-schema fingerprint we do not know."""

    reason = "unknown_schema"

    def __init__(self, message: str, *, fingerprint: bytes, size: int | None = None) -> None:
        super().__init__(message, size=size)
        self.fingerprint = fingerprint


class UnknownType(DecodeError):
    """A well-formed record whose `type` is not a command/event type we know."""

    reason = "unknown_type"

    def __init__(self, message: str, *, type_name: str, size: int | None = None) -> None:
        super().__init__(message, size=size)
        self.type_name = type_name


class SchemaViolation(DecodeError):
    """A record whose fields do not satisfy the model (missing field, wrong type, ...)."""

    reason = "schema_violation"
