"""`SessionClient`: the producer side of the protocol, on the Kafka adapter's clients.

Commands are keyed by session id and placed with `murmur2_random` — the partitioner Java and
aiokafka use — so every producer puts a session on the same partition and the session has
one writer. The producer is idempotent (acks=all), so its own retries never duplicate.

Commands that act on a run (`steer`, `follow_up`, `abort`) name the run this client last
saw active in the session (from the outcomes and events it read), so a late abort can never
cancel the run that started after it: the processor refuses it `run_not_active`. Pass
`run_id=None` for the session-scoped meaning, or a run id of your own.

`wait()` returns a command's outcome, as the processor wrote it on `session.outcomes` (one
record per command it reads, in the transaction of the command's events): accepted (with
its run id and its events), rejected (with the reason), `duplicate` (a command id it had
already applied) or `dead_letter` (with the reason). The client reads the outcomes and the
events partitions of the sessions it sent to, `read_committed`, from where they ended
before the command was sent; an outcome is the command's when it carries its session, its
command id and its `ts` (as `producerTs`), so another send under the same id is never
taken for it. An outcome or event this version cannot read is skipped (WARNING); the
tracked commands of its session that it may belong to raise `IncompatibleEvent`.

The commands it sends and the events an outcome carries are the models of
`sessionstream.commands` and `sessionstream.events`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict
from typing import Any, Final

from sessionstream._client_commands import KNOWN_RUN, ProducerCommands, _KnownRun
from sessionstream._outcomes import (
    CommandHandle,
    Outcome,
    OutcomeMatcher,
    acknowledged,
    outcome_of,
)
from sessionstream.adapters.kafka import (
    LIVE_FETCH_WAIT_MS,
    Admin,
    CommandProducer,
    Message,
    Reader,
    TopicPartition,
    new_admin,
    new_command_producer,
    new_reader,
    produce,
    record_failure,
    take,
    unavailable,
)
from sessionstream.adapters.registry import attach_registry
from sessionstream.adapters.topics import command_topic
from sessionstream.core.partitioning import partition_for
from sessionstream.errors import CommandTimeout, KafkaFailed, KafkaUnavailable, SessionstreamError
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.commands import (
    Command,
)
from sessionstream.schemas.errors import DecodeError
from sessionstream.schemas.events import Event
from sessionstream.schemas.sessions import scoped_session_id
from sessionstream.settings import Settings, get_settings

__all__ = ["KNOWN_RUN", "CommandHandle", "Outcome", "SessionClient", "outcome_of"]

log = logging.getLogger("sessionstream.client")

#: events the outcome tail takes from librdkafka per call
_DRAIN_BATCH: Final = 500
#: sessions whose active run a client remembers (`known_run`), at most
_RUNS_MAX: Final = 100_000


class SessionClient(ProducerCommands):
    """Send commands to sessions and, when asked, wait for their outcomes. The commands
    a producer sends by name (`prompt`, `steer`, ...) are `ProducerCommands`'."""

    def __init__(
        self,
        tenant_id: str,
        settings: Settings | None = None,
        *,
        codec: Codec | None = None,
        producer_overrides: dict[str, Any] | None = None,
        clock: Any = time.time,
        actor: str | None = None,
        fetch_wait_ms: int = LIVE_FETCH_WAIT_MS,
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
        self._producer_overrides = producer_overrides
        self._producer: CommandProducer | None = None
        #: one read_committed consumer on the outcomes and events partitions of the
        #: sessions this client tracks
        self._tail: Reader | None = None
        self._meta: Reader | None = None
        #: (topic, partition) the tail reads -> where it was assigned from
        self._tailing: dict[tuple[str, int], int] = {}
        #: what the tail read, matched to the tracked commands
        self._matcher = OutcomeMatcher(self.settings.outcomes_topic)
        self._partitions: int | None = None
        #: the tail's fetch.wait.max.ms (`LIVE_FETCH_WAIT_MS`: it costs an outcome nothing)
        self._fetch_wait_ms = fetch_wait_ms
        #: session -> the run last seen active; only while it is (a finished run is
        #: forgotten), at most `_RUNS_MAX` sessions (the least recently started go first)
        self._runs: OrderedDict[str, str] = OrderedDict()
        self._admin: Admin | None = None

    # -- producing --------------------------------------------------------------------------
    @property
    def producer(self) -> CommandProducer:
        if self._producer is None:
            self._ensure_registry()
            self._producer = new_command_producer(self.settings, **(self._producer_overrides or {}))
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
        session the gateway shows that tenant as `local_id` (sessionstream.schemas.sessions)."""
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
        return self.submit_many([command])[0]

    def submit_many(self, commands: list[Command]) -> list[CommandHandle]:
        """`submit(track=True)` for several commands at once. What a gateway sends in one
        round.

        Each command's outcome and events are looked for from where the session's
        partitions of `session.outcomes` and `session.events` ended when it was produced,
        or before. For a partition the tail already reads, that is the high watermark its
        last fetch reported (librdkafka keeps it: no request); for the others the ends are
        read once for all. What lies between that point and the true end under the same
        session and command id is still not taken for the command's unless it also
        carries the command's `ts`: an earlier send of the same id is not this one."""
        if not commands:
            return []
        n = self._partition_count()
        wanted = {partition_for(c.session_id.encode(), n) for c in commands}
        out_topic, ev_topic = self.settings.outcomes_topic, self.settings.events_topic
        ends: dict[tuple[str, int], int] = {}
        unknown = set()
        for p in wanted:
            for topic in (out_topic, ev_topic):
                end = self._fetched_end(topic, p)
                if end is None:
                    unknown.add(p)
                else:
                    ends[(topic, p)] = end
        if unknown:
            ends.update(self._ends(unknown, (out_topic, ev_topic)))
        handles = []
        for c in commands:
            p = partition_for(c.session_id.encode(), n)
            h = CommandHandle(
                c, events_from={p: ends[(ev_topic, p)]}, outcomes_from={p: ends[(out_topic, p)]}
            )
            self._track(h)
            handles.append(h)
        for h in handles:
            self._produce(h, poll=False)
        # the delivery reports once for the lot: a poll per record was a tenth of the
        # gateway's commands thread at 64 commands in flight
        self.producer.poll(0)
        return handles

    def _produce(self, handle: CommandHandle, *, poll: bool = True) -> CommandHandle:
        command = handle.command

        def delivered(err: KafkaFailed | None, msg: Message) -> None:
            if err is not None:
                handle.error = err.reason
            else:
                # a delivered record has its partition and the bytes that were sent
                acknowledged(handle, msg.partition() or 0, msg.offset(), msg.value() or b"")

        handle.topic = command_topic(self.settings, command.type)
        try:
            produce(
                self.producer,
                handle.topic,
                key=command.session_id.encode(),
                value=self.codec.encode_command(command),
                on_delivery=delivered,
            )
        except KafkaFailed as e:  # e.g. a record larger than the producer takes
            self.release(handle)
            raise unavailable(f"command {command.command_id} not sent", e, self.settings) from e
        if poll:
            self.producer.poll(0)
        return handle

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
    def _consumer(self) -> Reader:
        return new_reader(
            self.settings,
            group_id=f"sessionstream-client-{uuid.uuid4()}",
            eof=True,
            fetch_wait_ms=self._fetch_wait_ms,
        )

    def _partition_count(self) -> int:
        if self._partitions is None:
            try:
                meta = self._meta_consumer().list_topics(self.settings.events_topic, timeout=10)
            except KafkaFailed as e:
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

    def _meta_consumer(self) -> Reader:
        # never assigned, so its requests do not queue behind the tail's long-polling fetch
        if self._meta is None:
            self._meta = self._consumer()
        return self._meta

    def _track(self, handle: CommandHandle) -> None:
        """Make sure the tail reads the handle's outcomes and events partitions from its
        start points, and remember what to look for."""
        assert handle.events_from is not None and handle.outcomes_from is not None
        if self._tail is None:
            self._ensure_registry()
            self._tail = self._consumer()
        assign = []
        for topic, starts in (
            (self.settings.outcomes_topic, handle.outcomes_from),
            (self.settings.events_topic, handle.events_from),
        ):
            for p, offset in starts.items():
                if (topic, p) not in self._tailing:
                    # the tail only moves forward from an end read before the command was
                    # sent, so every tracked command's records are still ahead of it
                    assign.append(TopicPartition(topic, p, offset))
                    self._tailing[(topic, p)] = offset
        if assign:
            self._tail.incremental_assign(assign)
        self._matcher.track(handle)

    def _drain(self, timeout: float) -> None:
        """Read what the tail has; keep the outcomes and events of tracked commands. In
        batches: each call into librdkafka lets go of the GIL, and in a busy process (a
        gateway) getting it back can take a switch interval (5 ms) per call."""
        assert self._tail is not None
        batch = take(self._tail, _DRAIN_BATCH, timeout)
        while batch:
            for msg in batch:
                self._drain_one(msg)
            batch = take(self._tail, _DRAIN_BATCH, 0) if len(batch) == _DRAIN_BATCH else []

    def _drain_one(self, msg: Message) -> None:
        err = record_failure(msg)
        if err is not None:
            if err.fatal:
                raise unavailable("reading outcomes", err, self.settings) from err
            # else a broker restarting, or a partition's end: librdkafka reconnects, and
            # the caller's deadline bounds the wait
            return
        offset = msg.offset() or 0
        if msg.topic() == self.settings.outcomes_topic:
            try:
                outcome = self.codec.decode_outcome(msg.value() or b"")
            except DecodeError as e:
                self._matcher.cannot_read(msg, e)
                return
            self._matcher.outcome_read(outcome, offset)
            return
        if msg.value() is None:
            return  # a tombstone: an erased session's event
        try:
            event = self.codec.decode_event(msg.value() or b"")
        except DecodeError as e:
            self._matcher.cannot_read(msg, e)
            return
        self._saw(event)
        self._matcher.event_read(event, offset)

    def _fetched_end(self, topic: str, partition: int) -> int | None:
        """A partition's high watermark as the tail's last fetch reported it, or None when
        the tail does not read it (or has not fetched it yet)."""
        if self._tail is None or (topic, partition) not in self._tailing:
            return None
        try:
            _low, high = self._tail.get_watermark_offsets(
                TopicPartition(topic, partition), cached=True
            )
        except KafkaFailed:
            return None
        return high if high >= 0 else None

    def _tail_position(self, topic: str, partition: int) -> int:
        assert self._tail is not None
        position = int(self._tail.position([TopicPartition(topic, partition)])[0].offset)
        # nothing consumed yet: the tail stands where it was assigned
        return position if position >= 0 else self._tailing[(topic, partition)]

    def wait(self, handle: CommandHandle, timeout: float = 30.0) -> Outcome:
        """Block until the command's outcome is known, or raise `CommandTimeout`."""
        deadline = time.monotonic() + timeout
        cid = handle.command.command_id
        if handle.events_from is None:
            raise ValueError("command was submitted with track=False")
        if not self._matcher.tracks(handle):
            self._track(handle)
        try:
            while True:
                if not handle.acked and handle.error is None:
                    self.producer.poll(0.01)
                    self._drain(0)
                else:
                    self._drain(0.02)
                outcome = self._step(handle)
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
        `timeout` for new records: the outcomes (or errors) known now. Those handles are
        released; the others stay tracked for the next round (or `release`)."""
        self.producer.poll(0)
        if self._tail is not None:
            self._drain(timeout)
        elif timeout > 0:
            time.sleep(timeout)
        out: list[tuple[CommandHandle, Outcome | SessionstreamError]] = []
        for h in handles:
            try:
                got: Outcome | SessionstreamError | None = self._step(h)
            except SessionstreamError as e:
                got = e
            if got is not None:
                out.append((h, got))
                self.release(h)
        return out

    def release(self, handle: CommandHandle) -> None:
        """Stop tracking `handle` (its outcome is known, or no longer wanted)."""
        self._matcher.release(handle)

    def _step(self, handle: CommandHandle) -> Outcome | None:
        """The outcome of `handle` if it has been read (with all its events), else None."""
        if handle.error is not None:
            raise KafkaUnavailable(
                f"command not delivered: {handle.error}", bootstrap=self.settings.kafka_bootstrap
            )
        return self._matcher.outcome(
            handle, lambda p: self._tail_position(self.settings.events_topic, p)
        )

    def _ends(self, partitions: set[int], topics: tuple[str, ...]) -> dict[tuple[str, int], int]:
        """Where these partitions of `topics` end now (high watermarks), asked in one
        request; one read each when that fails."""
        try:
            if self._admin is None:
                self._admin = new_admin(self.settings)
            return self._admin.latest_offsets(
                [(t, p) for t in topics for p in partitions], committed=False, timeout=10
            )
        except KafkaFailed:
            return {(t, p): self._hwm(p, topic=t) for t in topics for p in partitions}

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
            except KafkaFailed as e:
                # a new topic answers NOT_LEADER (not flagged retriable) for a moment
                if time.monotonic() > deadline:
                    raise KafkaUnavailable(
                        f"cannot read offsets of {tp.topic}[{partition}]: {e.reason}",
                        bootstrap=self.settings.kafka_bootstrap,
                    ) from e
                time.sleep(0.1)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(10)
        for c in (self._tail, self._meta):
            if c is not None:
                c.close()
        self._producer = self._tail = self._meta = None
        self._admin = None
        self._tailing.clear()
        self._matcher.clear()

    def __enter__(self) -> SessionClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
