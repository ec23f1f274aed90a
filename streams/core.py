"""One command record in, its outcome out: the step every processor runtime runs.

No Kafka here. A runtime hands in the record's key, value and partition and a way to read
the session's state; it gets back the encoded events (keyed and ordered), the new state,
or a dead letter. Records that cannot be decided — undecodable bytes, unknown types,
schema violations, oversized records, a key that is not the command's session, a command
on a partition its key does not hash to — become dead letters, never exceptions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from schemas.codec import Codec
from schemas.commands import Command
from schemas.errors import DecodeError
from schemas.events import Event
from streams.decider import DEFAULT_CONFIG, DeciderConfig, apply
from streams.partitioning import partition_for
from streams.state import SessionState

__all__ = ["CommandStep", "DeadLetter", "Outcome", "decode_state", "encode_state"]


@dataclass(frozen=True)
class DeadLetter:
    """A record that could not be decided, with why."""

    reason: str
    error: str


@dataclass
class Outcome:
    """What one command record produced."""

    command: Command | None = None
    events: list[Event] = field(default_factory=list)
    #: (key, value) of each event, in order, ready for the events topic
    records: list[tuple[bytes, bytes]] = field(default_factory=list)
    state: SessionState | None = None
    dead_letter: DeadLetter | None = None

    @property
    def duplicate(self) -> bool:
        return self.command is not None and not self.events and self.dead_letter is None


def encode_state(state: SessionState) -> bytes:
    """State table / changelog value."""
    return state.model_dump_json(by_alias=True).encode()


def decode_state(data: bytes) -> SessionState:
    return SessionState.model_validate_json(data)


class CommandStep:
    """Decode, check placement, decide, fold, encode."""

    def __init__(
        self,
        codec: Codec | None = None,
        config: DeciderConfig = DEFAULT_CONFIG,
        partitions: int | None = None,
    ) -> None:
        self.codec = codec or Codec()
        self.config = config
        #: when set, a command whose key hashes (murmur2) elsewhere is a dead letter
        self.partitions = partitions

    def __call__(
        self,
        key: bytes | None,
        value: bytes | None,
        partition: int,
        state_of: Callable[[str], SessionState | None],
    ) -> Outcome:
        if value is None:
            return Outcome(dead_letter=DeadLetter("malformed", "record has no value (tombstone)"))
        try:
            command = self.codec.decode_command(value)
        except DecodeError as e:
            return Outcome(dead_letter=DeadLetter(e.reason, str(e)))
        session_key = command.session_id.encode()
        if key != session_key:
            return Outcome(
                command=command,
                dead_letter=DeadLetter(
                    "key_mismatch",
                    f"record key {key!r} is not the command's sessionId {command.session_id!r}",
                ),
            )
        if self.partitions is not None:
            expected = partition_for(session_key, self.partitions)
            if expected != partition:
                return Outcome(
                    command=command,
                    dead_letter=DeadLetter(
                        "wrong_partition",
                        f"session {command.session_id!r} belongs on partition {expected}, "
                        f"found on {partition}: the producer does not use murmur2",
                    ),
                )
        events, new_state = apply(state_of(command.session_id), command, self.config)
        if not events:
            return Outcome(command=command, state=new_state)
        records = [(e.key.encode(), self.codec.encode_event(e)) for e in events]
        return Outcome(command=command, events=events, records=records, state=new_state)
