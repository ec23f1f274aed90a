"""Which outcome is a command's: how `SessionClient` matches what the processor wrote to
the commands it sent.

The processor writes one outcome record per command it reads, on `session.outcomes`, in the
transaction of the command's events. A record is a tracked command's when it carries the
command's session, command id and `ts` (as `producerTs`) and sits at or after where the
session's partition ended before the command was sent: another send under the same id is
never taken for it. A dead letter of a record no command id could be read from is matched
by where that record was, which its producer knows from the delivery report. An accepted or
rejected command is answered once all of its events are read.

No Kafka here: the client's tail decodes what it reads off the outcomes and events
partitions and hands it to `OutcomeMatcher`, then asks `OutcomeMatcher.outcome` for a
command's answer.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from sessionstream.errors import IncompatibleEvent
from sessionstream.schemas.commands import Command
from sessionstream.schemas.errors import DecodeError
from sessionstream.schemas.events import SESSION_LOG, CommandRejected, Event
from sessionstream.schemas.outcomes import CommandOutcome

__all__ = [
    "CommandHandle",
    "Outcome",
    "OutcomeMatcher",
    "acknowledged",
    "command_key",
    "outcome_of",
]

# the client's own warnings, whichever of its modules words them
log = logging.getLogger("sessionstream.client")

#: outcomes of unreadable records kept for their producers to find, at most
_BY_SOURCE_MAX: Final = 10_000


@dataclass
class CommandHandle:
    """A command on its way; `acked` once the broker acknowledged it, with its
    `partition` and `offset` (of `topic`, which its class decides).

    The broker may acknowledge without an offset: an idempotent producer's retry of a
    record the leader already had (after a leader change) is reported delivered with
    none. `offset` then stays None until `wait` needs it and reads the partition's high
    watermark: the record is below it (acks=all), so `offset` is an upper bound there
    and `offset_exact` is False."""

    command: Command
    #: where the session's events and outcomes partitions ended before it was sent
    events_from: dict[int, int] | None = None
    outcomes_from: dict[int, int] | None = None
    partition: int | None = None
    offset: int | None = None
    error: str | None = None
    topic: str = ""
    acked: bool = False
    #: the bytes sent, kept only when the broker gave no offset
    sent: bytes | None = None

    @property
    def offset_exact(self) -> bool:
        """False when the broker gave no offset."""
        return self.sent is None


def acknowledged(handle: CommandHandle, partition: int, offset: int | None, value: bytes) -> None:
    """Record the broker's acknowledgement of `handle` (its delivery report)."""
    handle.partition, handle.offset = partition, offset
    if offset is None:
        handle.sent = value
    handle.acked = True


def command_key(handle: CommandHandle) -> tuple[str, str]:
    """What a tracked command is known by: command ids are per session, and a gateway's
    callers choose their own."""
    return (handle.command.session_id, handle.command.command_id)


@dataclass(frozen=True)
class Outcome:
    """The one visible outcome of a command."""

    status: Literal["accepted", "rejected", "duplicate", "dead_letter"]
    command_id: str
    run_id: str | None = None
    reason: str | None = None
    events: list[Event] = field(default_factory=list)


def outcome_of(command_id: str, events: list[Event]) -> Outcome:
    """The outcome that a command's events (all of them, in log order) make."""
    for e in events:
        if e.type == "command.rejected":
            r = e.payload_as(CommandRejected)
            return Outcome(
                "rejected", command_id, run_id=r.target_run_id, reason=r.reason, events=events
            )
    run_id = next((e.run_id for e in events if e.run_id != SESSION_LOG), None)
    return Outcome("accepted", command_id, run_id=run_id, events=events)


