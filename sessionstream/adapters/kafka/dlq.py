"""The dead-letter contract: what a record on the DLQ carries besides its original bytes.

The processor writes each undecidable record to `session.dlq` with its original key,
value and headers, plus these headers; the SDK reads them to report a command's outcome as
`dead_letter`; operators read them to find and fix the producer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = [
    "ERROR_MESSAGE",
    "ERROR_REASON",
    "SOURCE_OFFSET",
    "SOURCE_PARTITION",
    "SOURCE_TOPIC",
    "DeadLetter",
    "dead_letter_headers",
]

SOURCE_TOPIC: Final = "source.topic"
SOURCE_PARTITION: Final = "source.partition"
SOURCE_OFFSET: Final = "source.offset"
ERROR_REASON: Final = "error.reason"
ERROR_MESSAGE: Final = "error.message"

_MAX_MESSAGE: Final = 4000


def dead_letter_headers(
    original: list[tuple[str, str | bytes | None]] | dict[str, str | bytes | None] | None,
    topic: str,
    partition: int,
    offset: int,
    reason: str,
    message: str,
) -> list[tuple[str, str | bytes | None]]:
    """The original record's headers followed by where it came from and why it is here."""
    kept = list(original.items()) if isinstance(original, dict) else list(original or [])
    return [
        *kept,
        (SOURCE_TOPIC, topic.encode()),
        (SOURCE_PARTITION, str(partition).encode()),
        (SOURCE_OFFSET, str(offset).encode()),
        (ERROR_REASON, reason.encode()),
        (ERROR_MESSAGE, message.encode()[:_MAX_MESSAGE]),
    ]


@dataclass(frozen=True)
class DeadLetter:
    """Where a dead-lettered record was read, and why it could not be decided."""

    topic: str
    partition: int
    offset: int
    reason: str
    message: str

    @classmethod
    def from_headers(cls, headers: dict[str, bytes]) -> DeadLetter | None:
        """None when the record does not carry the contract's headers."""
        try:
            return cls(
                headers[SOURCE_TOPIC].decode(),
                int(headers[SOURCE_PARTITION]),
                int(headers[SOURCE_OFFSET]),
                headers.get(ERROR_REASON, b"dead_letter").decode(),
                headers.get(ERROR_MESSAGE, b"").decode(errors="replace"),
            )
        except (KeyError, ValueError):
            return None
