"""Outcomes: one record per command the processor reads, on `session.outcomes`.

Every command record gets exactly one, written in the same Kafka transaction as the events
it caused (so a `read_committed` reader sees both or neither):

- ``accepted``: the command was applied; ``runId`` (the run it started or acted on; none
  for a queued task or a session-log event) and the offsets of its events;
- ``rejected``: a ``command.rejected`` event; ``reason``, ``runId`` (the run it named) and
  the event's offset;
- ``duplicate``: an exact re-send of a command already decided; ``firstDecidedAt`` says
  when the first was (its outcome is the earlier record under this key);
- ``dead_letter``: the record went to the dead-letter topic; ``reason`` and ``detail``;
- ``forwarded``: it sat on a partition its key does not hash to and was moved there
  (``forwardedTo``); the decision's own outcome follows on that partition.

The record is keyed ``{sessionId}/{commandId}`` (unique, as the events' keys are: the
topic's compaction only drops re-emitted copies) and sits on the partition number the
command was read from, which is the session's murmur2 partition. A record from which no
command id could be read (undecodable bytes) is keyed ``{record key}/@{partition}:{offset}``
and has no ``commandId``: its producer finds it by ``sourcePartition`` / ``sourceOffset``,
which its delivery report gave it.

Every record also says, in its ``sessionstream.dedup`` header, what the session remembers of
its command id once it was decided: the processor's dedup store is restored from this topic
(docs/protocol.md, duplicates). A later record under the same key (a duplicate, a refused
reuse, another tenant's command) carries the record the session had, so compaction, which
keeps the last, loses nothing.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sessionstream.schemas._base import WireModel

__all__ = ["OUTCOME_STATUSES", "CommandOutcome", "OutcomeStatus", "outcome_key"]

OutcomeStatus = Literal["accepted", "rejected", "duplicate", "dead_letter", "forwarded"]
OUTCOME_STATUSES: tuple[OutcomeStatus, ...] = (
    "accepted",
    "rejected",
    "duplicate",
    "dead_letter",
    "forwarded",
)


class CommandOutcome(WireModel):
    """What became of one command record (the wire contract of `session.outcomes`)."""

    #: None: no command id could be read from the record (a dead letter)
    command_id: str | None = None
    #: the command's session; for a record that could not be read, its Kafka key (text)
    session_id: str
    tenant_id: str | None = None
    command_type: str | None = None
    status: OutcomeStatus
    #: accepted: the run it started or acted on; rejected: the run it named, if any
    run_id: str | None = None
    #: rejected: the rejection reason; dead_letter: the dead-letter reason
    reason: str | None = None
    detail: str | None = None
    #: the events it caused (accepted, rejected) and where they are in `session.events`
    event_count: int = 0
    first_event_offset: int | None = None
    last_event_offset: int | None = None
    #: duplicate: when the command id was first decided (the decider's clock, ms)
    first_decided_at: int | None = None
    #: forwarded: the partition the record was moved to
    forwarded_to: int | None = None
    #: where the command record was read
    source_topic: str
    source_partition: int = Field(ge=0)
    source_offset: int = Field(ge=0)
    #: the command's own `ts` (a producer tells two sends of one id apart by it)
    producer_ts: int | None = None
    #: when it was decided: the decider's clock (the command record's append time)
    ts: int

    @property
    def key(self) -> str:
        return outcome_key(
            self.session_id, self.command_id, self.source_partition, self.source_offset
        )


def outcome_key(
    session_id: str, command_id: str | None, source_partition: int, source_offset: int
) -> str:
    """The outcome record's Kafka key."""
    if command_id is not None:
        return f"{session_id}/{command_id}"
    return f"{session_id}/@{source_partition}:{source_offset}"
