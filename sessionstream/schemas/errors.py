"""Typed errors of the wire contract. The processor routes every one of them to the DLQ."""

from __future__ import annotations

from typing import Literal

from sessionstream.errors import SessionstreamError

__all__ = [
    "DeadLetterReason",
    "DecodeError",
    "MalformedRecord",
    "OversizedRecord",
    "SchemaViolation",
    "UnknownSchema",
    "UnknownType",
    "WireError",
]


#: every reason a record on the dead-letter topic carries (`error.reason`)
DeadLetterReason = Literal[
    "malformed",
    "oversized",
    "unknown_schema",
    "unknown_type",
    "schema_violation",
    "key_mismatch",
    "wrong_partition",
    "state_too_large",
    "event_too_large",
]


#: `reason` of a wire error: a dead-letter reason, or the abstract roots' own
ErrorReason = DeadLetterReason | Literal["wire_error", "decode_error"]


class WireError(SessionstreamError):
    """Root of the wire contract's errors."""

    #: short machine-readable reason, recorded in the DLQ and in metrics
    reason: ErrorReason = "wire_error"


class DecodeError(WireError):
    """A record could not be turned into a command or an event."""

    reason: ErrorReason = "decode_error"

    def __init__(self, message: str, *, size: int | None = None) -> None:
        super().__init__(message)
        self.size = size


class MalformedRecord(DecodeError):
    """Bytes that are neither Avro single-object encoding nor a UTF-8 JSON object."""

    reason: ErrorReason = "malformed"


class OversizedRecord(DecodeError):
    """A record larger than the configured maximum."""

    reason: ErrorReason = "oversized"


class UnknownSchema(DecodeError):
    """An Avro record whose writer schema cannot be had: a single-object fingerprint we do
    not know, or a registry schema id the registry does not have."""

    reason: ErrorReason = "unknown_schema"

    def __init__(
        self,
        message: str,
        *,
        fingerprint: bytes = b"",
        schema_id: int | None = None,
        size: int | None = None,
    ) -> None:
        super().__init__(message, size=size)
        self.fingerprint = fingerprint
        self.schema_id = schema_id


class UnknownType(DecodeError):
    """A well-formed record whose `type` is not a command/event type we know."""

    reason: ErrorReason = "unknown_type"

    def __init__(self, message: str, *, type_name: str, size: int | None = None) -> None:
        super().__init__(message, size=size)
        self.type_name = type_name


class SchemaViolation(DecodeError):
    """A record whose fields do not satisfy the model (missing field, wrong type, ...)."""

    reason: ErrorReason = "schema_violation"