class OutcomeMatcher:
    """The outcome records and events read for the commands a client tracks, and the
    outcome they make of each."""

    def __init__(self, outcomes_topic: str) -> None:
        self._outcomes_topic = outcomes_topic
        #: each tracked command's events read so far
        self._pending: dict[tuple[str, str], list[Event]] = {}
        #: the outcome records read for each tracked command's session and id (one, but for
        #: the dead letters of other records that carry the same command)
        self._outcomes: dict[tuple[str, str], list[CommandOutcome]] = {}
        #: where each tracked command's outcome and events may start, and its `ts`
        self._pending_from: dict[tuple[str, str], tuple[int, int, int]] = {}
        #: tracked commands whose session has a record this version cannot read, past
        #: where their outcome may start: why their outcome cannot be known
        self._unreadable: dict[tuple[str, str], str] = {}
        #: outcomes of records no command id could be read from (dead letters), by where
        #: the record was: its producer knows that from its delivery report
        self._by_source: OrderedDict[tuple[str, int, int], CommandOutcome] = OrderedDict()

    def track(self, handle: CommandHandle) -> None:
        """Look for `handle`'s outcome and events from where its partitions ended."""
        assert handle.events_from is not None and handle.outcomes_from is not None
        key = command_key(handle)
        self._pending[key] = []
        self._pending_from[key] = (
            min(handle.outcomes_from.values()),
            min(handle.events_from.values()),
            handle.command.ts,
        )

    def tracks(self, handle: CommandHandle) -> bool:
        return command_key(handle) in self._pending

    def release(self, handle: CommandHandle) -> None:
        """Stop looking for `handle`'s outcome."""
        key = command_key(handle)
        self._pending.pop(key, None)
        self._pending_from.pop(key, None)
        self._outcomes.pop(key, None)
        self._unreadable.pop(key, None)

    def clear(self) -> None:
        self._pending.clear()
        self._pending_from.clear()
        self._outcomes.clear()

    def outcome_read(self, outcome: CommandOutcome, offset: int) -> None:
        """Keep `outcome` (read at `offset` of its partition) if it may be a tracked
        command's."""
        if outcome.command_id is None:
            src = (outcome.source_topic, outcome.source_partition, outcome.source_offset)
            self._by_source[src] = outcome
            while len(self._by_source) > _BY_SOURCE_MAX:
                self._by_source.popitem(last=False)
            return
        key = (outcome.session_id, outcome.command_id)
        if key in self._pending and outcome.status != "forwarded":
            # (a forwarded record's decision follows on its session's partition)
            start, _, ts = self._pending_from[key]
            if offset >= start and outcome.producer_ts in (ts, None):
                self._outcomes.setdefault(key, []).append(outcome)

    def event_read(self, event: Event, offset: int) -> None:
        """Keep `event` (read at `offset` of its partition) if it is a tracked command's."""
        key = (event.session_id, event.command_id)
        bucket = self._pending.get(key)
        if bucket is not None:
            _, start, ts = self._pending_from[key]
            if offset >= start and event.producer_ts in (ts, None):
                bucket.append(event)

    def cannot_read(self, msg: Any, error: DecodeError) -> None:
        """A record this version cannot read (a newer sessionstream wrote it, or bytes
        that are none of ours) is skipped, and the tail goes on. The tracked commands of
        its session (its key's first part) whose outcome may start at or before it can no
        longer be known: `wait` and `collect` raise `IncompatibleEvent` for those only."""
        offset = msg.offset() or 0
        where = f"{msg.topic()}[{msg.partition()}]@{offset}"
        outcomes = msg.topic() == self._outcomes_topic
        reason = (
            f"a record at {where} this version cannot read ({error.reason}): upgrade sessionstream"
        )
        session = (msg.key() or b"").split(b"/", 1)[0].decode(errors="replace")
        hit = [
            key
            for key, (out_start, ev_start, _) in self._pending_from.items()
            if key[0] == session and offset >= (out_start if outcomes else ev_start)
        ]
        for key in hit:
            self._unreadable[key] = reason
        log.warning("%s; skipped (%d tracked commands of its session affected)", reason, len(hit))

    def outcome(
        self, handle: CommandHandle, events_position: Callable[[int], int]
    ) -> Outcome | None:
        """The outcome of `handle` if it has been read (with all its events), else None.
        `events_position(p)`: where the tail stands in partition `p` of the events topic."""
        key = command_key(handle)
        unreadable = self._unreadable.get(key)
        if unreadable is not None:
            raise IncompatibleEvent(unreadable)
        o = self._record_of(handle)
        if o is None:
            return None
        cid = handle.command.command_id
        if o.status == "duplicate":
            return Outcome("duplicate", cid)
        if o.status == "dead_letter":
            return Outcome("dead_letter", cid, reason=o.reason)
        mine = self._pending.get(key, [])
        if len(mine) < o.event_count:
            # its events are in the outcome's transaction: read on until they are all in
            # (or the tail is past the last of them: one was not this version's to read)
            last = o.last_event_offset
            if last is None or events_position(o.source_partition) <= last:
                return None
        status: Literal["accepted", "rejected"] = (
            "rejected" if o.status == "rejected" else "accepted"
        )
        return Outcome(status, cid, run_id=o.run_id, reason=o.reason, events=list(mine))

    def _record_of(self, handle: CommandHandle) -> CommandOutcome | None:
        """The outcome record of `handle`'s record: the one written for that very record
        when its place is known; else a decision (accepted, rejected, duplicate) of the
        command id, which is the session's whichever record of it was read. A dead letter
        is only ever one record's (the same bytes under another key are another record,
        dead-lettered apart)."""
        if not handle.acked:
            # which record is ours is known from its delivery report: a dead letter of
            # another record with the same bytes must not be taken for it meanwhile
            return None
        where = (handle.topic, handle.partition, handle.offset)
        exact = handle.offset is not None and handle.offset_exact
        found = self._outcomes.get(command_key(handle), ())
        if exact:
            for o in found:
                if (o.source_topic, o.source_partition, o.source_offset) == where:
                    return o
            mine = self._by_source.pop(where, None)  # type: ignore[arg-type]
            if mine is not None:
                return mine
        for o in found:
            if o.status != "dead_letter" or not exact:
                return o
        return None
