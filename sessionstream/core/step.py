"""One command record in, its outcome out: the step every processor runtime runs.

No Kafka here. A runtime hands in the record's key, value, partition and append time, and
ways to read the session's state and its dedup records; it gets back the encoded events
(keyed and ordered), the new state, the dedup record to keep, a partition to forward the
record to, or a dead letter. Records that cannot be decided — undecodable bytes, unknown
types, schema violations, oversized records, a key that is not the command's session, a
decision whose records would exceed what the topics take — become dead letters, never
exceptions. A command on a partition its key does not hash to is forwarded to the right
one (and decided there), unless it was forwarded already.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from sessionstream.core.decider import DEFAULT_CONFIG, DeciderConfig, decide
from sessionstream.core.partitioning import partition_for
from sessionstream.core.state import SessionState, command_hash
from sessionstream.core.state_codec import decode_state, encode_state
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.commands import Command, CommandClass
from sessionstream.schemas.errors import DecodeError
from sessionstream.schemas.events import Event

__all__ = [
    "FORGET",
    "FORWARDED_HEADER",
    "CommandStep",
    "DedupRecord",
    "StepOutcome",
    "Undecidable",
    "decode_dedup",
    "decode_state",
    "dedup_key",
    "encode_dedup",
    "encode_state",
    "read_remembered",
    "remembered",
]

#: header a forwarded command carries: `{topic}/{partition}/{offset}` it was first read at
FORWARDED_HEADER: Final = "sessionstream.forwarded-from"
#: the largest state record / event record the topics are configured to take
DEFAULT_MAX_STATE_BYTES: Final = 4 * 1024 * 1024 - 64 * 1024
DEFAULT_MAX_EVENT_BYTES: Final = 2 * 1024 * 1024 - 64 * 1024
#: bytes per byte of held text a state record may take (the binary record holds text as is;
#: 6 is JSON's worst case, `\\u0001`, kept as the margin)
_JSON_INFLATION: Final = 6
_STATE_OVERHEAD: Final = 256 * 1024


@dataclass(frozen=True)
class Undecidable:
    """A record that could not be decided, with why (it goes to the dead-letter topic)."""

    reason: str
    error: str


@dataclass(frozen=True)
class DedupRecord:
    """What a session remembers of one command id: its content digest, and when."""

    session_id: str
    id_hash: int
    digest: int
    at: int


@dataclass
class StepOutcome:
    """What one command record produced."""

    command: Command | None = None
    events: list[Event] = field(default_factory=list)
    #: (key, value) of each event, in order, ready for the events topic
    records: list[tuple[bytes, bytes]] = field(default_factory=list)
    state: SessionState | None = None
    remember: DedupRecord | None = None
    dead_letter: Undecidable | None = None
    #: an exact duplicate: when the command id was first decided (its outcome says so)
    first_decided_at: int | None = None
    #: the partition the record belongs to, when it was found on another one
    forward_to: int | None = None

    @property
    def duplicate(self) -> bool:
        return (
            self.command is not None
            and not self.events
            and self.dead_letter is None
            and self.forward_to is None
        )


_DEDUP = struct.Struct(">QQ")


def dedup_key(session_id: str, id_hash: int) -> bytes:
    """Dedup changelog key: `{sessionId}/{commandId digest as 16 hex digits}`."""
    return f"{session_id}/{id_hash:016x}".encode()


def encode_dedup(record: DedupRecord) -> bytes:
    """Dedup changelog value: content digest and decision time, 16 bytes."""
    return _DEDUP.pack(record.digest, record.at)


def decode_dedup(key: bytes, value: bytes) -> DedupRecord:
    session_id, _, h = key.decode().rpartition("/")
    digest, at = _DEDUP.unpack(value)
    return DedupRecord(session_id, int(h, 16), digest, at)


#: an erasure's outcome says so in place of a record: every id its session remembered
#: before it is forgotten
FORGET: Final = "forget"


def remembered(record: DedupRecord) -> str:
    """A dedup record as the outcome record carries it (its `sessionstream.dedup` header):
    `{id hash}:{content digest}:{decided at}`, the digests as 16 hex digits each."""
    return f"{record.id_hash:016x}:{record.digest:016x}:{record.at}"


def read_remembered(session_id: str, text: str) -> DedupRecord | None:
    """The dedup record an outcome record carries, or None if `text` is not one (the
    caller treats `FORGET` first)."""
    h, _, rest = text.partition(":")
    digest, _, at = rest.partition(":")
    try:
        if len(h) != 16 or len(digest) != 16:
            return None
        return DedupRecord(session_id, int(h, 16), int(digest, 16), int(at))
    except ValueError:
        return None


#: (session id, command id digest) -> (content digest, decided at), or None
DedupLookup = Callable[[str, int], tuple[int, int] | None]


class CommandStep:
    """Decode, check placement, deduplicate, decide, fold, encode, check sizes."""

    def __init__(
        self,
        codec: Codec | None = None,
        config: DeciderConfig = DEFAULT_CONFIG,
        partitions: int | None = None,
        *,
        max_state_bytes: int = DEFAULT_MAX_STATE_BYTES,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    ) -> None:
        self.codec = codec or Codec()
        self.config = config
        #: when set, a command whose key hashes (murmur2) elsewhere is forwarded there
        self.partitions = partitions
        self.max_state_bytes = max_state_bytes
        self.max_event_bytes = max_event_bytes
        # the decider's bounds keep every state under the topic's limit unless configured
        # beyond it: then (only) each decided state is measured
        held = max(config.max_held_bytes, config.max_payload_bytes)  # a starting prompt too
        self._measure_states = _JSON_INFLATION * held + _STATE_OVERHEAD > max_state_bytes

    def __call__(
        self,
        key: bytes | None,
        value: bytes | None,
        partition: int,
        at: int,
        state_of: Callable[[str], SessionState | None],
        dedup_of: DedupLookup,
        *,
        forwarded: bool = False,
        via: CommandClass | None = None,
    ) -> StepOutcome:
        """Decide the record at `partition` appended at `at`. `via`: the class of commands
        its topic carries (the decider rejects others `not_allowed_here`)."""
        if value is None:
            return StepOutcome(
                dead_letter=Undecidable("malformed", "record has no value (tombstone)")
            )
        try:
            command = self.codec.decode_command(value)
        except DecodeError as e:
            return StepOutcome(dead_letter=Undecidable(e.reason, str(e)))
        session_key = command.session_id.encode()
        if key != session_key:
            return StepOutcome(
                command=command,
                dead_letter=Undecidable(
                    "key_mismatch",
                    f"record key {key!r} is not the command's sessionId {command.session_id!r}",
                ),
            )
        if self.partitions is not None:
            expected = partition_for(session_key, self.partitions)
            if expected != partition:
                if not forwarded:
                    return StepOutcome(command=command, forward_to=expected)
                return StepOutcome(
                    command=command,
                    dead_letter=Undecidable(
                        "wrong_partition",
                        f"session {command.session_id!r} belongs on partition {expected}, "
                        f"found on {partition} after being forwarded: do the processors "
                        "agree on the partition count?",
                    ),
                )
        return self.decide(command, at, state_of(command.session_id), dedup_of, via)

    def decide(
        self,
        command: Command,
        at: int,
        state: SessionState | None,
        dedup_of: DedupLookup,
        via: CommandClass | None = None,
    ) -> StepOutcome:
        """Decide a decoded, well-placed command."""
        id_hash = command_hash(command.command_id, command.tenant_id)
        seen = dedup_of(command.session_id, id_hash)
        d = decide(state, command, self.config, at=at, seen=seen, via=via)
        if not d.events:
            return StepOutcome(
                command=command, state=d.state, first_decided_at=seen[1] if seen else None
            )
        records = [(e.key.encode(), self.codec.encode_event(e)) for e in d.events]
        too_big = self._too_big(d.state, records)
        if too_big is not None:
            return StepOutcome(command=command, dead_letter=too_big)
        remember = (
            DedupRecord(command.session_id, id_hash, d.remember, d.state.clock)
            if d.remember is not None
            else None
        )
        return StepOutcome(
            command=command, events=d.events, records=records, state=d.state, remember=remember
        )

    def _too_big(
        self, state: SessionState, records: list[tuple[bytes, bytes]]
    ) -> Undecidable | None:
        """The decider bounds what a state holds; this is the backstop that keeps a record
        the topics would refuse from wedging the partition's transactions."""
        for k, v in records:
            if len(k) + len(v) > self.max_event_bytes:
                return Undecidable(
                    "event_too_large",
                    f"an event of {len(k) + len(v)} bytes > {self.max_event_bytes}",
                )
        if self._measure_states:
            size = len(encode_state(state))
            if size > self.max_state_bytes:
                return Undecidable(
                    "state_too_large",
                    f"the session's state would be {size} bytes > {self.max_state_bytes}",
                )
        return None
