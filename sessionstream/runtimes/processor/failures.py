"""What the processor does when a transaction or its consumer fails: abort (or renew the
producer) and read the batches again, find out whether a commit it was told failed went
through after all, give up the transaction decided on top of a failed one, and renew a
fenced consumer. A part of `TransactionalProcessor` (`loop.py`), which provides the state
and the set-up methods declared here."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING

from sessionstream.adapters import metrics
from sessionstream.adapters.kafka import (
    GroupConsumer,
    RebalanceCallback,
    TopicPartition,
    TransactionalProducer,
    client_config,
    close_in_background,
)
from sessionstream.adapters.kafka.transactions import (
    RENEW_WINDOW_S,
    GroupLog,
    TransactionCommit,
    abort_transaction,
    consumer_fence_is_foreign,
    stable_offsets,
    static_members,
)
from sessionstream.errors import KafkaFailed, KafkaUnavailable, SingleWriterViolation
from sessionstream.runtimes.processor.batch import Batch
from sessionstream.runtimes.processor.partition import PartitionState
from sessionstream.runtimes.processor.stats import StatsObserver
from sessionstream.schemas.commands import CommandClass
from sessionstream.settings import Settings

__all__ = ["OUTCOME_LIMIT_S", "REJOIN_CHECK_S", "RENEW_PATIENCE_S", "WEDGED_AFTER", "Recovery"]

log = logging.getLogger("sessionstream.processor")

#: how long a producer that replaces a failed one may keep getting retriable answers to
#: init_transactions (a restarted broker still loading its transaction coordinator) before
#: the processor gives up
RENEW_PATIENCE_S = 600.0
#: how long the group coordinator may take to say whether a failed transaction committed
OUTCOME_LIMIT_S = 120.0
#: transactions in a row that time out on one producer before it is replaced (`_wedged`)
WEDGED_AFTER = 3
#: how long the consumer may go without an assignment after a revoke before the group's
#: coordinator is asked whether it is a member at all, and then between two such questions
#: (`_watch_rejoin`): five session timeouts, past the coordinator's own expiry of a member
#: that stopped heartbeating
REJOIN_CHECK_S = 30.0


class Recovery:
    """The failure paths of `TransactionalProcessor`."""

    settings: Settings
    instance_id: str
    classes: dict[str, CommandClass]
    partitions: dict[int, PartitionState]
    observer: StatsObserver
    _producers: list[TransactionalProducer]
    _consumer: GroupConsumer | None
    _inflight: TransactionCommit[Batch] | None
    _older: TransactionCommit[Batch] | None
    #: slot -> when its producer was made (`_renew_siblings`)
    _born: dict[int, float]
    #: slot -> when its producer was last renewed (a fence is judged per transactional id)
    _renewed_at: dict[int, float]
    _consumer_renewed_at: float | None
    #: since when the consumer has held no partitions after a revoke (None: assigned)
    _unassigned_since: float | None
    #: when `_watch_rejoin` last asked the coordinator
    _rejoin_asked_at: float
    #: when the consumer last lost its partitions, until its producers are renewed
    _lost_at: float | None
    _group_log: GroupLog
    #: slot -> transactions in a row that timed out (`_wedged`)
    _timeouts: dict[int, int]

    if TYPE_CHECKING:  # provided by the processor (`loop.TransactionalProcessor`)

        def _transactional_producer(
            self, slot: int, patience_s: float = 0.0
        ) -> TransactionalProducer: ...

        def _group_consumer(self) -> GroupConsumer: ...

        def _on_revoke(self, consumer: GroupConsumer, partitions: list[TopicPartition]) -> None: ...

        def _on_assign(self, consumer: GroupConsumer, partitions: list[TopicPartition]) -> None: ...

        def _committed(self, commit: TransactionCommit[Batch]) -> None: ...

    def _give_up(self, commit: TransactionCommit[Batch]) -> None:
        """The transaction before `commit` failed: `commit` (which waits for it, and never
        commits without it) ends and its transaction is aborted — or its producer renewed,
        whose init_transactions aborts it. Its batch is the caller's to read again."""
        commit.cancel.set()
        error = commit.wait()
        if error is None:
            # it commits only after the one before committed, and never once given up: the
            # one before was reported failed as it committed (a wait that ran out just
            # then). Both committed; the stores have neither: a restart restores them
            raise RuntimeError(
                "a transaction committed while the one before it was taken for failed"
            )
        if error.fatal:
            self._renew_producer(error, commit.slot, stuck=self._timed_out(error, commit))
            return
        self.observer.aborted()
        failed = abort_transaction(
            self._producers[commit.slot], bootstrap=self.settings.kafka_bootstrap
        )
        if failed is not None:
            self._renew_producer(failed.error, commit.slot, stuck=failed.stuck)

    def _abort(
        self,
        error: KafkaFailed,
        batch: Batch,
        slot: int,
        *,
        also: list[Batch] | None = None,
        commit: TransactionCommit[Batch] | None = None,
    ) -> bool:
        """The transaction of producer `slot` failed: abort it (or renew a fatally failed
        producer) and read `batch` (and `also`, decided on top of it) again from their first
        offsets; their fired timers are due again. `commit`: the transaction had reached its
        commit, which may have gone through although we were told otherwise (a commit stuck
        in librdkafka after a broker restart can be the coordinator's committed transaction;
        the new producer's init_transactions then completes it): the group's committed
        offsets say which, and a transaction that committed after all counts as committed
        (step 5) — never decided again. Returns whether it committed."""
        assert self._consumer is not None
        renewed = True
        if error.fatal:
            timed_out = self._timed_out(error, commit)
            self._renew_producer(error, slot, stuck=timed_out)
            if timed_out or not error.fenced:
                self._renew_siblings(slot, commit)
        else:
            # Anything else is aborted and the batch decided again: abortable errors (our
            # partitions moved), retriable ones (a broker restart times out send_offsets),
            # and the _STATE error produce() raises once the transaction failed in the
            # background (a broker restart: OUT_OF_ORDER_SEQUENCE_NUMBER).
            # abort_transaction says if not.
            log.warning("aborting transaction: %s", error)
            self.observer.aborted()
            failed = abort_transaction(
                self._producers[slot], bootstrap=self.settings.kafka_bootstrap
            )
            if failed is not None:
                # fenced by the coordinator's transaction timeout (a broker outage): a
                # broker fault, like an abort that cannot finish
                stuck = failed.stuck or self._timed_out(failed.error, commit)
                self._renew_producer(failed.error, slot, stuck=stuck)
                if stuck or not failed.error.fenced:
                    self._renew_siblings(slot, commit)
            elif self._wedged(error, slot):
                self._renew_producer(error, slot, stuck=True)
            renewed = failed is not None
        # an abort the coordinator took is certain; a producer renewed instead leaves it to
        # the new producer's init_transactions, which completes a commit the coordinator
        # had begun
        if commit is not None and renewed and self._committed_after_all(batch):
            log.warning(
                "the transaction that failed (%s) committed after all: its decisions stand",
                error,
            )
            self._committed(commit)
            self.observer.stats.committed_after_all += 1
            self._rewind(also or [])
            return True
        self._rewind([batch, *(also or [])])
        return False

    def _renew_siblings(self, slot: int, commit: TransactionCommit[Batch] | None) -> None:
        """The producer of `slot` failed fatally by a broker or coordinator fault: not by a
        fence (a fence is about its transactional id alone), unless the coordinator fenced
        it for outliving the transaction timeout during an outage. The other producers made
        before its transaction began are renewed too, while they have no transaction in
        flight: after a broker restart the producers connected before it wedge one after
        the other — seen twice in the broker-restart fault test: slot 1 stuck in
        send_offsets (once), failed with INVALID_TXN_STATE (once) and renewed, then slot 0's
        next transaction stuck in send_offsets for the whole commit bound (librdkafka#5456),
        the leases expiring meanwhile; and after a fence by the transaction timeout, the
        other producer stuck in send_offsets for 60 s in most runs of that test. A new
        producer costs one init_transactions."""
        since = commit.begun_at if commit is not None else time.monotonic()
        why = f"was made before producer {slot}'s failed transaction: renewed too"
        self._renew_idle(since, why, skip=slot)

    def _renew_idle(self, made_before: float, why: str, skip: int | None = None) -> None:
        """Renew every producer made before `made_before` that has no transaction in
        flight (and is not `skip`), each with a WARNING `producer N {why}`."""
        busy = {c.slot for c in (self._inflight, self._older) if c is not None}
        for other in range(len(self._producers)):
            if other == skip or other in busy or self._born.get(other, 0.0) > made_before:
                continue
            log.warning("producer %s %s", other, why)
            self._renewed_at[other] = time.monotonic()
            self._producers[other] = self._transactional_producer(
                other, patience_s=RENEW_PATIENCE_S
            )

    def _wedged(self, error: KafkaFailed, slot: int) -> bool:
        """Whether the producer of `slot` timed out in `WEDGED_AFTER` transactions in a row:
        after a broker restart librdkafka can keep its requests to the transaction
        coordinator queued for good (`REQTMOUT … 1 out-queue`: each AddOffsetsToTxn times out
        after transaction.timeout.ms, while the abort goes through), and only a new producer
        connects again. Seen in the broker-restart fault test: one transaction in two failing
        for 3 minutes, every lease expiring meanwhile."""
        if not error.timed_out:
            self._timeouts[slot] = 0
            return False
        self._timeouts[slot] = self._timeouts.get(slot, 0) + 1
        if self._timeouts[slot] < WEDGED_AFTER:
            return False
        self._timeouts[slot] = 0
        log.warning(
            "producer %s timed out in %s transactions in a row: a new producer replaces it",
            slot,
            WEDGED_AFTER,
        )
        return True

    def _timed_out(self, error: KafkaFailed, commit: TransactionCommit[Batch] | None) -> bool:
        """Whether a fence is the coordinator's transaction timeout rather than another
        instance with our transactional id: the transaction was open at least
        transaction.timeout.ms (a commit slowed by a broker fault, or a transaction that
        waited for the one before it). The coordinator then aborts it and bumps the epoch,
        which fences the producer however recently it was renewed."""
        if commit is None or not error.fenced:
            return False
        if commit.age() < self.settings.transaction_timeout_ms / 1000:
            return False
        log.warning(
            "producer %s fenced after its transaction was open %.1f s (transaction timeout "
            "%s ms): the coordinator aborted it",
            commit.slot,
            commit.age(),
            self.settings.transaction_timeout_ms,
        )
        return True

    def _committed_after_all(self, batch: Batch) -> bool:
        """Whether the group's committed offsets (stable: the failed transaction was ended
        by the new producer's init_transactions) include `batch`'s input offsets, on every
        partition of it still ours (a transaction is atomic: they agree, or the single
        writer is broken and the processor stops). Unknown (the coordinator does not answer
        within the limit): the processor stops rather than decide the batch again or not
        on a guess — a restart restores what was committed."""
        ends = {tp: o for tp, o in batch.offsets.items() if tp[1] in self.partitions}
        if not ends:
            # fired timers only (decided again, their command ids dedupe them), or no
            # partition of the batch is ours any more (its next owner reads it)
            return False
        s = self.settings
        got = stable_offsets(
            client_config(s),
            s.processor_group,
            list(ends),
            OUTCOME_LIMIT_S,
            bootstrap=s.kafka_bootstrap,
        )
        seen = {got.get(tp, -1) >= end for tp, end in ends.items()}
        if len(seen) > 1:
            raise SingleWriterViolation(
                "a failed transaction's input offsets are committed on some of its "
                f"partitions and not on others: {got} (its ends: {ends})"
            )
        return seen == {True}

    def _rewind(self, batches: list[Batch]) -> None:
        """Back to the first offset of the batches per partition: nothing of them happened.
        Their timers were never sent: due again at once."""
        assert self._consumer is not None
        first: dict[tuple[str, int], int] = {}
        for b in batches:
            for tp, o in b.first.items():
                first[tp] = min(o, first.get(tp, o))
            for p, cmd in b.timers:
                part = self.partitions.get(p)
                if part is not None:
                    part.timers.unfire(cmd, part.state(cmd.session_id))
        for (t, p), o in first.items():
            if p in self.partitions:
                try:
                    self._consumer.seek(TopicPartition(t, p, o))
                except KafkaFailed as e:  # no longer ours: its next owner reads it
                    log.warning("cannot rewind %s[%s] to %s: %s", t, p, o, e.reason)

    def _renew_producer(self, error: KafkaFailed, slot: int, *, stuck: bool = False) -> None:
        """Our producer of `slot` failed fatally. A broker restart that outlives
        `transaction.timeout.ms` does that: the coordinator aborts the open transaction
        itself and bumps the epoch, and our next EndTxn gets _FENCED or INVALID_TXN_STATE.
        A new producer with the same transactional id carries on (its `init_transactions`
        settles the old transaction). *Fenced* again soon after on the same slot: a second
        live instance has our id, and this one stops. The window is per slot, because
        broker kills can fence both slots' ids once each, one soon after the other (seen on
        the 3-node cluster: a leader kill, then a coordinator kill). Other fatal errors
        (INVALID_TXN_STATE when the coordinator moved again) renew again. `stuck`: the
        producer did not fail but cannot finish aborting, or was fenced by the coordinator's
        transaction timeout (`_timed_out`): no sign of a second instance."""
        now = time.monotonic()
        # only fencing says "another instance": a coordinator that moved twice within the
        # window answers INVALID_TXN_STATE to the abort each time (seen on the 3-node
        # cluster: a leader kill that took the coordinator, then a coordinator kill)
        last = self._renewed_at.get(slot)
        again = error.fenced and not stuck and last is not None and now - last < RENEW_WINDOW_S
        if again:
            raise KafkaUnavailable(
                f"processor transaction failed fatally: {error}",
                bootstrap=self.settings.kafka_bootstrap,
            ) from error
        log.warning(
            "producer %s failed (%s); a new producer takes over its transactional id",
            slot,
            error,
        )
        self._renewed_at[slot] = now
        self._producers[slot] = self._transactional_producer(slot, patience_s=RENEW_PATIENCE_S)

    def _renew_consumer(self, error: KafkaFailed) -> None:
        """Our consumer failed fatally: as a static member it was fenced. librdkafka fences
        itself that way when its session times out during a broker restart — it rejoins
        under a new member id and the coordinator fences the old one (librdkafka#3437) —
        and the consumer would never poll again. A new consumer with the same
        group.instance.id takes the membership back. Fenced again soon after, with no
        session timeout of its own just before, means a second live instance has our id,
        and this one stops (`consumer_fence_is_foreign`)."""
        now = time.monotonic()
        last = self._consumer_renewed_at
        if consumer_fence_is_foreign(now, last, self._group_log.session_timeout_at):
            raise KafkaUnavailable(
                f"processor consumer failed fatally: {error}",
                bootstrap=self.settings.kafka_bootstrap,
            ) from error
        log.warning("consumer failed (%s); a new consumer rejoins the group", error)
        metrics.PROCESSOR_CONSUMER_REPLACED.labels("fenced").inc()
        self._consumer_renewed_at = self._lost_at = now
        assert self._consumer is not None
        owned = [TopicPartition(t, p) for t in self.classes for p in self.partitions]
        self._on_revoke(self._consumer, owned)
        with contextlib.suppress(KafkaFailed, SystemError, RuntimeError):
            self._consumer.close()
        self._consumer = self._group_consumer()

    @property
    def _member(self) -> str:
        """Our consumer's group.instance.id (and client.id)."""
        return f"processor-{self.instance_id}"

    def _callbacks(self) -> dict[str, RebalanceCallback]:
        """A new consumer's rebalance callbacks: they keep `_unassigned_since` (from now, as
        the new consumer holds nothing yet) and `_lost_at` (`_renew_after_loss`, at the next
        assignment), and ignore a consumer given up by `_watch_rejoin`, which may call back
        as it closes."""
        self._unassigned_since = time.monotonic()

        def assign(consumer: GroupConsumer, partitions: list[TopicPartition]) -> None:
            if consumer is self._consumer:
                self._on_assign(consumer, partitions)
                self._unassigned_since = None
                if self._lost_at is not None:  # before any transaction on the new partitions
                    self._renew_after_loss(self._lost_at)

        def revoke(consumer: GroupConsumer, partitions: list[TopicPartition]) -> None:
            if consumer is self._consumer:
                self._on_revoke(consumer, partitions)
                if not self.partitions and self._unassigned_since is None:
                    self._unassigned_since = time.monotonic()

        def lost(consumer: GroupConsumer, partitions: list[TopicPartition]) -> None:
            revoke(consumer, partitions)
            if consumer is self._consumer:
                self._lost_at = time.monotonic()

        return {"on_assign": assign, "on_revoke": revoke, "on_lost": lost}

    def _watch_rejoin(self) -> None:
        """After a broker restart librdkafka can fail to rejoin: seen in CI, the consumer's
        session timed out while the broker loaded, its partitions were revoked, and it
        never sent JoinGroup again; the coordinator expired the member six seconds later
        and the processor, alive, decided nothing for three minutes. So between a revoke
        and the next assignment, every `REJOIN_CHECK_S` the coordinator is asked whether
        our group.instance.id is a member (a member waiting in a rebalance is). If not, a
        new consumer joins under the same id. The old one is closed on a thread of its
        own: its close may wait on the same stuck state."""
        since = self._unassigned_since
        if since is None:  # assigned: the common case, on every poll
            return
        now = time.monotonic()
        if now - max(since, self._rejoin_asked_at) < REJOIN_CHECK_S:
            return
        self._rejoin_asked_at = now
        s = self.settings
        members = static_members(client_config(s), s.processor_group)
        ours = self._member
        if members is None or ours in members:
            return
        log.warning(
            "the consumer has had no partitions for %.0f s since a revoke and the group's "
            "coordinator does not list %s as a member: a new consumer joins the group",
            now - since,
            ours,
        )
        metrics.PROCESSOR_CONSUMER_REPLACED.labels("absent").inc()
        stuck, self._consumer = self._consumer, self._group_consumer()
        if stuck is not None:
            close_in_background(stuck)

    def _renew_after_loss(self, lost_at: float) -> None:
        """The consumer lost its partitions (its session timed out: a broker fault, or it
        missed `max.poll.interval.ms`) and has them again: in the assignment's callback,
        before any transaction on them, the producers made before the loss are renewed.
        Kept, the first transaction after a broker restart stuck in send_offsets for a
        whole 60 s commit bound (librdkafka's coordinator request queued for good; seen in
        CI with no transaction failing before it). A new producer costs one
        init_transactions, at a moment the broker answers."""
        self._lost_at = None
        self._renew_idle(lost_at, "was made before the consumer lost its partitions: renewed")
