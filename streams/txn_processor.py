"""The session processor as a confluent-kafka consume-decide-produce loop, exactly once.

Each batch of commands is one Kafka transaction holding the events (on the command's
partition number), the new session states (changelog `session.state`), the command ids to
remember (`session.dedup`), dead letters, forwarded misplaced commands, fired timers and the
input offsets (`send_offsets_to_transaction` with the group metadata, KIP-447). Either all
of it is visible to `read_committed` readers or none of it is.

Time: the decider's "now" is each command record's timestamp, which the broker stamps at
append (`message.timestamp.type=LogAppendTime` on the commands topic), so the same log
replays to the same decisions and no producer clock decides anything.

Zombies: the transactional id is stable per instance (`{group}-{instance}`), so a restarted
instance aborts its predecessor's open transaction at `init_transactions`; a processor that
lost its partitions is fenced by the group generation when it sends offsets.

Restore: on assignment, committed offsets are fetched first (read_committed asks the broker
for stable offsets, so a predecessor's pending transaction is resolved before we go on),
then the state and dedup partitions are read to their ends. State and offsets come from one
transaction, so they agree.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from schemas.codec import Codec
from schemas.discovery import OpenRun
from sessionstream import metrics
from sessionstream._kafka import client_config, data_messages, read_topic
from sessionstream.errors import KafkaUnavailable
from sessionstream.settings import Settings
from sessionstream.topics import check_topics, ensure_topics
from streams.core import (
    FORWARDED_HEADER,
    CommandStep,
    DedupRecord,
    Outcome,
    decode_dedup,
    decode_state,
    dedup_key,
    encode_dedup,
    encode_state,
)
from streams.decider import DeciderConfig, evolve
from streams.open_runs import open_run
from streams.state import SessionState
from streams.timers import due_timers, timer_command

__all__ = ["ProcessorStats", "TransactionalProcessor", "default_instance_id"]

log = logging.getLogger("sessionstream.processor")

#: a fired timer is fired again only if its command has not been decided after this long
REFIRE_MS = 5_000
#: a producer fenced again this soon after being replaced means a second live instance
RENEW_WINDOW_S = 60.0
#: longest wait for send_offsets_to_transaction before the producer is given up
SEND_OFFSETS_LIMIT_S = 30.0


def default_instance_id() -> str:
    """Stable across restarts on one host, so a restart fences its own predecessor."""
    return socket.gethostname()


@dataclass
class ProcessorStats:
    commands: int = 0
    events: int = 0
    dead_letters: int = 0
    duplicates: int = 0
    rejections: int = 0
    timers_fired: int = 0
    forwarded: int = 0
    transactions: int = 0
    aborts: int = 0
    rejections_by_reason: dict[str, int] = field(default_factory=dict)
    dead_letters_by_reason: dict[str, int] = field(default_factory=dict)


class _Partition:
    """What one assigned partition holds: its sessions' states, the command ids they
    remember, and pending timers."""

    def __init__(self) -> None:
        self.states: dict[str, SessionState] = {}
        self.dedup: dict[tuple[str, int], tuple[int, int]] = {}
        #: the latest decision time on this partition (to expire dedup records)
        self.clock = 0
        self.timers: list[tuple[int, str]] = []  # heap of (due_at, session_id)
        self.fired: dict[str, int] = {}  # timer command id -> when fired

    def schedule(self, state: SessionState) -> None:
        for t in due_timers(state):
            heapq.heappush(self.timers, (t.due_at, state.session_id))

    def remember(self, r: DedupRecord) -> None:
        self.dedup[(r.session_id, r.id_hash)] = (r.digest, r.at)
        if r.at > self.clock:
            self.clock = r.at

    def forget_expired(self, ttl_ms: int) -> None:
        """Drop dedup records the decider would no longer look at (older than the TTL by
        the partition's latest decision time; a session's own clock is never behind it by
        more than its idle time, so nothing still inside a session's window goes)."""
        if self.dedup:
            self.clock = max(self.clock, max(at for _d, at in self.dedup.values()))
        horizon = self.clock - ttl_ms
        self.dedup = {k: v for k, v in self.dedup.items() if v[1] >= horizon}


class TransactionalProcessor:
    """Runs the decider over `session.commands`; one instance per process."""

    def __init__(
        self,
        settings: Settings,
        *,
        instance_id: str | None = None,
        config: DeciderConfig | None = None,
        batch_size: int = 500,
        clock: Any = time.time,
    ) -> None:
        self.settings = settings
        self.instance_id = instance_id or settings.processor_instance or default_instance_id()
        self.codec = Codec()
        self.config = config or DeciderConfig(
            max_payload_bytes=settings.max_payload_bytes, max_lease_ms=settings.max_lease_ms
        )
        self.batch_size = batch_size
        self.clock = clock
        self.stats = ProcessorStats()
        self.partitions: dict[int, _Partition] = {}
        self.ready = threading.Event()
        self._cancel_requested: dict[str, int] = {}  # run id -> ts, for the cancel histogram
        self._step: CommandStep | None = None
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._renewed_at: float | None = None
        self._consumer_renewed_at: float | None = None
        self._forward_logged_at = 0.0
        self._transactions_since_sweep = 0

    # -- setup ------------------------------------------------------------------------------
    def _now(self) -> int:
        return int(self.clock() * 1000)

    def start(self) -> None:
        """Create/verify topics, fence predecessors, join the group. Raises on bad topics."""
        s = self.settings
        ensure_topics(s)
        counts = check_topics(s).partitions
        self._step = CommandStep(self.codec, self.config, partitions=counts[s.commands_topic])
        self._producer = self._transactional_producer()
        self._consumer = self._group_consumer()

    def _group_consumer(self) -> Consumer:
        """Our member of the processor group, subscribed to the commands topic."""
        s = self.settings
        consumer = Consumer(
            client_config(
                s,
                **{
                    "group.id": s.processor_group,
                    "client.id": f"processor-{self.instance_id}",
                    # static membership: a restarted instance gets its partitions back at
                    # once instead of after the dead member's session timeout; a second
                    # process with the same instance id is fenced by the coordinator
                    "group.instance.id": f"processor-{self.instance_id}",
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "isolation.level": "read_committed",
                    "session.timeout.ms": 6000,
                    "heartbeat.interval.ms": 1000,
                    "max.poll.interval.ms": 60000,
                    "fetch.wait.max.ms": 10,
                    "partition.assignment.strategy": "range",
                },
            )
        )
        consumer.subscribe(
            [s.commands_topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )
        return consumer

    def _transactional_producer(self) -> Producer:
        """A producer with our stable transactional id; `init_transactions` fences (and
        aborts the open transaction of) any earlier producer with that id."""
        s = self.settings
        producer = Producer(
            client_config(
                s,
                **{
                    "transactional.id": f"{s.processor_group}-{self.instance_id}",
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 1,
                    "transaction.timeout.ms": s.transaction_timeout_ms,
                    # a transaction begun while the broker still closes the previous one is
                    # answered CONCURRENT_TRANSACTIONS; librdkafka's default 100 ms back-off
                    # before the retry was most of the latency at 500 cmd/s (bench)
                    "retry.backoff.ms": 10,
                    "message.max.bytes": 4 * 1024 * 1024,
                },
            )
        )
        try:
            producer.init_transactions(60)
        except KafkaException as e:
            raise KafkaUnavailable(
                f"init_transactions failed: {e}", bootstrap=s.kafka_bootstrap
            ) from e
        return producer

    # -- rebalance --------------------------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Step 1: committed offsets (stable: waits out a predecessor's pending transaction)
        committed = consumer.committed(partitions, timeout=60)
        # Step 2: state of each partition, read to its end (one reader for all of them)
        for p, part in self._restore([tp.partition for tp in partitions]).items():
            self.partitions[p] = part
            metrics.ACTIVE_RUNS.inc(sum(1 for st in part.states.values() if st.active))
        # Step 3: consume from the committed offsets (or the beginning)
        start = [
            TopicPartition(
                tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            )
            for tp in committed
        ]
        consumer.assign(start)
        log.info("assigned %s", sorted(tp.partition for tp in partitions))
        self.ready.set()

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # no transaction is open here: every batch commits before the next poll
        for tp in partitions:
            gone = self.partitions.pop(tp.partition, None)
            if gone is not None:
                metrics.ACTIVE_RUNS.dec(sum(1 for st in gone.states.values() if st.active))
        log.info("revoked %s", sorted(tp.partition for tp in partitions))

    def _restore(self, partitions: list[int]) -> dict[int, _Partition]:
        """Read the state and dedup changelogs of `partitions` to their ends."""
        s = self.settings
        parts = {p: _Partition() for p in partitions}
        if not partitions:
            return parts
        reader = Consumer(
            client_config(
                s,
                **{
                    "group.id": f"{s.processor_group}-restore",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "enable.partition.eof": True,
                    "fetch.wait.max.ms": 10,
                },
            )
        )
        topics = (s.state_topic, s.dedup_topic)
        stale: set[tuple[int, str]] = set()
        try:
            # metadata first: assigning before the leader is known costs librdkafka's
            # 500 ms offset-query back-off per partition
            for t in topics:
                reader.list_topics(t, timeout=30)
            reader.assign(
                [TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in partitions]
            )
            pending = {(t, p) for t in topics for p in partitions}
            while pending:
                msg = reader.poll(1.0)
                if msg is None:
                    continue
                err = msg.error()
                topic, p, _offset = _coords(msg)
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard((topic, p))
                        continue
                    raise KafkaException(err)
                key, value = msg.key() or b"", msg.value()
                if topic == s.dedup_topic:
                    if value is not None:
                        r = decode_dedup(key, value)
                        parts[p].dedup[(r.session_id, r.id_hash)] = (r.digest, r.at)
                elif value is None:
                    parts[p].states.pop(key.decode(), None)
                    stale.discard((p, key.decode()))
                else:
                    try:
                        state = decode_state(value)
                    except ValueError as e:  # pydantic's ValidationError is one
                        # written by another version of the processor: the log knows it
                        stale.add((p, key.decode()))
                        log.debug("state of %s unreadable (%s)", key, e)
                        continue
                    stale.discard((p, state.session_id))
                    parts[p].states[state.session_id] = state
        finally:
            reader.close()
        if stale:
            self._rebuild(parts, stale)
        for part in parts.values():
            part.forget_expired(self.config.dedup_ttl_ms)
            for state in part.states.values():
                part.schedule(state)
        return parts

    def _rebuild(self, parts: dict[int, _Partition], stale: set[tuple[int, str]]) -> None:
        """States the changelog holds in a form this version cannot read (an upgrade) are
        folded again from the events log, the source of truth: same state, new form."""
        s = self.settings
        by_partition: dict[int, set[str]] = {}
        for p, sid in stale:
            by_partition.setdefault(p, set()).add(sid)
        log.warning(
            "%s session states in an older form; rebuilding them from %s (partitions %s)",
            len(stale),
            s.events_topic,
            sorted(by_partition),
        )
        rebuilt: dict[tuple[int, str], SessionState] = {}
        for p, sids in by_partition.items():
            events = read_topic(
                s,
                s.events_topic,
                partitions=[p],
                timeout=600,
                group_id=f"{s.processor_group}-restore",
            )
            for r in events:
                if r.value is None:
                    continue
                e = self.codec.decode_event(r.value)
                if e.session_id in sids:
                    before = rebuilt.get((p, e.session_id)) or SessionState.initial(e.session_id)
                    rebuilt[(p, e.session_id)] = evolve(before, e, self.config)
        for (p, sid), state in rebuilt.items():
            parts[p].states[sid] = state
        log.warning("rebuilt %s session states from the events log", len(rebuilt))

    # -- the loop ---------------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None) -> None:
        """Process until `stop` is set (or forever)."""
        if self._consumer is None:
            self.start()
        assert self._consumer is not None
        stop = stop or threading.Event()
        try:
            while not stop.is_set():
                first = self._consumer.poll(0.05)
                batch: list[Message] = [first] if first is not None else []
                if first is not None:
                    batch += self._consumer.consume(self.batch_size - 1, timeout=0)
                try:
                    batch = data_messages(batch, log)
                except KafkaException as e:
                    self._renew_consumer(e)
                    continue
                timers = self._due_timer_commands()
                if batch or timers:
                    self._transact(batch, timers)
        finally:
            self.close()

    def _due_timer_commands(self) -> list[tuple[int, str, bytes, bytes]]:
        now = self._now()
        out = []
        for p, part in self.partitions.items():
            if len(part.fired) > 10_000:
                part.fired = {k: v for k, v in part.fired.items() if now - v < REFIRE_MS}
            while part.timers and part.timers[0][0] <= now:
                _due, sid = heapq.heappop(part.timers)
                state = part.states.get(sid)
                if state is None:
                    continue
                for t in due_timers(state):
                    if t.due_at > now:
                        heapq.heappush(part.timers, (t.due_at, sid))
                        continue
                    cmd = timer_command(state, t, now)
                    fired = part.fired.get(cmd.command_id)
                    if fired is not None and now - fired < REFIRE_MS:
                        heapq.heappush(part.timers, (fired + REFIRE_MS, sid))
                        continue
                    part.fired[cmd.command_id] = now
                    out.append((p, cmd.command_id, sid.encode(), self.codec.encode_command(cmd)))
        return out

    def _transact(self, batch: list[Message], timers: list[tuple[int, str, bytes, bytes]]) -> None:
        assert self._producer is not None and self._consumer is not None and self._step is not None
        s = self.settings
        producer = self._producer
        staged: dict[tuple[int, str], SessionState] = {}
        remembered: dict[tuple[int, str, int], DedupRecord] = {}
        offsets: dict[tuple[str, int], int] = {}
        outcomes: list[Outcome] = []
        # Step 1: open the transaction
        producer.begin_transaction()
        try:
            # Step 2: decide each command in partition order, producing its records
            for msg in batch:
                topic, p, offset = _coords(msg)
                if p not in self.partitions:
                    continue  # revoked mid-batch: the new owner re-reads it
                part = self.partitions[p]

                def state_of(sid: str, p: int = p, part: _Partition = part) -> SessionState | None:
                    return staged.get((p, sid)) or part.states.get(sid)

                def dedup_of(
                    sid: str, h: int, p: int = p, part: _Partition = part
                ) -> tuple[int, int] | None:
                    r = remembered.get((p, sid, h))
                    return (r.digest, r.at) if r is not None else part.dedup.get((sid, h))

                headers = msg.headers()
                forwarded = headers is not None and any(h[0] == FORWARDED_HEADER for h in headers)
                outcome = self._step(
                    msg.key(),
                    msg.value(),
                    p,
                    _log_time(msg),
                    state_of,
                    dedup_of,
                    forwarded=forwarded,
                )
                outcomes.append(outcome)
                for key, value in outcome.records:
                    producer.produce(s.events_topic, key=key, value=value, partition=p)
                if outcome.events and outcome.state is not None:
                    staged[(p, outcome.state.session_id)] = outcome.state
                if outcome.remember is not None:
                    r = outcome.remember
                    remembered[(p, r.session_id, r.id_hash)] = r
                if outcome.dead_letter is not None:
                    self._dead_letter(msg, outcome)
                if outcome.forward_to is not None:
                    self._forward(msg, outcome.forward_to)
                offsets[(topic, p)] = offset + 1
            for (p, sid), state in staged.items():
                producer.produce(
                    s.state_topic, key=sid.encode(), value=encode_state(state), partition=p
                )
            # runs that now need a holder, or no longer do: what workers discover them by
            for (p, sid), state in staged.items():
                part = self.partitions[p]
                was, now = open_run(part.states.get(sid)), open_run(state)
                if _opening(was) != _opening(now):
                    record = None if now is None else now.model_dump_json(by_alias=True).encode()
                    producer.produce(s.open_runs_topic, key=sid.encode(), value=record, partition=p)
            for (p, _sid, _h), r in remembered.items():
                producer.produce(
                    s.dedup_topic,
                    key=dedup_key(r.session_id, r.id_hash),
                    value=encode_dedup(r),
                    partition=p,
                )
            # Step 3: timers become commands on the session's own partition
            for p, _cid, key, value in timers:
                producer.produce(s.commands_topic, key=key, value=value, partition=p)
            # Step 4: the input offsets join the transaction
            if offsets:
                self._send_offsets([TopicPartition(t, p, o) for (t, p), o in offsets.items()])
            # Step 5: commit — events, state, dedup, dead letters, forwards, timers and
            # offsets at once
            self._commit()
        except KafkaException as e:
            self._abort(e, batch)
            self._unfire(timers)
            return
        # Step 6: only now does the in-memory state move on
        for (p, sid), state in staged.items():
            owner = self.partitions.get(p)
            if owner is not None:
                before = owner.states.get(sid)
                was_active = before is not None and before.active is not None
                metrics.ACTIVE_RUNS.inc(int(state.active is not None) - int(was_active))
                owner.states[sid] = state
                owner.schedule(state)
        for (p, _sid, _h), r in remembered.items():
            owner = self.partitions.get(p)
            if owner is not None:
                owner.remember(r)
        self._count(outcomes, len(timers))
        self._transactions_since_sweep += 1
        if self._transactions_since_sweep >= 1000:
            self._transactions_since_sweep = 0
            for part in self.partitions.values():
                part.forget_expired(self.config.dedup_ttl_ms)

    def _send_offsets(self, offsets: list[TopicPartition]) -> None:
        """`send_offsets_to_transaction`, bounded for real. After a broker restart librdkafka
        can block in it forever, its timeout notwithstanding (librdkafka#5456, #5511); past
        SEND_OFFSETS_LIMIT_S the producer is given up as fatally failed, and a new one with
        our transactional id fences it (`_renew_producer`). The stuck call keeps its thread."""
        assert self._producer is not None and self._consumer is not None
        producer, metadata = self._producer, self._consumer.consumer_group_metadata()
        failed: list[KafkaException] = []
        done = threading.Event()

        def call() -> None:
            try:
                producer.send_offsets_to_transaction(offsets, metadata, 10)
            except KafkaException as e:
                failed.append(e)
            finally:
                done.set()

        threading.Thread(target=call, name="send-offsets", daemon=True).start()
        if not done.wait(SEND_OFFSETS_LIMIT_S):
            raise KafkaException(
                KafkaError(KafkaError._TIMED_OUT, "send_offsets_to_transaction stuck", fatal=True)
            )
        if failed:
            raise failed[0]

    def _commit(self) -> None:
        """Commit; a retriable error (broker restarting, coordinator moving) is retried."""
        assert self._producer is not None
        while True:
            try:
                self._producer.commit_transaction(30)
                return
            except KafkaException as e:
                kerr = e.args[0]
                if kerr.fatal() or kerr.txn_requires_abort() or not kerr.retriable():
                    raise
                log.warning("commit_transaction: %s; retrying", kerr)

    def _dead_letter(self, msg: Message, outcome: Outcome) -> None:
        assert self._producer is not None and outcome.dead_letter is not None
        d = outcome.dead_letter
        topic, partition, offset = _coords(msg)
        self._producer.produce(
            self.settings.dlq_topic,
            key=msg.key(),
            value=msg.value(),
            headers=[
                *(msg.headers() or []),
                ("source.topic", topic.encode()),
                ("source.partition", str(partition).encode()),
                ("source.offset", str(offset).encode()),
                ("error.reason", d.reason.encode()),
                ("error.message", d.error.encode()[:4000]),
            ],
        )
        log.warning("dead letter %s/%s@%s: %s", topic, partition, offset, d.error)

    def _forward(self, msg: Message, partition: int) -> None:
        """A command produced without the murmur2 partitioner sits where its session's
        processor never looks for it: it goes, in this transaction, to the partition its key
        hashes to, and is decided there in its turn."""
        assert self._producer is not None
        topic, source, offset = _coords(msg)
        self._producer.produce(
            topic,
            key=msg.key(),
            value=msg.value(),
            partition=partition,
            headers=[
                *(msg.headers() or []),
                (FORWARDED_HEADER, f"{topic}/{source}/{offset}".encode()),
            ],
        )
        metrics.FORWARDED.inc()
        self.stats.forwarded += 1
        now = time.monotonic()
        if now - self._forward_logged_at > 10.0:
            self._forward_logged_at = now
            log.warning(
                "command for session %r found on %s[%s] belongs on partition %s: forwarded. "
                "Its producer does not place keys with murmur2 (librdkafka clients need "
                "partitioner=murmur2_random); %s commands forwarded so far",
                (msg.key() or b"").decode(errors="replace"),
                topic,
                source,
                partition,
                self.stats.forwarded,
            )

    def _abort(self, error: KafkaException, batch: list[Message]) -> None:
        assert self._producer is not None and self._consumer is not None
        kerr = error.args[0]
        if kerr.fatal():
            self._renew_producer(kerr, error)
            self._rewind(batch)
            return
        # Anything else is aborted and the batch decided again: abortable errors (our
        # partitions moved), retriable ones (a broker restart times out send_offsets), and
        # the _STATE error produce() raises once the transaction failed in the background
        # (a broker restart: OUT_OF_ORDER_SEQUENCE_NUMBER). abort_transaction says if not.
        log.warning("aborting transaction: %s", kerr)
        self.stats.aborts += 1
        metrics.TRANSACTIONS.labels("aborted").inc()
        while True:
            try:
                self._producer.abort_transaction(30)
                break
            except KafkaException as e:
                if e.args[0].fatal():
                    self._renew_producer(e.args[0], e)
                    break
                if not e.args[0].retriable():
                    raise KafkaUnavailable(
                        f"processor could not abort its transaction: {e.args[0]}",
                        bootstrap=self.settings.kafka_bootstrap,
                    ) from e
                log.warning("abort_transaction: %s; retrying", e.args[0])
        self._rewind(batch)

    def _unfire(self, timers: list[tuple[int, str, bytes, bytes]]) -> None:
        """The timers of an aborted transaction were never sent: due again at once. (Their
        heap entries are gone; without this they came back only with the session's next
        state change, so a run whose worker had gone quiet kept an expired lease.)"""
        for p, cid, key, _value in timers:
            part = self.partitions.get(p)
            if part is None:
                continue
            part.fired.pop(cid, None)
            state = part.states.get(key.decode())
            if state is not None:
                part.schedule(state)

    def _rewind(self, batch: list[Message]) -> None:
        """Back to the first offset of the batch per partition: nothing of it happened."""
        assert self._consumer is not None
        first: dict[tuple[str, int], int] = {}
        for msg in batch:
            topic, p, offset = _coords(msg)
            first.setdefault((topic, p), offset)
        for (t, p), o in first.items():
            if p in self.partitions:
                self._consumer.seek(TopicPartition(t, p, o))

    def _renew_producer(self, kerr: KafkaError, error: KafkaException) -> None:
        """Our producer failed fatally. A broker restart that outlives
        `transaction.timeout.ms` does that: the coordinator aborts the open transaction
        itself and bumps the epoch, and our next EndTxn gets _FENCED or INVALID_TXN_STATE.
        A new producer with the same transactional id carries on (its `init_transactions`
        settles the old transaction). Fatal again soon after: a second live instance has
        our id (or the error is not transient), and this one stops."""
        now = time.monotonic()
        again = self._renewed_at is not None and now - self._renewed_at < RENEW_WINDOW_S
        if again:
            raise KafkaUnavailable(
                f"processor transaction failed fatally: {kerr}",
                bootstrap=self.settings.kafka_bootstrap,
            ) from error
        log.warning("producer failed (%s); a new producer takes over our transactional id", kerr)
        self._renewed_at = now
        self._producer = self._transactional_producer()

    def _renew_consumer(self, error: KafkaException) -> None:
        """Our consumer failed fatally: as a static member it was fenced. librdkafka fences
        itself that way when its session times out during a broker restart — it rejoins
        under a new member id and the coordinator fences the old one (librdkafka#3437) —
        and the consumer would never poll again. A new consumer with the same
        group.instance.id takes the membership back; fenced again soon after means a second
        live instance has our id, and this one stops."""
        now = time.monotonic()
        last = self._consumer_renewed_at
        if last is not None and now - last < RENEW_WINDOW_S:
            raise KafkaUnavailable(
                f"processor consumer failed fatally: {error.args[0]}",
                bootstrap=self.settings.kafka_bootstrap,
            ) from error
        log.warning("consumer failed (%s); a new consumer rejoins the group", error.args[0])
        self._consumer_renewed_at = now
        assert self._consumer is not None
        owned = [TopicPartition(self.settings.commands_topic, p) for p in self.partitions]
        self._on_revoke(self._consumer, owned)
        with contextlib.suppress(KafkaException, RuntimeError):
            self._consumer.close()
        self._consumer = self._group_consumer()

    def _count(self, outcomes: list[Outcome], timers: int) -> None:
        st = self.stats
        st.transactions += 1
        st.timers_fired += timers
        metrics.TRANSACTIONS.labels("committed").inc()
        now = self.clock()
        for o in outcomes:
            st.commands += 1
            st.events += len(o.events)
            metrics.EVENTS.inc(len(o.events))
            if o.dead_letter is not None:
                st.dead_letters += 1
                r = o.dead_letter.reason
                st.dead_letters_by_reason[r] = st.dead_letters_by_reason.get(r, 0) + 1
                metrics.COMMANDS.labels("dead_letter").inc()
                metrics.DEAD_LETTERS.labels(r).inc()
                continue
            if o.forward_to is not None:
                metrics.COMMANDS.labels("forwarded").inc()
                continue
            if o.duplicate:
                st.duplicates += 1
                metrics.COMMANDS.labels("duplicate").inc()
                continue
            if o.command is not None:
                metrics.COMMAND_AGE.observe(max(0.0, now - o.command.ts / 1000))
            rejected = False
            for e in o.events:
                if e.type == "command.rejected":
                    rejected = True
                    st.rejections += 1
                    reason = str(getattr(e.payload, "reason", "?"))
                    st.rejections_by_reason[reason] = st.rejections_by_reason.get(reason, 0) + 1
                    metrics.REJECTIONS.labels(reason).inc()
                elif e.type == "run.lease_expired":
                    metrics.LEASE_EXPIRIES.inc()
                elif e.type == "run.cancel_requested":
                    self._cancel_requested[e.run_id] = e.ts
                    if len(self._cancel_requested) > 10_000:  # runs that never finished here
                        self._cancel_requested.pop(next(iter(self._cancel_requested)))
                elif e.type == "run.finished":
                    asked = self._cancel_requested.pop(e.run_id, None)
                    if (
                        asked is not None
                        and getattr(e.payload, "terminal_status", "") == "cancelled"
                    ):
                        metrics.CANCEL_LATENCY.observe(max(0, e.ts - asked) / 1000)
            metrics.COMMANDS.labels("rejected" if rejected else "accepted").inc()

    def close(self) -> None:
        if self._consumer is not None:
            with contextlib.suppress(KafkaException, RuntimeError):
                self._consumer.close()
            self._consumer = None
        if self._producer is not None:
            with contextlib.suppress(KafkaException):  # a fatal producer cannot flush
                self._producer.flush(5)
            self._producer = None


def _opening(run: OpenRun | None) -> tuple[str, int, str] | None:
    """What makes an open-runs record new (the clock it carries does not)."""
    return None if run is None else (run.run_id, run.generation, run.status)


def _log_time(msg: Message) -> int:
    """The record's timestamp: the broker's append time on a `LogAppendTime` topic (the
    commands topic is created so; `topics check` verifies it)."""
    _kind, ts = msg.timestamp()
    return max(0, int(ts))


def _coords(msg: Message) -> tuple[str, int, int]:
    """(topic, partition, offset) of a consumed record (never None for those)."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    return topic, partition, offset
