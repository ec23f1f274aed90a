"""One poll batch decided: the records its transaction will hold, before any of them is sent.

`decide_batch` runs the step over a batch's records in partition order. It reads each
session's state and dedup records through a `View`: what this batch decided so far, then
what the transaction still in flight decided (`base`, not committed yet: the processor
decides the next batch while the previous one commits), then the partition's store. Nothing
here talks to Kafka; `produce` then hands the decided records to the transactional
producer, and `Batch.first` says where to rewind to if the transaction fails.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from sessionstream.adapters.kafka import Message, TransactionalProducer, dead_letter_headers
from sessionstream.core.open_runs import open_run, opening_key
from sessionstream.core.state import SessionState, command_hash
from sessionstream.core.step import (
    FORGET,
    FORWARDED_HEADER,
    CommandStep,
    DedupRecord,
    StepOutcome,
    encode_state,
)
from sessionstream.core.step import remembered as remembered_text
from sessionstream.runtimes.processor.cloudevents import (
    CloudEventHeaders,
)
from sessionstream.runtimes.processor.partition import PartitionState
from sessionstream.runtimes.processor.records import coords, log_time
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.commands import Command, CommandClass
from sessionstream.schemas.events import SESSION_LOG, CommandRejected, Event
from sessionstream.schemas.outcomes import OUTCOME_STATUSES, CommandOutcome, outcome_key
from sessionstream.settings import Settings

__all__ = [
    "DEDUP_HEADER",
    "Batch",
    "View",
    "decide_batch",
    "input_classes",
    "outcome_records",
    "produce",
    "produce_misfits",
]

log = logging.getLogger("sessionstream.processor")

#: (topic, partition)
TP = tuple[str, int]


@dataclass
class Batch:
    """A decided batch: everything its transaction holds, and what the commit leaves to do."""

    messages: list[Message]
    timers: list[tuple[int, Command]]
    outcomes: list[StepOutcome] = field(default_factory=list)
    #: what each outcome record says its command id is remembered as (`DEDUP_HEADER`)
    carried: list[str | None] = field(default_factory=list)
    #: the command record each outcome is of (revoked partitions' records have none)
    sources: list[Message] = field(default_factory=list)
    #: (partition, key, value, the event) of every event, in decision order (its
    #: CloudEvents headers are made when produced)
    events: list[tuple[int, bytes, bytes, Event]] = field(default_factory=list)
    #: the latest state of every session the batch changed
    staged: dict[tuple[int, str], SessionState] = field(default_factory=dict)
    #: the command ids to remember
    remembered: dict[tuple[int, str, int], DedupRecord] = field(default_factory=dict)
    #: sessions whose open-runs record changes: (partition, session) -> record or tombstone
    open_runs: dict[tuple[int, str], bytes | None] = field(default_factory=dict)
    dead_letters: list[tuple[Message, StepOutcome]] = field(default_factory=list)
    #: per partition, the offsets of its first and last event in `session.events`, from
    #: their delivery reports: for the outcome records
    event_spans: dict[int, list[int]] = field(default_factory=dict)
    forwards: list[tuple[Message, int]] = field(default_factory=list)
    #: next offset to commit, and the first offset consumed, per input partition
    offsets: dict[TP, int] = field(default_factory=dict)
    first: dict[TP, int] = field(default_factory=dict)
    #: (partition, state, record) of every staged state, filled in by `produce`
    records: dict[int, list[tuple[SessionState, bytes]]] = field(default_factory=dict)
    #: the command ids to remember by partition, filled in by `produce`
    dedup: dict[int, list[DedupRecord]] = field(default_factory=dict)
    #: erased sessions: the ids they remembered before, which the store forgets
    forgotten: dict[tuple[int, str], set[int]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.messages or self.timers)

    def forgotten_by_partition(self) -> dict[int, list[tuple[str, int]]]:
        """(session, id hash) of the dedup records erasures forgot, by partition (an id
        remembered again after the erasure keeps its new record)."""
        out: dict[int, list[tuple[str, int]]] = {}
        for (p, sid), hashes in self.forgotten.items():
            out.setdefault(p, []).extend(
                (sid, h) for h in sorted(hashes) if (p, sid, h) not in self.remembered
            )
        return out

    def absorb(self, later: Batch) -> None:
        """Take in `later`, decided on top of this batch (its `base`), so that one
        transaction holds both: the later decisions win, the first offsets stay ours."""
        self.messages += later.messages
        self.timers += later.timers
        self.outcomes += later.outcomes
        self.carried += later.carried
        self.sources += later.sources
        self.events += later.events
        self.staged.update(later.staged)
        self.remembered.update(later.remembered)
        for (p, sid), hashes in later.forgotten.items():
            # an erasure in `later` forgets what this batch remembered before it
            for h in hashes:
                if (p, sid, h) not in later.remembered:
                    self.remembered.pop((p, sid, h), None)
            self.forgotten.setdefault((p, sid), set()).update(hashes)
        # `later` has a record where a session's opening changed against this batch's
        # state: it is the newer one; where it has none, ours still holds
        self.open_runs.update(later.open_runs)
        self.dead_letters += later.dead_letters
        self.forwards += later.forwards
        self.offsets.update(later.offsets)
        for tp, o in later.first.items():
            self.first.setdefault(tp, o)


class View:
    """One partition's sessions as a batch sees them: its own decisions, those of the
    transactions it was decided on top of (`bases`, newest first: in flight, or decided
    and not yet begun), then the store."""

    __slots__ = ("bases", "batch", "p", "part")

    def __init__(
        self, p: int, part: PartitionState, batch: Batch, bases: tuple[Batch, ...]
    ) -> None:
        self.p, self.part, self.batch, self.bases = p, part, batch, bases

    def state(self, sid: str) -> SessionState | None:
        key = (self.p, sid)
        s = self.batch.staged.get(key)
        if s is not None:
            return s
        return self.before(sid)

    def before(self, sid: str) -> SessionState | None:
        """The state before this batch (what its open-runs record says now)."""
        key = (self.p, sid)
        for base in self.bases:
            s = base.staged.get(key)
            if s is not None:
                return s
        return self.part.state(sid)

    def seen(self, sid: str, h: int) -> tuple[int, int] | None:
        key = (self.p, sid, h)
        r = self.batch.remembered.get(key)
        if r is None:
            # an erasure forgets every id its session remembered before it
            if (self.p, sid) in self.batch.forgotten:
                return None
            for base in self.bases:
                r = base.remembered.get(key)
                if r is not None:
                    break
                if (self.p, sid) in base.forgotten:
                    return None
        return (r.digest, r.at) if r is not None else self.part.seen(sid, h)

    def forget(self, sid: str) -> None:
        """`sid` was erased by the latest decision: every id it remembered is forgotten
        (the store deletes them at the commit; the erasure's outcome record says `forget`)."""
        p, remembered = self.p, self.batch.remembered
        hashes = {h for (q, s, h) in remembered if q == p and s == sid}
        for h in hashes:
            del remembered[(p, sid, h)]
        for base in self.bases:
            hashes.update(h for (q, s, h) in base.remembered if q == p and s == sid)
        hashes.update(self.part.remembered_ids(sid))
        self.batch.forgotten.setdefault((p, sid), set()).update(hashes)


def _bases(base: Batch | tuple[Batch, ...] | None) -> tuple[Batch, ...]:
    if base is None:
        return ()
    return base if isinstance(base, tuple) else (base,)


def input_classes(s: Settings) -> dict[str, CommandClass]:
    """Each input topic's command class: who may write what there."""
    return {
        s.commands_topic: "producer",
        s.worker_commands_topic: "worker",
        s.timers_topic: "timer",
    }


def decide_batch(
    step: CommandStep,
    messages: list[Message],
    timers: list[tuple[int, Command]],
    partitions: dict[int, PartitionState],
    base: Batch | tuple[Batch, ...] | None,
    classes: dict[str, CommandClass],
) -> Batch:
    """Decide `messages` (in order) on top of `base`: the batch still committing, or
    several whose decisions the stores do not have yet, newest first. `classes`: the
    command class of each input topic (`input_classes`)."""
    batch = Batch(messages, timers)
    bases = _bases(base)
    views: dict[int, View] = {}
    outcomes, events, staged = batch.outcomes, batch.events, batch.staged
    remembered, offsets, first = batch.remembered, batch.offsets, batch.first
    carried = batch.carried
    for msg in messages:
        topic, p, offset = msg.topic(), msg.partition(), msg.offset()
        assert topic is not None and p is not None and offset is not None
        view = views.get(p)
        if view is None:
            part = partitions.get(p)
            if part is None:
                continue  # revoked mid-batch: the new owner reads it again
            view = views[p] = View(p, part, batch, bases)
        tp = (topic, p)
        if tp not in first:
            first[tp] = offset
        offsets[tp] = offset + 1
        headers = msg.headers()
        outcome = step(
            msg.key(),
            msg.value(),
            p,
            log_time(msg),
            view.state,
            view.seen,
            forwarded=headers is not None and any(h[0] == FORWARDED_HEADER for h in headers),
            via=classes[topic],
        )
        outcomes.append(outcome)
        batch.sources.append(msg)
        erased = bool(outcome.events) and outcome.events[-1].type == "session.erased"
        if outcome.records:
            for (key, value), event in zip(outcome.records, outcome.events, strict=True):
                events.append((p, key, value, event))
            state = outcome.state
            if state is not None:
                staged[(p, state.session_id)] = state
        if erased:
            view.forget(outcome.events[-1].session_id)
        r = outcome.remember
        if r is not None:
            remembered[(p, r.session_id, r.id_hash)] = r
            carried.append(remembered_text(r))
        elif erased:
            carried.append(FORGET)
        elif outcome.forward_to is not None:
            carried.append(None)  # decided, and remembered, on its own partition
        else:
            carried.append(_still_remembered(view, outcome, msg, step))
        if outcome.dead_letter is not None:
            batch.dead_letters.append((msg, outcome))
        elif outcome.forward_to is not None:
            batch.forwards.append((msg, outcome.forward_to))
    for (p, sid), state in staged.items():
        now = opening_key(state)
        if opening_key(views[p].before(sid)) != now:
            o = open_run(state)
            batch.open_runs[(p, sid)] = (
                None if o is None else o.model_dump_json(by_alias=True).encode()
            )
    return batch


def _still_remembered(
    view: View, outcome: StepOutcome, msg: Message, step: CommandStep
) -> str | None:
    """What the session remembers of the command id of a record that remembered nothing
    new (a duplicate, a refused reuse, another tenant's or a misplaced command, a dead
    letter): its outcome record carries it, since compaction keeps only the last record
    under an outcome key and the dedup store is restored from them."""
    c = outcome.command
    tenant: str | None = None
    if c is not None:
        sid, cid, tenant = c.session_id, c.command_id, c.tenant_id
    else:
        peeked, peeked_id = step.codec.peek_ids(msg.value() or b"")
        if peeked is None or peeked_id is None:
            return None
        sid, cid = peeked, peeked_id
    state = view.state(sid)
    # the session's owner: another tenant's commands never take an id from it
    owner = state.tenant_id if state is not None and state.tenant_id is not None else tenant
    if owner is None:
        return None
    h = command_hash(cid, owner)
    seen = view.seen(sid, h)
    return None if seen is None else remembered_text(DedupRecord(sid, h, *seen))


def produce(
    producer: TransactionalProducer,
    s: Settings,
    codec: Codec,
    batch: Batch,
    on_delivery: Callable[[Any, Message], None],
    cloudevents: CloudEventHeaders | None = None,
) -> None:
    """Hand every record of `batch` to the producer (a transaction is open). The changelog
    records whose offsets the store's checkpoint needs report their delivery: the last one
    per partition is enough (a partition's records are appended in order)."""
    put = producer.produce
    events_topic = s.events_topic
    ce = cloudevents or CloudEventHeaders(
        events_topic, s.schema_registry_url, codec.schema_ids()["event"]
    )
    headers_of = ce.of
    # the outcome records name their events' offsets: one transaction's records of a
    # partition are appended in order, one after the other, so the first and the last
    # delivery report of each partition give them all (checked: `event_span`)
    counts: dict[int, int] = {}
    for p, *_ in batch.events:
        counts[p] = counts.get(p, 0) + 1
    spans = batch.event_spans = {p: [-1, -1] for p in counts}
    seen: dict[int, int] = {}
    for p, key, value, event in batch.events:
        i = seen[p] = seen.get(p, -1) + 1
        last = counts[p] - 1
        if i == 0 or i == last:
            put(
                events_topic,
                key=key,
                value=value,
                partition=p,
                headers=headers_of(event, key),
                on_delivery=_span_report(spans[p], i == 0, i == last),
            )
        else:
            put(events_topic, key=key, value=value, partition=p, headers=headers_of(event, key))
    # states: grouped by partition, the last one of each reports
    by_p: dict[int, list[tuple[str, SessionState]]] = {}
    for (p, sid), state in batch.staged.items():
        by_p.setdefault(p, []).append((sid, state))
    state_topic = s.state_topic
    for p, rows in by_p.items():
        out = batch.records[p] = []
        last = len(rows) - 1
        for i, (sid, state) in enumerate(rows):
            value = encode_state(state)
            out.append((state, value))
            key = sid.encode()
            if i == last:
                put(state_topic, key=key, value=value, partition=p, on_delivery=on_delivery)
            else:
                put(state_topic, key=key, value=value, partition=p)
    for (p, sid), record in batch.open_runs.items():
        put(s.open_runs_topic, key=sid.encode(), value=record, partition=p)
    # the command ids to remember go to the store at the commit; the outcome records
    # carry them (`Batch.carried`): no topic of their own
    dedup_by_p = batch.dedup = {}
    for (p, _sid, _h), r in batch.remembered.items():
        dedup_by_p.setdefault(p, []).append(r)
    # timers become commands on the session's own partition of the processor's topic
    for p, cmd in batch.timers:
        put(
            s.timers_topic,
            key=cmd.session_id.encode(),
            value=codec.encode_command(cmd),
            partition=p,
        )


def produce_misfits(producer: TransactionalProducer, s: Settings, batch: Batch) -> None:
    """The batch's records that were not decided here: the dead letters (to the dead-letter
    topic, with headers that say why and where each was) and the commands produced without
    the murmur2 partitioner, which sit where their session's processor never looks (to the
    partition their key hashes to, in this transaction, decided there in their turn)."""
    for msg, outcome in batch.dead_letters:
        assert outcome.dead_letter is not None
        d = outcome.dead_letter
        topic, partition, offset = coords(msg)
        headers = dead_letter_headers(msg.headers(), topic, partition, offset, d.reason, d.error)
        producer.produce(s.dlq_topic, key=msg.key(), value=msg.value(), headers=headers)
        log.warning("dead letter %s/%s@%s: %s", topic, partition, offset, d.error)
    for msg, partition in batch.forwards:
        topic, source, offset = coords(msg)
        producer.produce(
            topic,
            key=msg.key(),
            value=msg.value(),
            partition=partition,
            headers=[
                *(msg.headers() or []),
                (FORWARDED_HEADER, f"{topic}/{source}/{offset}".encode()),
            ],
        )


def _span_report(span: list[int], first: bool, last: bool) -> Callable[[Any, Message], None]:
    def report(err: Any, msg: Message) -> None:
        offset = -1 if err is not None else (msg.offset() or 0)
        if first:
            span[0] = offset
        if last:
            span[1] = offset

    return report


def event_offsets(batch: Batch, partition: int, count: int) -> list[int] | None:
    """The offsets of the batch's `count` events of `partition` in produce order, or None
    when they are not one run of offsets (a record of another writer between them: the
    outcome records then say none rather than guess)."""
    first, last = batch.event_spans.get(partition, (-1, -1))
    if first < 0 or last - first + 1 != count:
        return None
    return list(range(first, last + 1))


def outcome_records(
    batch: Batch,
    codec: Codec,
    key_of_dead: Callable[[Message], tuple[str | None, str | None]],
    source: bytes = b"/sessionstream",
) -> list[tuple[int, bytes, bytes, list[tuple[str, str | bytes | None]]]]:
    """(partition, key, value, headers) of the outcome record of every command the batch
    read, once its events' offsets are known (`batch.event_spans`, from their delivery
    reports). The headers name it without Avro (`outcome_headers`)."""
    out = []
    taken: dict[int, int] = {}
    placed: dict[int, list[int] | None] = {}
    for o, msg, carried in zip(batch.outcomes, batch.sources, batch.carried, strict=True):
        topic, p, offset = msg.topic() or "", msg.partition() or 0, msg.offset() or 0
        n = len(o.records)
        first = last = None
        if n:
            if p not in placed:
                total = sum(1 for e in batch.events if e[0] == p)
                placed[p] = event_offsets(batch, p, total)
            k = taken.get(p, 0)
            taken[p] = k + n
            offs = placed[p]
            if offs is not None:
                first, last = offs[k], offs[k + n - 1]
        c = o.command
        command_id: str | None
        if c is not None:
            session_id, command_id = c.session_id, c.command_id
        else:
            peeked, command_id = key_of_dead(msg)
            session_id = peeked or (msg.key() or b"").decode(errors="replace")
        row = _OutcomeRow(
            command_id,
            session_id,
            c.tenant_id if c is not None else None,
            c.type if c is not None else None,
            topic,
            p,
            offset,
            c.ts if c is not None else None,
            log_time(msg),
            n,
            first,
            last,
        )
        if o.dead_letter is not None:
            row.status, row.reason = "dead_letter", o.dead_letter.reason
            row.detail = o.dead_letter.error[:1000]
        elif o.forward_to is not None:
            row.status, row.forwarded_to = "forwarded", o.forward_to
        elif o.events:
            rejected = next((e for e in o.events if e.type == "command.rejected"), None)
            if rejected is not None:
                r = rejected.payload_as(CommandRejected)
                row.status, row.reason, row.run_id = "rejected", r.reason, r.target_run_id
            else:
                row.status = "accepted"
                row.run_id = next((e.run_id for e in o.events if e.run_id != SESSION_LOG), None)
        else:
            row.status, row.first_decided_at = "duplicate", o.first_decided_at
        key = outcome_key(session_id, command_id, p, offset).encode()
        value = codec.encode_outcome(row)  # type: ignore[arg-type]
        out.append((p, key, value, outcome_headers(row, key, source, carried)))
    return out


class _OutcomeRow:
    """A `CommandOutcome`'s fields for the compiled writer, without building the model (a
    pydantic construct cost 8 µs a command on the commit thread)."""

    __slots__ = tuple(CommandOutcome.model_fields)

    def __init__(
        self,
        command_id: str | None,
        session_id: str,
        tenant_id: str | None,
        command_type: str | None,
        source_topic: str,
        source_partition: int,
        source_offset: int,
        producer_ts: int | None,
        ts: int,
        event_count: int,
        first_event_offset: int | None,
        last_event_offset: int | None,
    ) -> None:
        self.command_id, self.session_id = command_id, session_id
        self.tenant_id, self.command_type = tenant_id, command_type
        self.source_topic, self.source_partition = source_topic, source_partition
        self.source_offset, self.producer_ts, self.ts = source_offset, producer_ts, ts
        self.event_count = event_count
        self.first_event_offset, self.last_event_offset = first_event_offset, last_event_offset
        self.status = "accepted"
        self.run_id: str | None = None
        self.reason: str | None = None
        self.detail: str | None = None
        self.first_decided_at: int | None = None
        self.forwarded_to: int | None = None


def outcome_headers(
    o: Any, key: bytes, source: bytes, carried: str | None = None
) -> list[tuple[str, str | bytes | None]]:
    """CloudEvents headers of an outcome record (binary mode), so a shell, a router or a
    producer in any language learns the status without decoding the value; and what its
    command id is remembered as (`carried`: `DEDUP_HEADER`), for the processor's restore."""
    headers: list[tuple[str, str | bytes | None]] = [
        ("ce_specversion", b"1.0"),
        ("ce_id", key),
        ("ce_source", source),
        ("ce_type", _OUTCOME_TYPES[o.status]),
        ("ce_subject", o.session_id.encode()),
    ]
    # what a shell reads without Avro; the rest is in the value (each header costs a
    # third of a microsecond a record)
    if o.run_id is not None:
        headers.append(("ce_runid", o.run_id.encode()))
    if o.reason is not None:
        headers.append(("ce_reason", o.reason.encode()))
    if carried is not None:
        headers.append((DEDUP_HEADER, carried.encode()))
    return headers


#: the outcome record's header that says what its command id is remembered as once decided:
#: `{id hash}:{content digest}:{decided at}` or `forget` (`sessionstream.core.step`); the
#: processor's dedup store is restored from these (`restore.py`), read without the value
DEDUP_HEADER: Final = "sessionstream.dedup"

_OUTCOME_TYPES: Final = {s: f"sessionstream.outcome.{s}".encode() for s in OUTCOME_STATUSES}
