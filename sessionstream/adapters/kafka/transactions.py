"""Kafka transactions for a consume-decide-produce loop: the producer's set-up, one
transaction's commit on a thread of its own, its abort, and what librdkafka's answers mean
(a coordinator still loading, a newer producer with our transactional id, our own static
member timing out). The processor (`sessionstream.runtimes.processor.loop`) decides what to do
about them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from sessionstream.adapters.kafka.clients import TransactionalProducer
from sessionstream.adapters.kafka.config import KAFKA_LOG
from sessionstream.adapters.kafka.errors import COORDINATOR_BUSY, FENCING, failure
from sessionstream.errors import KafkaFailed, KafkaUnavailable, SessionstreamError

__all__ = [
    "ABORT_LIMIT_S",
    "COMMIT_LIMIT_S",
    "COORDINATOR_BUSY",
    "FENCING",
    "RENEW_WINDOW_S",
    "SELF_FENCE_S",
    "SEND_OFFSETS_LIMIT_S",
    "AbortFailed",
    "GroupLog",
    "Stopping",
    "TransactionCommit",
    "abort_transaction",
    "consumer_fence_is_foreign",
    "init_transactions",
    "stable_offsets",
    "static_members",
]

log = logging.getLogger("sessionstream.adapters.kafka")

#: a producer fenced again this soon after being replaced means a second live instance
RENEW_WINDOW_S = 60.0
#: a consumer fenced this soon after librdkafka reported its own session timeout fenced
#: itself (librdkafka#3437: it rejoins under a new member id and the coordinator fences the
#: old one); seen 0-2.5 s apart on the 3-node cluster, so 5 session timeouts is generous
SELF_FENCE_S = 30.0
#: longest wait for send_offsets_to_transaction before the producer is given up
SEND_OFFSETS_LIMIT_S = 30.0
#: how long abort_transaction may keep timing out before the producer is renewed
ABORT_LIMIT_S = 30.0
#: commit_transaction's own timeout (a retriable error is retried within the same bound)
COMMIT_LIMIT_S = 30.0


class Stopping(SessionstreamError):
    """Asked to stop while waiting for a transaction coordinator that does not answer."""


def init_transactions(
    make: Callable[[], TransactionalProducer],
    patience_s: float,
    *,
    bootstrap: str,
    stop: threading.Event | None = None,
) -> TransactionalProducer:
    """A producer from `make`, its transactions initialised. Retriable answers (a restarted
    broker still loading its transaction coordinator, a timeout) are asked again until
    `patience_s` has passed — by the same producer when librdkafka marks the error
    retriable (it allows calling init_transactions again then), else by a new one; after
    that, or on any other error, KafkaUnavailable. While patient it asks in 10 s steps and
    raises Stopping once `stop` is set."""
    deadline = time.monotonic() + patience_s
    producer = make()
    said = 0.0
    while True:
        try:
            producer.init_transactions(60 if patience_s <= 0 else 10)
            return producer
        except KafkaFailed as e:
            now = time.monotonic()
            retriable = not e.fatal and e.retriable
            if not (retriable or e.coordinator_busy) or now >= deadline:
                raise KafkaUnavailable(f"init_transactions failed: {e}", bootstrap=bootstrap) from e
            if stop is not None and stop.is_set():
                raise Stopping("stopped while waiting for the transaction coordinator") from e
            if now - said >= 30:
                said = now
                log.warning(
                    "init_transactions: %s; asking again (%.0fs left)", e.reason, deadline - now
                )
            if not retriable:
                producer = make()


@dataclass(frozen=True)
class AbortFailed:
    """abort_transaction could not finish: the producer is to be replaced by a new one with
    its transactional id (whose init_transactions aborts for it). `stuck`: it did not fail,
    it only kept timing out (no sign of a second instance)."""

    error: KafkaFailed
    stuck: bool = False


def abort_transaction(producer: TransactionalProducer, *, bootstrap: str) -> AbortFailed | None:
    """Abort the producer's open transaction: None once aborted; AbortFailed when the
    producer failed fatally, or kept timing out for `ABORT_LIMIT_S` (after a broker restart
    librdkafka's coordinator request can stay queued for good). Any other error that is not
    retriable: KafkaUnavailable."""
    deadline = time.monotonic() + ABORT_LIMIT_S
    while True:
        try:
            producer.abort_transaction(10)
            return None
        except KafkaFailed as e:
            if e.fatal:
                return AbortFailed(e)
            if not e.retriable:
                raise KafkaUnavailable(
                    f"processor could not abort its transaction: {e.reason}", bootstrap=bootstrap
                ) from e
            if time.monotonic() > deadline:
                return AbortFailed(e, stuck=True)
            log.warning("abort_transaction: %s; retrying", e.reason)


def stable_offsets(
    config: dict[str, Any],
    group: str,
    partitions: list[tuple[str, int]],
    limit_s: float,
    *,
    bootstrap: str,
) -> dict[tuple[str, int], int]:
    """The group's committed offsets of `partitions` (-1: none), stable (KIP-447: a pending
    transactional offset commit is waited out), asked by an admin client: no group member
    is needed, so a consumer in the middle of a rebalance cannot hold the answer back (its
    own `committed()` waited for 2 minutes after a broker restart). `config`: the
    client's (bootstrap, security). Timeouts are asked again until `limit_s`; then
    KafkaUnavailable."""
    deadline = time.monotonic() + limit_s
    admin = AdminClient(config)
    request = [ConsumerGroupTopicPartitions(group, [TopicPartition(t, p) for t, p in partitions])]
    said: set[str] = set()  # each distinct error is logged once, not every half second
    while True:
        try:
            futures = admin.list_consumer_group_offsets(
                request, require_stable=True, request_timeout=10
            )
            answer = futures[group].result(timeout=15)
            out: dict[tuple[str, int], int] = {}
            for tp in answer.topic_partitions or []:
                if tp.error is not None:
                    raise KafkaException(tp.error)
                out[(tp.topic, tp.partition)] = tp.offset
            return out
        except Exception as e:  # KafkaException, or the future's TimeoutError
            if time.monotonic() > deadline:
                raise KafkaUnavailable(
                    f"cannot read the committed offsets of group {group!r}: {e}",
                    bootstrap=bootstrap,
                ) from e
            text = str(e)
            if text not in said:
                said.add(text)
                log.warning("committed offsets of group %r: %s; asking again", group, text)
            time.sleep(0.5)


def static_members(
    config: dict[str, Any], group: str, *, timeout_s: float = 10.0
) -> set[str] | None:
    """The group.instance.ids of `group`'s members as its coordinator lists them (a member
    that sent JoinGroup is listed while the group rebalances); None when the coordinator
    does not answer within `timeout_s` (a broker still restarting). `config`: the client's."""
    admin = AdminClient(config)
    try:
        found = admin.describe_consumer_groups([group], request_timeout=timeout_s)[group]
        described = found.result(timeout=timeout_s + 5)
    except Exception as e:  # KafkaException, or the future's TimeoutError
        log.info("cannot describe group %r: %s", group, e)
        return None
    return {m.group_instance_id for m in described.members if m.group_instance_id}


