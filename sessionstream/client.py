"""`SessionClient`: the producer side of the protocol, on confluent-kafka.

Commands are keyed by session id and placed with `murmur2_random` — the partitioner Java and
aiokafka use — so every producer puts a session on the same partition and the session has
one writer. The producer is idempotent (acks=all), so its own retries never duplicate.

Commands that act on a run (`steer`, `follow_up`, `abort`) name the run this client last
saw active in the session (from the outcomes and events it read), so a late abort can never
cancel the run that started after it: the processor refuses it `run_not_active`. Pass
`run_id=None` for the session-scoped meaning, or a run id of your own.

`wait()` returns a command's outcome: the events it caused (accepted, with its run id), its
`command.rejected` (with the reason), or `duplicate` — a command id the processor had
already applied, recognised because the processor's committed offset on the command's
partition moved past the command while no event of it appeared. A command's events are
those after where its events partition ended when it was sent that carry its session, its
command id and its `ts` (as `producerTs`), so another send under the same id is never
taken for it. An event this version cannot read is skipped (WARNING); the tracked commands
of its session that it may belong to raise `IncompatibleEvent` from `wait` / `collect`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from schemas.codec import Codec
from schemas.commands import (
    AbortPayload,
    Command,
    FollowUpPayload,
    PromptPayload,
    PromptPolicy,
    SendPayload,
    SteerPayload,
)
from schemas.errors import DecodeError
from schemas.events import SESSION_LOG, CommandRejected, Event
from schemas.sessions import scoped_session_id
from sessionstream.errors import (
    CommandTimeout,
    IncompatibleEvent,
    KafkaUnavailable,
    SessionstreamError,
)
from sessionstream.kafka import (
    DeadLetter,
    client_config,
    command_producer_config,
    produce,
    read_records,
    reader_config,
    take,
    unavailable,
)
from sessionstream.registry import attach_registry
from sessionstream.settings import Settings, get_settings
from sessionstream.topics import command_topic
from streams.partitioning import partition_for

__all__ = ["KNOWN_RUN", "CommandHandle", "Outcome", "SessionClient", "outcome_of"]

log = logging.getLogger("sessionstream.client")

#: events the outcome tail takes from librdkafka per call
_DRAIN_BATCH: Final = 500
#: sessions whose active run a client remembers (`known_run`), at most
_RUNS_MAX: Final = 100_000


class _KnownRun:
    """`run_id` default: the run this client last saw active in the session (none known:
    session-scoped)."""

    def __repr__(self) -> str:
        return "KNOWN_RUN"


KNOWN_RUN: Final = _KnownRun()


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
    events_from: dict[int, int] | None = None
    dlq_from: dict[int, int] | None = None
    partition: int | None = None
    offset: int | None = None
    error: str | None = None
    topic: str = ""
    acked: bool = False
    #: the bytes sent, kept only when the broker gave no offset (to find a dead letter)
    sent: bytes | None = None

    @property
    def offset_exact(self) -> bool:
        """False when the broker gave no offset (`offset` is then an upper bound)."""
        return self.sent is None


def acknowledged(handle: CommandHandle, partition: int, offset: int | None, value: bytes) -> None:
    """Record the broker's acknowledgement of `handle` (its delivery report)."""
    handle.partition, handle.offset = partition, offset
    if offset is None:
        handle.sent = value
    handle.acked = True


@dataclass(frozen=True)
class Outcome:
    """The one visible outcome of a command."""

    status: Literal["accepted", "rejected", "duplicate", "dead_letter"]
    command_id: str
    run_id: str | None = None
    reason: str | None = None
    events: list[Event] = field(default_factory=list)


