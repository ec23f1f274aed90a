"""The session processor as a confluent-kafka consume-decide-produce loop, exactly once.

Input: three co-partitioned topics, one per command class — producers' commands, workers'
commands, the processor's own fired timers. The range assignor gives one member partition
p of all three, so a session has one writer; a command of the wrong class for its topic is
rejected `not_allowed_here`.

Each batch of commands is one Kafka transaction holding the events (on the command's
partition number), the new session states (changelog `session.state`), the runs that now
need a holder (`session.open-runs`), dead letters, forwarded misplaced commands, fired
timers (`session.timers`), the input offsets (`send_offsets_to_transaction` with the group
metadata, KIP-447) and, once the events' offsets are known, an outcome record per command
(`session.outcomes`), which also says what the session remembers of its command id. Either
all of it is visible to `read_committed` readers or none of it is.

Time: the decider's "now" is each command record's timestamp, which the broker stamps at
append (`message.timestamp.type=LogAppendTime` on the input topics), so the same log
replays to the same decisions and no producer clock decides anything.

Zombies: the transactional ids are stable per instance (`{group}-{instance}` and
`{group}-{instance}#1`, see `transactional_ids`), so a restarted instance aborts its
predecessor's open transactions at `init_transactions`; a processor that lost its partitions
is fenced by the group generation when it sends offsets.

Two producers, used in turn, two transactions in flight at most: transaction N+1 (decided
on top of N) begins on the other producer once every record of N is acknowledged, while
N's EndTxn and markers are under way, and commits only after N committed; if N does not
commit, N+1 aborts and both are read again. The logs and the offset commits keep a single
producer's order (N's records, then N+1's), so a `read_committed` reader sees N once N's
markers land. (Why two: one producer's next AddPartitionsToTxn is refused until its
markers are written, docs/decisions/0005-processor-profile.md.)

The Kafka side of a transaction (set-up, the commit on a thread of its own, the abort, what
librdkafka's errors mean) is `sessionstream/adapters/kafka/transactions.py`'s; what to do
about failures is `failures.py`'s.

Restore (`restore.py`): on assignment, the committed offsets (stable), then each
partition's store (`store.py`) reads its changelogs (`session.state`, and for the dedup
records `session.outcomes`) from its checkpoint to their ends. A committed transaction's
states and dedup records go to the store with the offsets they reach: the store is never
ahead of the committed log.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any

import rocksdict

from sessionstream.adapters import metrics
from sessionstream.adapters.kafka import (
    LIVE_FETCH_WAIT_MS,
    OFFSET_BEGINNING,
    GroupConsumer,
    Message,
    TopicPartition,
    TransactionalProducer,
    data_messages,
    new_group_consumer,
    new_transactional_producer,
)
from sessionstream.adapters.kafka.transactions import (
    COMMIT_LIMIT_S,
    SEND_OFFSETS_LIMIT_S,
    GroupLog,
    Stopping,
    TransactionCommit,
    init_transactions,
)
from sessionstream.adapters.registry import attach_registry
from sessionstream.adapters.topics import check_topics, ensure_topics
from sessionstream.core.decider import DeciderConfig
from sessionstream.core.step import CommandStep
from sessionstream.errors import KafkaFailed
from sessionstream.runtimes.processor.batch import (
    Batch,
    View,
    decide_batch,
    input_classes,
    outcome_records,
    produce,
    produce_misfits,
)
from sessionstream.runtimes.processor.cloudevents import CloudEventHeaders
from sessionstream.runtimes.processor.config import decider_config
from sessionstream.runtimes.processor.failures import Recovery
from sessionstream.runtimes.processor.partition import PartitionState, co_partitioned
from sessionstream.runtimes.processor.records import coords
from sessionstream.runtimes.processor.restore import RestoreReport, restore
from sessionstream.runtimes.processor.stats import ProcessorStats, StatsObserver
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.commands import Command
from sessionstream.settings import PRODUCER_MARK, Settings, check_instance_id

#: RocksDB's block cache, shared by the processor's stores (hot states cached in front)
BLOCK_CACHE_BYTES = 32 << 20

__all__ = ["ProcessorStats", "TransactionalProcessor", "default_instance_id"]

log = logging.getLogger("sessionstream.processor")

#: transactional producers per instance, used in turn (see the module's docstring)
PRODUCERS = 2
#: how long init_transactions may get retriable answers at start (a broker started just
#: before, still loading its transaction coordinator; a wrong address has failed by then)
START_PATIENCE_S = 300.0
#: the group's max.poll.interval.ms: outlasts both commit limits, which the main thread may
#: wait for a stuck commit without polling (at 60 s, equal to them, such a wait also made
#: the processor leave its group: 56 s to decide again, 3-node soak)
MAX_POLL_INTERVAL_MS = int((SEND_OFFSETS_LIMIT_S + COMMIT_LIMIT_S) * 1000) + 30_000
#: a poll that brings fewer records than this while a transaction commits is light load:
#: the records that arrived while its records were acknowledged join the same batch. A
#: fuller poll is a backlog, and the next poll gets them.
LIGHT_BATCH = 64


def transactional_ids(group: str, instance: str) -> list[str]:
    """The transactional ids of an instance's producers: `{group}-{instance}` (the id of
    versions with one producer, so an upgraded instance fences its predecessor), then
    `{group}-{instance}#1`. Instance ids may not contain `#` (`Settings`), so no
    instance's ids are another's."""
    base = f"{group}-{instance}"
    return [base if n == 0 else f"{base}{PRODUCER_MARK}{n}" for n in range(PRODUCERS)]


def default_instance_id() -> str:
    """Stable across restarts on one host, so a restart fences its own predecessor."""
    return socket.gethostname()


class TransactionalProcessor(Recovery):
    """Runs the decider over the three input topics; one instance per process."""

    def __init__(
        self,
        settings: Settings,
        *,
        instance_id: str | None = None,
        config: DeciderConfig | None = None,
        batch_size: int | None = None,
        clock: Any = time.time,
    ) -> None:
        self.settings = settings
        self.instance_id = check_instance_id(
            instance_id or settings.processor_instance or default_instance_id()
        )
        self.codec = Codec()
        #: input topic -> the class of commands it may carry
        self.classes = input_classes(settings)
        self.config = config or decider_config(settings)
        self.batch_size = batch_size or settings.processor_batch_size
        self.linger_s = settings.processor_linger_ms / 1000
        self._last_begin = 0.0
        self.clock = clock
        self.observer = StatsObserver(clock)
        self.partitions: dict[int, PartitionState] = {}
        self.ready = threading.Event()
        self._step: CommandStep | None = None
        #: the CloudEvents headers of the events (made once the registry ids are known)
        self._cloudevents: CloudEventHeaders | None = None
        #: the transactional producers, used in turn; `_slot` runs the next transaction
        self._producers: list[TransactionalProducer] = []
        self._slot = 0
        self._stop, self._consumer = threading.Event(), None  # the stop: run()'s, once it runs
        self._renewed_at, self._timeouts = {}, {}  # per slot (`failures.Recovery`)
        self._born: dict[int, float] = {}  # slot -> when its producer was made
        self._consumer_renewed_at = self._unassigned_since = self._lost_at = None
        self._rejoin_asked_at = 0.0  # `failures.Recovery._watch_rejoin`
        self._group_log = GroupLog()
        self._forward_logged_at = 0.0
        #: the transaction committing on its own thread while the next batch is decided
        self._inflight: TransactionCommit[Batch] | None = None
        #: the transaction before `_inflight`, still committing (its records are in, but
        #: its outcome records perhaps: `_inflight` produces its own after those)
        self._older: TransactionCommit[Batch] | None = None
        self._waited = 0.0  # for `_inflight`'s records: a part of its `wait` phase
        self.store_base: Path = settings.store_path / settings.processor_group / self.instance_id
        self._block_cache = rocksdict.Cache(BLOCK_CACHE_BYTES)
        self.last_restore: RestoreReport | None = None

    @property
    def stats(self) -> ProcessorStats:
        return self.observer.stats

    # -- setup ------------------------------------------------------------------------------
    def _now(self) -> int:
        return int(self.clock() * 1000)

    def start(self, stop: threading.Event | None = None) -> None:
        """Create/verify topics, fence predecessors, join the group. Raises on bad topics;
        raises Stopping when `stop` is set while the transaction coordinator is awaited."""
        s = self.settings
        if stop is not None:
            self._stop = stop
        ensure_topics(s)
        counts = check_topics(s, dedup_ttl_ms=self.config.dedup_ttl_ms).partitions
        # the ids of this version's schemas, once: a re-emitted event is byte-identical
        attach_registry(
            self.codec,
            s,
            writes=("command", "event", "outcome"),
            stop=self._stop,
            patience_s=START_PATIENCE_S,
        )
        self._cloudevents = CloudEventHeaders(
            s.events_topic, s.schema_registry_url, self.codec.schema_ids()["event"]
        )
        self._step = CommandStep(self.codec, self.config, partitions=counts[s.commands_topic])
        # one patience for all of them: a cold broker's coordinators are awaited once
        deadline = time.monotonic() + START_PATIENCE_S
        self._producers = []
        try:
            for slot in range(PRODUCERS):
                left = max(0.0, deadline - time.monotonic())
                self._producers.append(self._transactional_producer(slot, patience_s=left))
        except BaseException:
            self._release()  # the producers already up leave nothing behind
            raise
        self._consumer = self._group_consumer()

    def _group_consumer(self) -> GroupConsumer:
        """Our member of the processor group, subscribed to the three input topics."""
        s = self.settings
        consumer = new_group_consumer(
            s,
            s.processor_group,
            **{
                "client.id": self._member,
                # static membership: a restarted instance gets its partitions back at
                # once instead of after the dead member's session timeout; a second
                # process with the same instance id is fenced by the coordinator
                "group.instance.id": self._member,
                "max.poll.interval.ms": MAX_POLL_INTERVAL_MS,
                # a command appended answers a parked fetch at once: the wait only sets
                # how often an idle consumer asks
                "fetch.wait.max.ms": LIVE_FETCH_WAIT_MS,
                "logger": self._group_log,
            },
        )
        consumer.subscribe(list(self.classes), **self._callbacks())
        return consumer

    def _transactional_producer(self, slot: int, patience_s: float = 0.0) -> TransactionalProducer:
        """The producer of `slot`, with its stable transactional id; `init_transactions`
        fences (and aborts the open transaction of) any earlier producer with that id.
        Retriable answers are asked again until `patience_s` has passed."""
        s = self.settings
        tid = transactional_ids(s.processor_group, self.instance_id)[slot]
        self._born[slot] = time.monotonic()
        return init_transactions(
            lambda: new_transactional_producer(s, tid),
            patience_s,
            bootstrap=s.kafka_bootstrap,
            stop=self._stop,
        )

    # -- rebalance --------------------------------------------------------------------------
    def _on_assign(self, consumer: GroupConsumer, partitions: list[TopicPartition]) -> None:
        self._settle_all()  # our transactions first: their offsets count below
        numbers = co_partitioned([(tp.topic, tp.partition) for tp in partitions], self.classes)
        # Step 1: committed offsets (stable: waits out a predecessor's pending transaction)
        committed = consumer.committed(partitions, timeout=60)
        # Step 2: state of each partition, read to its end (one reader for all of them)
        restored, report = restore(
            self.settings,
            numbers,
            self.config,
            self.codec,
            base=self.store_base,
            cache_sessions=self.settings.state_cache_sessions,
            block_cache=self._block_cache,
        )
        self.last_restore = report
        for p, part in restored.items():
            old = self.partitions.pop(p, None)
            if old is not None:  # assigned again without a revoke in between
                metrics.ACTIVE_RUNS.dec(old.active)
                old.close()
            self.partitions[p] = part
            metrics.ACTIVE_RUNS.inc(part.active)
        # Step 3: consume from the committed offsets (or the beginning)
        start = [
            TopicPartition(
                tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            )
            for tp in committed
        ]
        consumer.assign(start)
        log.info("assigned %s", numbers)
        self.ready.set()

    def _on_revoke(self, consumer: GroupConsumer, partitions: list[TopicPartition]) -> None:
        # the transactions in flight end (commit or abort) before the partitions go
        self._settle_all()
        for tp in partitions:
            gone = self.partitions.pop(tp.partition, None)
            if gone is not None:
                metrics.ACTIVE_RUNS.dec(gone.active)
                gone.close()
        log.info("revoked %s", sorted({tp.partition for tp in partitions}))

    # -- the loop ---------------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None) -> None:
        """Process until `stop` is set (or forever). While batch N's transaction commits,
        N+1 is polled and decided on top of N's decisions; it begins once N's records are
        acknowledged, all but N's outcome records (under light load taking in what arrived
        meanwhile), produces its own outcome records after N's, commits once N committed,
        and is given up, both read again, if N fails."""
        if self._consumer is None:
            try:
                self.start(stop)
            except Stopping as e:
                log.info("processor stopped before it started: %s", e)
                return
        assert self._consumer is not None and self._step is not None
        step = self._step
        stop = self._stop = stop or threading.Event()
        failed = True
        try:
            while not stop.is_set():
                # two transactions in flight: the older one ends first (the next batch is
                # decided on top of the newer one, over stores that hold the older one)
                if self._older is not None and not self._settle():
                    continue  # it failed: the newer one was given up too, both read again
                messages = self._poll()
                if messages is None:
                    continue
                base = self._inflight.batch if self._inflight is not None else None
                timers = self._due_timers(base)
                if not messages and not timers:
                    self._settle_all()
                    continue
                t0 = time.perf_counter()
                batch = decide_batch(step, messages, timers, self.partitions, base, self.classes)
                decided = time.perf_counter() - t0
                if self._inflight is not None:
                    if not self._appended(also=batch):
                        continue  # it failed: this batch, decided on top of it, is read again
                    if len(messages) < min(LIGHT_BATCH, self.batch_size):
                        # light load: what arrived meanwhile joins this batch
                        committing = self._inflight.batch
                        more = self._more(self.batch_size - len(batch.messages))
                        if more is None:
                            continue  # consumer renewed: its partitions are read again
                        if more:
                            t0 = time.perf_counter()
                            # on top of this batch, then the one still committing (the
                            # stores have neither yet)
                            bases = (batch, committing)
                            batch.absorb(
                                decide_batch(step, more, [], self.partitions, bases, self.classes)
                            )
                            decided += time.perf_counter() - t0
                self._begin(batch, decided)
            failed = False
        except Stopping as e:
            # the producer failed and no new one could start: nothing in flight can commit
            log.info("%s", e)
            self._inflight = self._older = None
            failed = False
        finally:
            self._shutdown(quiet=failed)

    def _shutdown(self, *, quiet: bool) -> None:
        """The transaction in flight ends (commits or aborts), then everything is closed,
        whatever that transaction did. `quiet` (the loop is failing already): its error is
        logged, not raised, so the loop's own error is the one reported."""
        try:
            self._settle_all()
        except Exception:
            if not quiet:
                raise
            log.warning("the transaction in flight at the stop failed too", exc_info=True)
        finally:
            self.close()

    def _poll(self) -> list[Message] | None:
        """The next batch (up to `batch_size`); waits a little only when nothing commits,
        and gathers until `processor_linger_ms` after the last transaction began."""
        self._watch_rejoin()
        assert self._consumer is not None
        consumer, size = self._consumer, self.batch_size
        first = consumer.poll(0 if self._inflight is not None else 0.05)
        batch: list[Message] = [first] if first is not None else []
        if first is not None:
            batch += consumer.consume(size - 1, timeout=0)
            until = self._last_begin + self.linger_s
            while len(batch) < size and (left := until - time.perf_counter()) > 0:
                batch += consumer.consume(size - len(batch), timeout=left)
        return self._records(batch)

    def _more(self, n: int) -> list[Message] | None:
        """Up to `n` more records already fetched (no wait); None if the consumer failed."""
        assert self._consumer is not None
        if n <= 0:
            return []
        consumed = self._consumer.consume(n, timeout=0)
        return self._records(consumed)

    def _records(self, consumed: list[Message]) -> list[Message] | None:
        """The records among what was consumed; None if the consumer failed (renewed)."""
        try:
            return data_messages(consumed, log)
        except KafkaFailed as e:
            self._renew_consumer(e)
            return None

    def _due_timers(self, base: Batch | None) -> list[tuple[int, Command]]:
        now = self._now()
        empty = Batch([], [])
        bases = () if base is None else (base,)
        return [
            (p, cmd)
            for p, part in self.partitions.items()
            for cmd in part.timers.due(now, View(p, part, empty, bases).state)
        ]

    def _begin(self, batch: Batch, decided: float) -> None:
        """Steps 1-2: open the transaction, hand it every record of the batch; then the
        commit (steps 3-4) goes on on its own thread. The producers take turns."""
        assert self._producers and self._consumer is not None
        # never the in-flight transaction's producer (a failed begin brings the turn back)
        n = len(self._producers)
        slot = self._slot if self._inflight is None else (self._inflight.slot + 1) % n
        self._slot = (slot + 1) % n
        producer = self._producers[slot]
        clock = time.perf_counter
        commit = TransactionCommit(
            batch,
            slot,
            # commands were read: each gets its outcome record (a batch of fired timers only
            # has none to give, and needs no wait for its deliveries)
            functools.partial(
                outcome_records,
                batch,
                self.codec,
                self._dead_ids,
                f"/sessionstream/{self.settings.outcomes_topic}".encode(),
            )
            if batch.outcomes
            else None,
            self.settings.outcomes_topic,
            after=self._inflight,
            # within half the transaction timeout, past which the coordinator fences it
            after_limit_s=self.settings.transaction_timeout_ms / 2000,
        )
        commit.phases["decide"] = decided
        t0 = self._last_begin = clock()
        try:
            # Step 1: open the transaction
            producer.begin_transaction()
            t1 = clock()
            # Step 2: the events, changelogs (states, open runs, command ids), fired
            # timers, dead letters and forwarded records
            produce(
                producer,
                self.settings,
                self.codec,
                batch,
                commit.on_delivery,
                self._cloudevents,
            )
            produce_misfits(producer, self.settings, batch)
            if batch.forwards:
                self._forwarded(batch.forwards)
            metadata = self._consumer.consumer_group_metadata()
        except KafkaFailed as e:
            self._abort(e, batch, slot)
            return
        commit.phases["begin"], commit.phases["produce"] = t1 - t0, clock() - t1
        offsets = [TopicPartition(t, p, o) for (t, p), o in batch.offsets.items()]
        commit.start(producer, offsets, metadata)
        self._older, self._inflight = self._inflight, commit

    def _settle_all(self) -> None:
        """Wait for every transaction in flight, oldest first."""
        while self._inflight is not None:
            self._settle()

    def _appended(self, also: Batch) -> bool:
        """Wait until the records of the transaction in flight are acknowledged, all but
        its outcome records (`first_round`): the next one (`also`, decided on top of it)
        may then produce while it commits (its own outcome records follow that one's). If
        it failed before that, it is settled: aborted, and `also` read again with it
        (False)."""
        commit = self._inflight
        assert commit is not None
        t0 = time.perf_counter()
        commit.first_round.wait(commit.left())
        self._waited = time.perf_counter() - t0
        if commit.first_round.is_set() and (commit.committed or not commit.done()):
            return True
        return self._settle(also=also)

    def _settle(self, also: Batch | None = None) -> bool:
        """Wait for the oldest transaction in flight. Committed: step 5, its states and
        command ids go to the partitions' stores. Failed: aborted, and its batch read again
        with everything decided on top of it — the newer transaction in flight (given up:
        it waits for this one and aborts) and `also`. Returns whether it committed."""
        newer: TransactionCommit[Batch] | None = None
        if self._older is not None:
            commit, newer = self._older, self._inflight
            self._older = None
        else:
            assert self._inflight is not None
            commit, self._inflight = self._inflight, None
        clock = time.perf_counter
        t0 = clock()
        error = commit.wait()
        waited = clock() - t0
        if error is not None:
            later = [] if also is None else [also]
            if newer is not None:
                self._inflight = None
                self._give_up(newer)
                later.insert(0, newer.batch)
            committed = self._abort(error, commit.batch, commit.slot, also=later, commit=commit)
            return committed and not later
        t1 = clock()
        self._timeouts[commit.slot] = 0
        self._committed(commit)
        commit.phases["wait"] = waited + self._waited
        self._waited = 0.0
        commit.phases["store"] = clock() - t1
        self.observer.phases(**commit.phases)
        return True

    def _committed(self, commit: TransactionCommit[Batch]) -> None:
        """Step 5: only now does the partition's state move on: its store gets the
        transaction's states and dedup records with the changelog offsets they reach
        (delivery reports are served by commit_transaction; one missing leaves the
        checkpoint behind, which only lengthens the next restore's tail)."""
        s, batch = self.settings, commit.batch
        forgotten = batch.forgotten_by_partition()
        for p in batch.records.keys() | batch.dedup.keys() | forgotten.keys():
            owner = self.partitions.get(p)
            if owner is not None:
                delta = owner.commit(
                    batch.records.get(p, ()),
                    batch.dedup.get(p, ()),
                    commit.delivered.get((s.state_topic, p)),
                    commit.delivered.get((s.outcomes_topic, p)),
                    forgotten.get(p, ()),
                )
                if delta:
                    metrics.ACTIVE_RUNS.inc(delta)
        self.observer.committed(batch.outcomes, len(batch.timers))

    def _dead_ids(self, msg: Message) -> tuple[str | None, str | None]:
        """(session id, command id) of a record that could not be decided, if readable."""
        return self.codec.peek_ids(msg.value() or b"")

    def _forwarded(self, forwards: list[tuple[Message, int]]) -> None:
        """Count the commands forwarded to their murmur2 partition; say so (at most every
        10 s) with what to fix in their producer."""
        for msg, partition in forwards:
            count = self.observer.forwarded()
            now = time.monotonic()
            if now - self._forward_logged_at > 10.0:
                self._forward_logged_at = now
                topic, source, _ = coords(msg)
                log.warning(
                    "command for session %r found on %s[%s] belongs on partition %s: "
                    "forwarded. Its producer does not place keys with murmur2 (librdkafka "
                    "clients need partitioner=murmur2_random); %s commands forwarded so far",
                    (msg.key() or b"").decode(errors="replace"),
                    topic,
                    source,
                    partition,
                    count,
                )

    def close(self) -> None:
        try:
            self._settle_all()
        finally:
            self._release()

    def _release(self) -> None:
        """Consumer, stores and producers closed, whatever fails on the way."""
        if self._consumer is not None:
            with contextlib.suppress(KafkaFailed, SystemError, RuntimeError):
                self._consumer.close()
            self._consumer = None
        for part in self.partitions.values():
            part.close()
        self.partitions.clear()
        for producer in self._producers:
            # a fatal producer cannot flush (a fenced one says so through the adapter's
            # translation): the error that stops the processor is the one to report
            with contextlib.suppress(KafkaFailed, SystemError):
                producer.flush(5)
        self._producers = []