class GroupLog:
    """The group consumer's librdkafka logger: each line goes to `sessionstream.adapters.kafka` as
    for every client, and the time of the consumer's last own session timeout (facility
    SESSTMOUT) is kept: a fence that follows one is the consumer's own doing."""

    def __init__(self) -> None:
        self.session_timeout_at: float | None = None

    def log(self, level: int, msg: str, *args: Any) -> None:
        if args and args[0] == "SESSTMOUT":
            self.session_timeout_at = time.monotonic()
        KAFKA_LOG.log(level, msg, *args)


def consumer_fence_is_foreign(
    now: float, renewed_at: float | None, session_timeout_at: float | None
) -> bool:
    """Whether a fatal fence of our static member means a second live instance with our
    group.instance.id. Not when the consumer's own session timed out within
    `SELF_FENCE_S` (librdkafka#3437, any number of times: each broker fault can cause
    one); otherwise yes when the consumer was already renewed within `RENEW_WINDOW_S` (two
    instances fence each other back and forth)."""
    if session_timeout_at is not None and now - session_timeout_at < SELF_FENCE_S:
        return False
    return renewed_at is not None and now - renewed_at < RENEW_WINDOW_S


B = TypeVar("B")


class TransactionCommit(Generic[B]):
    """The end of one transaction on a thread of its own: the input offsets join it
    (`send_offsets_to_transaction`, KIP-447), then the records made from the delivery
    reports of those already produced (`follow`; after those of `after`, the transaction
    before this one), then it commits. The thread also serves
    the delivery reports (commit_transaction flushes). `batch` is the caller's, carried
    along; `slot`: which of the caller's producers runs the transaction."""

    def __init__(
        self,
        batch: B,
        slot: int,
        follow: Callable[[], list[tuple[int, bytes, bytes, Any]]] | None = None,
        follow_topic: str = "",
        after: TransactionCommit[Any] | None = None,
        after_limit_s: float = COMMIT_LIMIT_S,
    ) -> None:
        self.batch = batch
        self.slot = slot
        #: when the transaction was made (just before it begins)
        self.begun_at = time.monotonic()
        #: longest wait for `after`, counted from `begun_at`: the coordinator aborts (and
        #: fences) a transaction open past transaction.timeout.ms, so give it up before
        self.after_limit_s = after_limit_s
        #: the transaction (of another producer) this one was decided on top of: its
        #: records and offsets may go out while that one commits, but this one commits only
        #: once that one did, and aborts if it did not
        self.after = after
        #: past this many seconds from `begun_at` the commit is taken for stuck: its own
        #: steps' bounds, and the wait for `after` when there is one. Counted from the
        #: start, not per wait: waiting first for `appended` and then for the end, each
        #: with the whole bound, let a commit stuck in send_offsets hold the processor
        #: twice as long (120 s, past max.poll.interval.ms: seen after a broker restart)
        self.limit_s = (
            SEND_OFFSETS_LIMIT_S + COMMIT_LIMIT_S + (after_limit_s if after is not None else 0.0)
        )
        #: set once every record of the transaction is acknowledged (the commit is next),
        #: or once the commit ended whichever way
        self.appended = threading.Event()
        #: set once the records produced before `follow`'s are acknowledged (or once the
        #: commit ended whichever way): the next transaction may produce then — its own
        #: `follow` records wait for `appended` of this one, so every topic keeps the
        #: transactions' order
        self.first_round = threading.Event()
        #: set by the caller to give the transaction up while it waits for `after`
        self.cancel = threading.Event()
        #: records (partition, key, value, headers) for `follow_topic`, made once the
        #: transaction's records so far are acknowledged
        self.follow = follow
        self.follow_topic = follow_topic
        #: (topic, partition) -> next offset after the records the transaction delivered
        self.delivered: dict[tuple[str, int], int] = {}
        self.phases: dict[str, float] = {}
        self.error: KafkaFailed | None = None
        #: anything else the commit raised: its outcome is unknown (`wait` raises it)
        self.failure: BaseException | None = None
        self.committed = False
        #: where the commit thread is: "send_offsets", "flush", "commit" (said if stuck)
        self.step = "start"
        self._done = threading.Event()

    def on_delivery(self, err: KafkaFailed | None, msg: Message) -> None:
        if err is None:
            topic, p, offset = msg.topic() or "", msg.partition() or 0, msg.offset() or 0
            if offset + 1 > self.delivered.get((topic, p), 0):
                self.delivered[(topic, p)] = offset + 1

    def start(
        self, producer: TransactionalProducer, offsets: list[TopicPartition], metadata: Any
    ) -> None:
        threading.Thread(
            target=self._run, args=(producer, offsets, metadata), name="commit", daemon=True
        ).start()

    def _run(
        self, producer: TransactionalProducer, offsets: list[TopicPartition], metadata: Any
    ) -> None:
        clock = time.perf_counter
        try:
            t0 = clock()
            # the input offsets join the transaction — first, so that its two round
            # trips (AddOffsetsToTxn, TxnOffsetCommit) overlap the records' own produce
            # requests, which the follow-up records wait for
            if offsets:
                self.step = "send_offsets"
                producer.send_offsets_to_transaction(offsets, metadata, SEND_OFFSETS_LIMIT_S)
            t1 = clock()
            # records made from the delivery reports: those are waited for first
            if self.follow is not None:
                self.step = "flush"
                left = producer.flush(COMMIT_LIMIT_S)
                if left:
                    raise failure(
                        KafkaError(
                            KafkaError._TIMED_OUT,
                            f"{left} records of the transaction not delivered",
                        )
                    )
                # the next transaction's records may follow these; its follow-up records
                # wait for ours (below)
                self.first_round.set()
                if self.after is not None:
                    self.step = "after's follow-up records"
                    self._wait(self.after.appended)
                put = producer.produce
                topic = self.follow_topic
                records = self.follow()
                # the last record of each partition reports its offset (`delivered`: a
                # store's checkpoint may be one of this topic)
                last = {r[0]: i for i, r in enumerate(records)}
                for i, (p, key, value, headers) in enumerate(records):
                    if last[p] == i:
                        put(
                            topic,
                            key=key,
                            value=value,
                            partition=p,
                            headers=headers,
                            on_delivery=self.on_delivery,
                        )
                    else:
                        put(topic, key=key, value=value, partition=p, headers=headers)
            # every record acknowledged (commit_transaction would wait for them anyway):
            # the next transaction's follow-up records may follow ours
            self.step = "flush"
            if producer.flush(COMMIT_LIMIT_S):
                raise failure(KafkaError(KafkaError._TIMED_OUT, "records not delivered"))
            self.first_round.set()
            self.appended.set()
            t2 = clock()
            if self.after is not None:
                self.step = "after"
                self._wait_after(self.after)
            t3 = clock()
            self.step = "commit"
            # commit — everything produced and the offsets at once; a retriable error
            # (broker restarting, coordinator moving) is retried
            while True:
                try:
                    producer.commit_transaction(COMMIT_LIMIT_S)
                    break
                except KafkaFailed as e:
                    if e.fatal or e.requires_abort or not e.retriable:
                        raise
                    log.warning("commit_transaction: %s; retrying", e.reason)
            self.phases["send_offsets"], self.phases["outcomes"] = t1 - t0, t2 - t1
            self.phases["after"], self.phases["commit"] = t3 - t2, clock() - t3
            self.committed = True
        except KafkaFailed as e:
            self.error = e
        except BaseException as e:  # never "committed" by default: the waiter raises it
            self.failure = e
        finally:
            self.first_round.set()
            self.appended.set()
            self._done.set()

    def _wait(self, event: threading.Event) -> None:
        """Until `event` (of the transaction before this one) is set, or we are given up;
        past `after_limit_s` from our start this one must abort (an error that requires
        it: the coordinator would abort it soon anyway)."""
        deadline = self.begun_at + self.after_limit_s
        while not event.wait(0.2) and not self.cancel.is_set():
            if time.monotonic() > deadline:
                raise failure(
                    KafkaError(
                        KafkaError._STATE,
                        f"the transaction before this one did not commit within "
                        f"{self.after_limit_s:.0f} s of this one's start",
                        txn_requires_abort=True,
                    )
                )

    def _wait_after(self, after: TransactionCommit[Any]) -> None:
        """Until the transaction before this one committed; it did not (or we are given
        up): this one must abort (an error that requires it)."""
        self._wait(after._done)
        if self.cancel.is_set() or not after.committed:
            raise failure(
                KafkaError(
                    KafkaError._STATE,
                    "the transaction this one was decided on top of did not commit",
                    txn_requires_abort=True,
                )
            )

    def age(self) -> float:
        """Seconds since the transaction was made."""
        return time.monotonic() - self.begun_at

    def left(self) -> float:
        """Seconds until the commit is taken for stuck (`limit_s` from its start)."""
        return max(0.0, self.limit_s - self.age())

    def done(self) -> bool:
        """Whether the commit thread has ended (committed or not)."""
        return self._done.is_set()

    def wait(self, limit_s: float | None = None) -> KafkaFailed | None:
        """The commit's error, if any. After a broker restart librdkafka can block in
        send_offsets_to_transaction forever, its timeout notwithstanding (librdkafka#5456,
        #5511): past `limit_s` (by default: until `limit_s` seconds from the start, see
        `left`) the producer is given up as fatally failed, and a new one with our
        transactional id fences it. The stuck call keeps its thread. Anything but
        a KafkaFailed leaves the commit's outcome unknown: it is raised (a restart
        restores what was committed)."""
        if not self._done.wait(self.left() if limit_s is None else limit_s):
            return failure(
                KafkaError(
                    KafkaError._TIMED_OUT,
                    f"transaction commit stuck (in {self.step})",
                    fatal=True,
                )
            )
        if self.error is not None:
            return self.error
        if not self.committed:  # neither committed nor a Kafka error: outcome unknown
            raise RuntimeError(
                f"the transaction's commit failed unexpectedly: {self.failure!r}"
            ) from self.failure
        return None