class SessionClient:
    """Send commands to sessions and, when asked, wait for their outcomes."""

    def __init__(
        self,
        tenant_id: str,
        settings: Settings | None = None,
        *,
        codec: Codec | None = None,
        producer_overrides: dict[str, Any] | None = None,
        clock: Any = time.time,
        actor: str | None = None,
        fetch_wait_ms: int = 100,
    ) -> None:
        self.tenant_id = tenant_id
        #: recorded as who asked, on every command this client sends (unless overridden)
        self.actor = actor
        self.settings = settings or get_settings()
        self.codec = codec or Codec()
        #: attach the schema registry before the first command or event (not when the
        #: caller brought a codec of its own)
        self._registry_pending = codec is None
        self._clock = clock
        self._producer_conf = command_producer_config(self.settings, **(producer_overrides or {}))
        self._producer: Producer | None = None
        self._events: Consumer | None = None
        self._offsets: Consumer | None = None
        self._meta: Consumer | None = None
        self._tailing: dict[int, int] = {}
        # keyed by (session, command id): command ids are per session, and a gateway's
        # callers choose their own
        self._pending: dict[tuple[str, str], list[Event]] = {}
        #: where each tracked command's outcome may start, and the `ts` it was sent with
        self._pending_from: dict[tuple[str, str], tuple[int, int]] = {}
        self._waits: dict[tuple[str, str], _WaitState] = {}
        #: tracked commands whose session has an event this version cannot read, past
        #: where their outcome may start: why their outcome cannot be known
        self._unreadable: dict[tuple[str, str], str] = {}
        self._partitions: int | None = None
        #: the outcome tail's fetch.wait.max.ms (a server waiting on many commands: lower)
        self._fetch_wait_ms = fetch_wait_ms
        self._dlq_parts: list[int] | None = None
        self._dlq_cache: tuple[float, dict[int, int]] = (0.0, {})
        #: (input topic, partition) -> (read at, the processor's committed offset)
        self._positions: dict[tuple[str, int], tuple[float, int]] = {}
        self._admin: AdminClient | None = None
        #: session -> the run last seen active; only while it is (a finished run is
        #: forgotten), at most `_RUNS_MAX` sessions (the least recently started go first)
        self._runs: OrderedDict[str, str] = OrderedDict()
        #: `collect`'s rounds, and its last-stable-offset reads in flight: (the round that
        #: asked, partition -> future), answered while later rounds go on
        self._round_no = 0
        self._lso_asks: list[tuple[int, dict[int, Future[Any]]]] = []

    # -- producing --------------------------------------------------------------------------
    @property
    def producer(self) -> Producer:
        if self._producer is None:
            self._ensure_registry()
            self._producer = Producer(self._producer_conf)
        return self._producer

    def _ensure_registry(self) -> None:
        """This version's command schema id, once (registered when missing): commands go
        out in the Confluent framing, and events are read by id."""
        if self._registry_pending:
            attach_registry(
                self.codec,
                self.settings,
                writes=("command",),
                topics=(self.settings.commands_topic,),
            )
            self._registry_pending = False

    def prepare(self) -> None:
        """Connect now: the producer, the metadata reader and the partition count, so the
        first command does not wait for them (a server calls this at start)."""
        _ = self.producer
        self._partition_count()
        self._dlq_ends()

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    def command(self, session_id: str, type_: str, payload: Any, **fields: Any) -> Command:
        """Build a command stamped with this client's tenant, a fresh id and the time."""
        fields.setdefault("actor", self.actor)
        return Command(
            command_id=fields.pop("command_id", None) or str(uuid.uuid4()),
            session_id=session_id,
            tenant_id=fields.pop("tenant_id", None) or self.tenant_id,
            type=type_,
            ts=fields.pop("ts", None) or self.now_ms(),
            payload=payload,
            **fields,
        )

    def session_id(self, local_id: str) -> str:
        """The full id of this client's tenant's session `local_id` (``acme:s1``): the
        session the gateway shows that tenant as `local_id` (schemas.sessions)."""
        return scoped_session_id(self.tenant_id, local_id)

    def known_run(self, session_id: str) -> str | None:
        """The run this client last saw active in `session_id` (None: none, or unknown)."""
        return self._runs.get(session_id)

    def _target(self, session_id: str, run_id: str | _KnownRun | None) -> str | None:
        return self.known_run(session_id) if isinstance(run_id, _KnownRun) else run_id

    def _saw(self, event: Event) -> None:
        if event.type == "run.started":
            self._runs[event.session_id] = event.run_id
            self._runs.move_to_end(event.session_id)
            if len(self._runs) > _RUNS_MAX:
                self._runs.popitem(last=False)
        elif event.type == "run.finished" and self._runs.get(event.session_id) == event.run_id:
            del self._runs[event.session_id]

    def submit(self, command: Command, *, track: bool = True) -> CommandHandle:
        """Produce `command`. With `track`, remember where its outcome will appear."""
        if not track:
            return self._produce(CommandHandle(command))
        handle = CommandHandle(
            command,
            events_from=self._events_high_watermarks(command.session_id),
            dlq_from=self._dlq_ends(),
        )
        self._track(handle)
        return self._produce(handle)

    def submit_many(self, commands: list[Command]) -> list[CommandHandle]:
        """`submit(track=True)` for several commands at once. What a gateway sends in one
        round.

        Each command's outcome is looked for from a point of its events partition at or
        before where the partition ends when it is produced. For a partition the outcome
        tail already reads, that is the high watermark the tail's last fetch reported
        (librdkafka keeps it: no request, where a fresh read costs a round trip per
        round); for the others, and for the dead-letter topic, the ends are read once for
        all. Events before the true end that carry the same session and command id are
        still not taken for the outcome unless they also carry the command's `ts`: an
        earlier send of the same id is not this one (see `_track`)."""
        if not commands:
            return []
        n = self._partition_count()
        wanted = {partition_for(c.session_id.encode(), n) for c in commands}
        ends = {p: e for p in wanted if (e := self._fetched_end(p)) is not None}
        ends.update(self._hwms(wanted - ends.keys()))
        # an older end of the DLQ only makes a dead-letter lookup read a little more
        at, dlq = self._dlq_cache
        if time.monotonic() - at > 1.0:
            dlq = self._dlq_ends()
            self._dlq_cache = (time.monotonic(), dlq)
        handles = []
        for c in commands:
            p = partition_for(c.session_id.encode(), n)
            h = CommandHandle(c, events_from={p: ends[p]}, dlq_from=dict(dlq))
            self._track(h)
            handles.append(h)
        for h in handles:
            self._produce(h)
        return handles

    def _produce(self, handle: CommandHandle) -> CommandHandle:
        command = handle.command

        def delivered(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                handle.error = str(err)
            else:
                acknowledged(handle, msg.partition(), msg.offset(), msg.value())

        handle.topic = command_topic(self.settings, command.type)
        try:
            produce(
                self.producer,
                handle.topic,
                key=command.session_id.encode(),
                value=self.codec.encode_command(command),
                on_delivery=delivered,
            )
        except KafkaException as e:  # e.g. a record larger than the producer takes
            self.release(handle)
            raise unavailable(f"command {command.command_id} not sent", e, self.settings) from e
        self.producer.poll(0)
        return handle

    def prompt(
        self,
        session_id: str,
        text: str,
        *,
        policy: PromptPolicy = "reject",
        context_ref: str | None = None,
        timeout_ms: int | None = None,
        retry_of: str | None = None,
        **fields: Any,
    ) -> CommandHandle:
        payload = PromptPayload(
            text=text,
            policy=policy,
            context_ref=context_ref,
            timeout_ms=timeout_ms,
            retry_of=retry_of,
        )
        return self.submit(self.command(session_id, "prompt", payload, **fields))

    def steer(
        self,
        session_id: str,
        text: str,
        *,
        run_id: str | _KnownRun | None = KNOWN_RUN,
        **fields: Any,
    ) -> CommandHandle:
        run = self._target(session_id, run_id)
        cmd = self.command(session_id, "steer", SteerPayload(text=text), run_id=run, **fields)
        return self.submit(cmd)

    def follow_up(
        self,
        session_id: str,
        text: str,
        *,
        when_idle: Literal["start", "reject"] = "start",
        on_run_end: Literal["drop", "queue"] = "drop",
        run_id: str | _KnownRun | None = KNOWN_RUN,
        **fields: Any,
    ) -> CommandHandle:
        payload = FollowUpPayload(text=text, when_idle=when_idle, on_run_end=on_run_end)
        run = self._target(session_id, run_id)
        return self.submit(self.command(session_id, "follow_up", payload, run_id=run, **fields))

    def send(
        self,
        session_id: str,
        text: str,
        *,
        context_ref: str | None = None,
        timeout_ms: int | None = None,
        **fields: Any,
    ) -> CommandHandle:
        payload = SendPayload(text=text, context_ref=context_ref, timeout_ms=timeout_ms)
        return self.submit(self.command(session_id, "send", payload, **fields))

    def abort(
        self,
        session_id: str,
        reason: str = "user",
        *,
        run_id: str | _KnownRun | None = KNOWN_RUN,
        **fields: Any,
    ) -> CommandHandle:
        run = self._target(session_id, run_id)
        payload = AbortPayload(reason=reason)
        return self.submit(self.command(session_id, "abort", payload, run_id=run, **fields))

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every produced command is acknowledged by the broker."""
        if self._producer is not None:
            left = self._producer.flush(timeout)
            if left:
                raise KafkaUnavailable(
                    f"{left} commands not acknowledged within {timeout}s by "
                    f"{self.settings.kafka_bootstrap}",
                    bootstrap=self.settings.kafka_bootstrap,
                )

    # -- outcomes ---------------------------------------------------------------------------
    def _consumer(self, *, read_committed: bool = True) -> Consumer:
        return Consumer(
            reader_config(
                self.settings,
                group_id=f"sessionstream-client-{uuid.uuid4()}",
                read_committed=read_committed,
                eof=True,
                fetch_wait_ms=self._fetch_wait_ms,
            )
        )

    def _partition_count(self) -> int:
        if self._partitions is None:
            try:
                meta = self._meta_consumer().list_topics(self.settings.events_topic, timeout=10)
            except KafkaException as e:
                raise unavailable("reading the events topic's metadata", e, self.settings) from e
            topic = meta.topics.get(self.settings.events_topic)
            if topic is None or topic.error is not None:
                raise KafkaUnavailable(
                    f"events topic {self.settings.events_topic!r} unavailable: "
                    f"{topic.error if topic else 'missing'}",
                    bootstrap=self.settings.kafka_bootstrap,
                )
            self._partitions = len(topic.partitions)
        return self._partitions

    def _meta_consumer(self) -> Consumer:
        # Never assigned, so its requests do not queue behind a long-polling fetch; and
        # read_uncommitted, so a watermark includes records of transactions still pending.
        # That matters in wait(): the processor's offset commit can become visible before
        # the commit marker reaches the events partition, so a read_committed watermark
        # (the LSO) read at that moment would stop short of the command's own events.
        if self._meta is None:
            self._meta = self._consumer(read_committed=False)
        return self._meta

    def _events_high_watermarks(self, session_id: str) -> dict[int, int]:
        """Where the session's events partition ends now: its outcome can only come after."""
        p = partition_for(session_id.encode(), self._partition_count())
        return {p: self._hwm(p)}

    def _processor_position(self, partition: int, topic: str) -> int:
        """The processor group's committed offset on an input partition (-1: none)."""
        return self._processor_positions([(topic, partition)]).get((topic, partition), -1)

    def _processor_positions(self, keys: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The processor group's committed offsets on input partitions, in one request
        (-1: none, or not known now)."""
        if self._offsets is None:
            # never joined: only its committed offsets are fetched. read_uncommitted, so
            # librdkafka does not ask for *stable* offsets (KIP-447): those are refused
            # (UNSTABLE_OFFSET_COMMIT, retried) while the processor's transaction holding
            # the next offsets is open, which under load is nearly always (p99 1.6 s per
            # read at 500 commands/s). The committed offset, from transactions that have
            # committed, is what the duplicate proof needs.
            self._offsets = Consumer(
                reader_config(
                    self.settings, group_id=self.settings.processor_group, read_committed=False
                )
            )
        try:
            got = self._offsets.committed([TopicPartition(t, p) for t, p in keys], timeout=5)
        except KafkaException:
            # coordinator busy (e.g. rebalancing): ask again on the next round
            return dict.fromkeys(keys, -1)
        return {(tp.topic, tp.partition): int(tp.offset) for tp in got}

    def _track(self, handle: CommandHandle) -> None:
        """Make sure the tail consumer reads the handle's events partition from its start."""
        assert handle.events_from is not None
        if self._events is None:
            self._ensure_registry()
            self._events = self._consumer()
        for p, offset in handle.events_from.items():
            if p not in self._tailing:
                # the tail only ever moves forward from a high watermark read before the
                # command was produced, so every tracked command's events are still ahead
                tp = TopicPartition(self.settings.events_topic, p, offset)
                self._events.incremental_assign([tp])
                self._tailing[p] = offset
        key = _key(handle)
        self._pending[key] = []
        # the outcome lies beyond where the partition ended before the command was sent
        # (anything earlier under the same id, another tenant's refused command, is not
        # it), and its events carry the command's `ts` (every event copies it as
        # `producer_ts`): an earlier send of the same id whose events come after that
        # point (producers racing, a retry after a timed-out wait) is not this one
        self._pending_from[key] = (min(handle.events_from.values()), handle.command.ts)

    def _drain(self, timeout: float) -> None:
        """Read what the tail has; keep the events of tracked commands. In batches: each
        call into librdkafka lets go of the GIL, and in a busy process (a gateway) getting
        it back can take a switch interval (5 ms) per call."""
        assert self._events is not None
        batch = take(self._events, _DRAIN_BATCH, timeout)
        while batch:
            for msg in batch:
                self._drain_one(msg)
            batch = take(self._events, _DRAIN_BATCH, 0) if len(batch) == _DRAIN_BATCH else []

    def _drain_one(self, msg: Any) -> None:
        err = msg.error()
        if err is None:
            try:
                event = self.codec.decode_event(msg.value() or b"")
            except DecodeError as e:
                self._cannot_read(msg, e)
                return
            self._saw(event)
            key = (event.session_id, event.command_id)
            bucket = self._pending.get(key)
            if bucket is not None:
                start, ts = self._pending_from[key]
                if (msg.offset() or 0) >= start and event.producer_ts in (ts, None):
                    bucket.append(event)
        elif err.fatal():
            raise unavailable("reading outcomes", KafkaException(err), self.settings)
        # else a broker restarting, or a partition's end: librdkafka reconnects, and the
        # caller's deadline bounds the wait

    def _cannot_read(self, msg: Any, error: DecodeError) -> None:
        """An event this version cannot read (a newer sessionstream wrote it, or bytes
        that are no event) is skipped, and the tail goes on. The tracked commands of its
        session (its key's first part) whose outcome may start at or before it can no
        longer be known: `wait` and `collect` raise `IncompatibleEvent` for those only."""
        offset = msg.offset() or 0
        where = f"{msg.topic()}[{msg.partition()}]@{offset}"
        reason = (
            f"an event at {where} this version cannot read ({error.reason}): upgrade sessionstream"
        )
        session = (msg.key() or b"").split(b"/", 1)[0].decode(errors="replace")
        hit = [
            key
            for key, (start, _) in self._pending_from.items()
            if key[0] == session and offset >= start
        ]
        for key in hit:
            self._unreadable[key] = reason
        log.warning("%s; skipped (%d tracked commands of its session affected)", reason, len(hit))

    def _fetched_end(self, partition: int) -> int | None:
        """The events partition's high watermark as the tail's last fetch reported it, or
        None when the tail does not read the partition (or has not fetched it yet)."""
        if self._events is None or partition not in self._tailing:
            return None
        tp = TopicPartition(self.settings.events_topic, partition)
        try:
            _low, high = self._events.get_watermark_offsets(tp, cached=True)
        except KafkaException:
            return None
        return int(high) if high is not None and high >= 0 else None

    def _tail_position(self, partition: int) -> int:
        assert self._events is not None
        tp = TopicPartition(self.settings.events_topic, partition)
        position = int(self._events.position([tp])[0].offset)
        # nothing consumed yet: the tail stands where it was assigned
        return position if position >= 0 else self._tailing[partition]

    def wait(self, handle: CommandHandle, timeout: float = 30.0) -> Outcome:
        """Block until the command's outcome is visible, or raise `CommandTimeout`.

        The processor commits its input offsets in the transaction of the events, so once
        its committed offset is past the command, all of the command's events are below the
        events partition's high watermark read then; a tail at that watermark with no event
        of the command means the processor applied nothing: a duplicate command id.
        """
        deadline = time.monotonic() + timeout
        cid = handle.command.command_id
        if handle.events_from is None:
            raise ValueError("command was submitted with track=False")
        if _key(handle) not in self._pending:
            self._track(handle)
        try:
            while True:
                if not handle.acked and handle.error is None:
                    self.producer.poll(0.01)
                    self._drain(0)
                else:
                    self._drain(0.02)
                outcome = self._step(handle, _Round(self))
                if outcome is not None:
                    return outcome
                if time.monotonic() > deadline:
                    what = "not acknowledged by the broker" if not handle.acked else ""
                    raise CommandTimeout(cid, what or f"no outcome within {timeout}s")
        finally:
            self.release(handle)

    def collect(
        self, handles: list[CommandHandle], timeout: float = 0.01
    ) -> list[tuple[CommandHandle, Outcome | SessionstreamError]]:
        """One round of `wait` for many tracked commands at once, waiting at most
        `timeout` for new events: the outcomes (or errors) known now. Those handles are
        released; the others stay tracked for the next round (or `release`). Watermarks
        and the processor's position are read once per partition per round, so the cost
        grows with partitions, not with commands in flight; the last stable offsets that
        settle commands are asked in one round and answered in a later one
        (`_settle_points`), so an outcome needs at least two rounds."""
        self.producer.poll(0)
        if self._events is not None:
            self._drain(timeout)
        elif timeout > 0:
            time.sleep(timeout)
        self._round_no += 1
        rnd = _Round(self, lso_async=True)
        self._settle_points(handles)
        # the processor's positions this round's duplicate checks ask for: one request
        now = time.monotonic()
        asking = set()
        for h in handles:
            key = _key(h)
            w = self._waits.get(key)
            if (
                h.acked
                and h.partition is not None
                and h.topic
                and not self._pending.get(key)
                and (w is None or (w.settle_at is None and now >= w.next_check))
            ):
                asking.add((h.topic, h.partition))
        if asking:
            rnd.prefetch_positions(asking)
        out: list[tuple[CommandHandle, Outcome | SessionstreamError]] = []
        for h in handles:
            try:
                got: Outcome | SessionstreamError | None = self._step(h, rnd)
            except SessionstreamError as e:
                got = e
            if got is not None:
                out.append((h, got))
                self.release(h)
        return out

    def _settle_points(self, handles: list[CommandHandle]) -> None:
        """Where each command whose events arrived is settled: the last stable offset of
        its partition, read after its first event was. The reads do not hold up the round
        (under load one takes 15 ms and more, and every command in flight waited for it):
        this round asks one request for the commands whose events arrived since, and a
        later round takes the answer. An answer settles only commands whose events had
        arrived before it was asked (read earlier, the offset could stop short of their
        transaction's marker); a failed one is asked again at once, by a request that
        falls back to the high watermark."""
        unsettled: list[tuple[CommandHandle, _WaitState]] = []
        for h in handles:
            key = _key(h)
            if h.partition is None or not self._pending.get(key):
                continue
            w = self._waits.setdefault(key, _WaitState())
            if w.settle_at is None:
                if w.events_round is None:
                    w.events_round = self._round_no
                unsettled.append((h, w))
        if not unsettled and not self._lso_asks:
            return
        answered: list[tuple[int, dict[int, int]]] = []
        failed: set[int] = set()
        waiting = []
        for asked, futures in self._lso_asks:
            if not all(f.done() for f in futures.values()):
                waiting.append((asked, futures))
                continue
            try:
                answered.append((asked, {p: int(f.result().offset) for p, f in futures.items()}))
            except KafkaException:
                failed.update(futures)
        self._lso_asks = waiting
        if failed:  # not left waiting for the next round
            answered.append((self._round_no, self._hwms(failed, committed=True)))
        still: list[tuple[CommandHandle, _WaitState]] = []
        for h, w in unsettled:
            assert h.partition is not None and w.events_round is not None
            for asked, lso in answered:
                if asked >= w.events_round and h.partition in lso:
                    w.settle_at = lso[h.partition]
                    break
            else:
                still.append((h, w))
        # what the asks in flight will not settle: one more request
        ask = set()
        for h, w in still:
            assert h.partition is not None and w.events_round is not None
            if not any(
                asked >= w.events_round and h.partition in futures
                for asked, futures in self._lso_asks
            ):
                ask.add(h.partition)
        if ask:
            try:
                self._lso_asks.append((self._round_no, self._ask_offsets(ask, committed=True)))
            except KafkaException:  # refused before it was sent: read now, as a failed one
                lso = self._hwms(ask, committed=True)
                for h, w in still:
                    if h.partition in lso:
                        w.settle_at = lso[h.partition]

    def release(self, handle: CommandHandle) -> None:
        """Stop tracking `handle` (its outcome is known, or no longer wanted)."""
        key = _key(handle)
        self._pending.pop(key, None)
        self._pending_from.pop(key, None)
        self._waits.pop(key, None)
        self._unreadable.pop(key, None)

    def _step(self, handle: CommandHandle, rnd: _Round) -> Outcome | None:
        """The outcome of `handle` if what was read so far proves it, else None."""
        if handle.error is not None:
            raise KafkaUnavailable(
                f"command not delivered: {handle.error}", bootstrap=self.settings.kafka_bootstrap
            )
        unreadable = self._unreadable.get(_key(handle))
        if unreadable is not None:
            raise IncompatibleEvent(unreadable)
        if not handle.acked or handle.partition is None:
            return None
        if handle.offset is None:  # acknowledged without one: its upper bound
            handle.offset = self._hwm(handle.partition, topic=handle.topic) - 1
        key = _key(handle)
        cid = handle.command.command_id
        p = handle.partition
        w = self._waits.setdefault(key, _WaitState())
        mine = self._pending[key]
        # a command's events are one transaction, so they all precede its commit marker;
        # the tail read the first of them read_committed, so that marker was written
        # before, and the partition's last stable offset read now lies past it: once the
        # tail reaches it, it has them all. (Not the high watermark: that also covers the
        # records of transactions still open, and waiting for it meant waiting for the
        # processor's next commit too.)
        if mine:
            if w.settle_at is None:
                if rnd.lso_async:  # `collect` asks for it; a later round has the answer
                    return None
                w.settle_at = rnd.lso(p)
            if rnd.tail_position(p) >= w.settle_at:
                return outcome_of(cid, mine)
        elif time.monotonic() >= w.next_check:
            w.next_check = time.monotonic() + 0.1
            if w.settle_at is None and rnd.processor_position(p, handle.topic) > handle.offset:
                # the high watermark here, not the last stable offset: the processor's
                # offsets can be visible before its markers on this partition are, and
                # then the transaction is still open here (the stable offset before it)
                w.settle_at = rnd.hwm(p)
            if w.settle_at is not None and rnd.tail_position(p) >= w.settle_at:
                reason = self._dead_letter_reason(handle)
                if reason is not None:
                    return Outcome("dead_letter", cid, reason=reason)
                return Outcome("duplicate", cid)
        return None

    def _dlq_ends(self) -> dict[int, int]:
        """Where the dead-letter topic ends now, per partition."""
        if self._dlq_parts is None:
            meta = self._meta_consumer().list_topics(self.settings.dlq_topic, timeout=10)
            topic = meta.topics.get(self.settings.dlq_topic)
            if topic is None or topic.error is not None:
                return {}
            self._dlq_parts = sorted(topic.partitions)
        return {p: self._hwm(p, topic=self.settings.dlq_topic) for p in self._dlq_parts}

    def _dead_letter_reason(self, handle: CommandHandle) -> str | None:
        """The processor applied nothing: was the record dead-lettered (rather than a
        duplicate)? Its dead letter names the command's partition and offset."""
        if not handle.dlq_from:
            return None
        src = (handle.topic, handle.partition, handle.offset)
        dlq = self.settings.dlq_topic
        ends = {(dlq, p): self._hwm(p, topic=dlq) for p in handle.dlq_from}
        if all(ends[(dlq, p)] <= o for p, o in handle.dlq_from.items()):
            return None  # nothing was dead-lettered since the command was sent
        # read_uncommitted: the processor's commit is visible (we saw its offsets), the
        # marker on the DLQ partition may not be written yet
        for r in read_records(
            self.settings,
            {dlq: list(handle.dlq_from)},
            start={(dlq, p): o for p, o in handle.dlq_from.items()},
            end=ends,
            timeout=10,
            group_id=f"sessionstream-client-{uuid.uuid4()}",
            read_committed=False,
        ):
            d = DeadLetter.from_headers(r.headers)
            if d is None:
                continue
            if handle.offset_exact:
                if (d.topic, d.partition, d.offset) == src:
                    return d.reason
            elif (  # at or below the bound, with the bytes sent
                (d.topic, d.partition) == src[:2]
                and d.offset <= (handle.offset or 0)
                and r.value == handle.sent
            ):
                return d.reason
        return None

    def _hwms(self, partitions: set[int], *, committed: bool = False) -> dict[int, int]:
        """High watermarks of several events partitions in one request (`_hwm` asks once
        per partition); `committed`: their last stable offsets (where a read_committed
        reader ends now). Falls back to `_hwm` when the request fails (a high watermark is
        never below the last stable offset, so waiting for it is only slower)."""
        if len(partitions) < 2 and not committed:
            return {p: self._hwm(p) for p in partitions}
        try:
            got = self._ask_offsets(partitions, committed=committed)
            return {p: int(f.result(timeout=10).offset) for p, f in got.items()}
        except KafkaException:
            return {p: self._hwm(p) for p in partitions}

    def _ask_offsets(self, partitions: set[int], *, committed: bool) -> dict[int, Future[Any]]:
        """Where these events partitions end (`committed`: their last stable offsets), asked
        in one request; the answers come as futures."""
        if self._admin is None:
            self._admin = AdminClient(client_config(self.settings))
        topic = self.settings.events_topic
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        isolation = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
        got = self._admin.list_offsets(
            {TopicPartition(topic, p): latest for p in partitions},
            isolation_level=isolation,
            request_timeout=10,
        )
        return {tp.partition: f for tp, f in got.items()}

    def _hwm(self, partition: int, timeout: float = 10.0, topic: str | None = None) -> int:
        """A partition's high watermark (events topic by default), retrying while
        leadership settles."""
        tp = TopicPartition(topic or self.settings.events_topic, partition)
        deadline = time.monotonic() + timeout
        while True:
            try:
                return int(
                    self._meta_consumer().get_watermark_offsets(tp, timeout=timeout, cached=False)[
                        1
                    ]
                )
            except KafkaException as e:
                # a new topic answers NOT_LEADER (not flagged retriable) for a moment
                if time.monotonic() > deadline:
                    raise KafkaUnavailable(
                        f"cannot read offsets of {tp.topic}[{partition}]: {e}",
                        bootstrap=self.settings.kafka_bootstrap,
                    ) from e
                time.sleep(0.1)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(10)
        for c in (self._events, self._offsets, self._meta):
            if c is not None:
                c.close()
        self._producer = self._events = self._offsets = self._meta = None
        self._admin = None
        self._tailing.clear()
        self._pending.clear()
        self._pending_from.clear()
        self._waits.clear()
        self._lso_asks.clear()

    def __enter__(self) -> SessionClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class _WaitState:
    settle_at: int | None = None
    next_check: float = 0.0
    #: the `collect` round in which the command's first event was seen
    events_round: int | None = None


class _Round:
    """Broker reads of one `collect`/`wait` round, once per partition. A watermark read
    for a duplicate check must come after the processor's position it relies on, so
    reading a position drops the partition's cached watermark."""

    def __init__(self, client: SessionClient, *, lso_async: bool = False) -> None:
        self.client = client
        #: `collect`'s round: the last stable offsets come from `_settle_points`
        self.lso_async = lso_async
        self._hwm: dict[int, int] = {}
        self._lso: dict[int, int] = {}
        self._position: dict[tuple[str, int], int] = {}
        self._tail: dict[int, int] = {}

    def prefetch_positions(self, keys: set[tuple[str, int]]) -> None:
        """The processor's positions on these input partitions, those not read within the
        last 50 ms in one request."""
        now = time.monotonic()
        stale = [
            k
            for k in keys
            if k not in self._position and now - self.client._positions.get(k, (0.0, -1))[0] > 0.05
        ]
        if not stale:
            return
        got = self.client._processor_positions(stale)
        at = time.monotonic()
        for (topic, partition), value in got.items():
            self.client._positions[(topic, partition)] = (at, value)
            self._position[(topic, partition)] = value
            self._hwm.pop(partition, None)

    def lso(self, partition: int) -> int:
        if partition not in self._lso:
            self._lso.update(self.client._hwms({partition}, committed=True))
        return self._lso[partition]

    def tail_position(self, partition: int) -> int:
        if partition not in self._tail:
            self._tail[partition] = self.client._tail_position(partition)
        return self._tail[partition]

    def hwm(self, partition: int) -> int:
        if partition not in self._hwm:
            self._hwm[partition] = self.client._hwm(partition)
        return self._hwm[partition]

    def processor_position(self, partition: int, topic: str) -> int:
        """Read at most every 50 ms per input partition (a watermark read later is still
        read after it, which is all a duplicate's proof needs)."""
        key = (topic, partition)
        if key not in self._position:
            self.prefetch_positions({key})  # read now if the last read is too old
            self._position.setdefault(key, self.client._positions.get(key, (0.0, -1))[1])
        return self._position[key]


def _key(handle: CommandHandle) -> tuple[str, str]:
    return (handle.command.session_id, handle.command.command_id)


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
