"""The processor's transactions, with stand-in producers: the two producers take turns,
a failed transaction is aborted (or its producer renewed) on *its* producer only, and a
commit whose outcome the driver reports oddly is never taken for committed.

The odd report is real: confluent-kafka's error callback leaves a fenced producer's fatal
KafkaException set while librdkafka serves the next callback, which then fails with
"SystemError: <function TransactionCommit.on_delivery ...> returned a result with an exception set"
(seen in CI on flush(); the open pull request confluent-kafka-python#1146). The integration tests
(`test_processor.py`) fence real producers on the real broker; these pin the bookkeeping."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from sessionstream.adapters.kafka import TransactionalProducer as W
from sessionstream.adapters.kafka import kafka_cause, translated
from sessionstream.adapters.kafka.transactions import TransactionCommit
from sessionstream.errors import KafkaFailed
from sessionstream.runtimes.processor import failures
from sessionstream.runtimes.processor.batch import Batch
from sessionstream.runtimes.processor.loop import TransactionalProcessor
from sessionstream.settings import Settings
from tests.unit._samples import event


def fenced() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True))


def masked(error: KafkaException) -> SystemError:
    """What confluent-kafka raises: a SystemError whose cause is the KafkaException."""
    try:
        try:
            raise error
        except KafkaException as k:
            raise SystemError(
                "<function on_delivery> returned a result with an exception set"
            ) from k
    except SystemError as s:
        return s


def wrap(*drivers: Any) -> list[W]:
    """The processor's producers: the adapter's client around each stand-in driver."""
    return [W(d) for d in drivers]


class FakeProducer:
    """A stand-in driver: records the calls; `fail` maps a method name to what it raises
    (the driver's own errors, which the adapter's client translates)."""

    def __init__(self, name: str, fail: dict[str, BaseException] | None = None) -> None:
        self.name, self.fail = name, dict(fail or {})
        self.calls: list[str] = []

    def _call(self, what: str) -> None:
        self.calls.append(what)
        error = self.fail.pop(what, None)
        if error is not None:
            raise error

    def begin_transaction(self) -> None:
        self._call("begin")

    def produce(self, *args: Any, **kwargs: Any) -> None:
        self._call("produce")

    def send_offsets_to_transaction(self, *args: Any) -> None:
        self._call("send_offsets")

    def commit_transaction(self, *args: Any) -> None:
        self._call("commit")

    def abort_transaction(self, *args: Any) -> None:
        self._call("abort")

    def flush(self, *args: Any) -> int:
        self._call("flush")
        return 0


class FakeConsumer:
    def consumer_group_metadata(self) -> object:
        return object()

    def seek(self, tp: Any) -> None:
        raise AssertionError("nothing to rewind in these tests")

    def close(self) -> None:
        pass


# -- the SystemError that stands for a KafkaException ------------------------------------------


def test_a_system_error_standing_for_a_kafka_error_is_translated_as_that_error() -> None:
    error = fenced()
    with pytest.raises(KafkaFailed) as got, translated():
        raise masked(error)
    assert got.value.fenced and got.value.fatal and got.value.name == "_FENCED"
    assert got.value.__cause__ is not None and kafka_cause(got.value.__cause__) is error


def test_translated_leaves_other_errors_alone() -> None:
    with pytest.raises(SystemError), translated():
        raise SystemError("a real interpreter problem")
    with pytest.raises(ValueError), translated():
        raise ValueError("not a driver error")
    assert kafka_cause(SystemError("x")) is None
    plain = fenced()
    assert kafka_cause(plain) is plain


def test_a_system_error_while_a_kafka_error_is_handled_stays_a_system_error() -> None:
    """Only an explicit cause counts: a KafkaException that was merely being handled (its
    `__context__`) is another error, and reading the SystemError as it would, say, renew
    a producer for a consumer's fault."""
    with pytest.raises(SystemError):
        try:
            raise KafkaException(KafkaError(KafkaError._STATE, "being handled"))
        except KafkaException:
            with translated():
                raise SystemError("unrelated")  # noqa: B904 (a context, on purpose)


# -- one commit -----------------------------------------------------------------------------


def commit_with(producer: FakeProducer) -> TransactionCommit[Batch]:
    commit = TransactionCommit(Batch([], []), slot=0)
    commit.start(W(producer), [], object())  # type: ignore[arg-type]
    return commit


def test_a_fence_reported_as_a_system_error_fails_the_commit_fatally() -> None:
    commit = commit_with(FakeProducer("a", {"commit": masked(fenced())}))
    error = commit.wait(10)
    assert error is not None and error.fatal and error.fenced


def test_a_commit_that_fails_otherwise_is_never_taken_for_committed() -> None:
    commit = commit_with(FakeProducer("a", {"commit": MemoryError("driver trouble")}))
    with pytest.raises(RuntimeError, match="failed unexpectedly"):
        commit.wait(10)


class Interrupted(BaseException):
    """Not an Exception: what a commit thread could end with besides a driver error."""


def test_a_commit_that_ends_without_committing_is_never_taken_for_committed() -> None:
    commit = commit_with(FakeProducer("a", {"commit": Interrupted()}))
    with pytest.raises(RuntimeError, match="failed unexpectedly"):
        commit.wait(10)


def test_a_committed_transaction_has_no_error() -> None:
    producer = FakeProducer("a")
    commit = commit_with(producer)
    assert commit.wait(10) is None
    assert producer.calls == ["flush", "commit"]  # no offsets: send_offsets is not asked


# -- the two producers ----------------------------------------------------------------------


@pytest.fixture
def proc(tmp_path: Any) -> TransactionalProcessor:
    p = TransactionalProcessor(Settings(store_dir=tmp_path), instance_id="unit")
    p._producers = wrap(FakeProducer("p0"), FakeProducer("p1"))
    p._consumer = FakeConsumer()  # type: ignore[assignment]
    return p


def fakes(p: TransactionalProcessor) -> list[FakeProducer]:
    """The stand-in drivers behind the processor's producers."""
    return [w.driver for w in p._producers]  # type: ignore[misc]


def test_consecutive_transactions_take_turns_one_after_the_other(
    proc: TransactionalProcessor,
) -> None:
    for _ in range(4):
        proc._begin(Batch([], []), 0.0)
        assert proc._inflight is not None
        assert proc._settle()  # the next begins only after this one committed
    assert [p.calls for p in fakes(proc)] == [["begin", "flush", "commit"] * 2] * 2


def test_a_failed_transaction_is_aborted_on_its_own_producer(
    proc: TransactionalProcessor,
) -> None:
    p0, p1 = fakes(proc)
    p1.fail["commit"] = KafkaException(
        KafkaError(KafkaError.NOT_COORDINATOR, "moved", txn_requires_abort=True)
    )
    proc._begin(Batch([], []), 0.0)  # p0
    assert proc._settle()
    proc._begin(Batch([], []), 0.0)  # p1
    assert not proc._settle()
    assert p0.calls == ["begin", "flush", "commit"]
    assert p1.calls == ["begin", "flush", "commit", "abort"]


def test_a_fatal_failure_renews_only_that_slots_producer(
    proc: TransactionalProcessor, monkeypatch: pytest.MonkeyPatch
) -> None:
    p0, p1 = fakes(proc)
    made: list[int] = []

    def renew(slot: int, patience_s: float = 0.0) -> FakeProducer:
        made.append(slot)
        return W(FakeProducer(f"p{slot}-renewed"))

    monkeypatch.setattr(proc, "_transactional_producer", renew)
    p0.fail["commit"] = masked(fenced())  # the driver's odd report of a fence
    proc._begin(Batch([], []), 0.0)
    assert not proc._settle()
    assert made == [0]
    assert proc._producers[1].driver is p1 and fakes(proc)[0].name == "p0-renewed"
    # the next transaction is p1's, then the new p0's
    proc._begin(Batch([], []), 0.0)
    assert proc._settle()
    proc._begin(Batch([], []), 0.0)
    assert proc._settle()
    assert p1.calls == ["begin", "flush", "commit"]
    assert fakes(proc)[0].calls == ["begin", "flush", "commit"]


def test_an_abort_that_reports_its_fence_as_a_system_error_renews_the_producer(
    proc: TransactionalProcessor, monkeypatch: pytest.MonkeyPatch
) -> None:
    p0, _ = fakes(proc)
    monkeypatch.setattr(
        proc, "_transactional_producer", lambda slot, patience_s=0.0: W(FakeProducer("new"))
    )
    p0.fail["produce"] = KafkaException(KafkaError(KafkaError._STATE, "in error state"))
    p0.fail["abort"] = masked(fenced())
    batch = Batch([], [])
    batch.events.append((0, b"k", b"v", event("run.steered")))
    proc._begin(batch, 0.0)
    assert proc._inflight is None  # nothing in flight: it was aborted at once
    assert p0.calls == ["begin", "produce", "abort"]
    assert fakes(proc)[0].name == "new"


def test_a_second_fence_soon_after_stops_the_processor_with_the_fence_as_its_reason(
    proc: TransactionalProcessor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        proc,
        "_transactional_producer",
        lambda slot, patience_s=0.0: W(FakeProducer("again", {"commit": masked(fenced())})),
    )
    fakes(proc)[0].fail["commit"] = masked(fenced())
    proc._begin(Batch([], []), 0.0)
    assert not proc._settle()  # renewed once
    proc._begin(Batch([], []), 0.0)  # p1 commits
    assert proc._settle()
    proc._begin(Batch([], []), 0.0)  # the renewed p0 is fenced again: another instance
    with pytest.raises(Exception, match="failed fatally") as got:
        proc._settle()
    assert type(got.value).__name__ == "KafkaUnavailable"


def test_each_slot_may_be_fenced_once_and_a_repeat_on_the_same_slot_stops(
    proc: TransactionalProcessor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Broker kills can fence both transactional ids once each, close together (the 3-node
    fault test: a leader kill, then the other id's coordinator): not a second instance. A
    second live instance fences the same id again after we took it back."""
    made: list[int] = []

    def renew(slot: int, patience_s: float = 0.0) -> FakeProducer:
        made.append(slot)
        return W(FakeProducer(f"p{slot}-renewed", {"commit": masked(fenced())} if slot else {}))

    monkeypatch.setattr(proc, "_transactional_producer", renew)
    p0, p1 = fakes(proc)
    p0.fail["commit"] = masked(fenced())
    p1.fail["commit"] = masked(fenced())
    proc._begin(Batch([], []), 0.0)  # p0 fenced
    assert not proc._settle()
    proc._begin(Batch([], []), 0.0)  # p1 fenced, seconds later: renewed too
    assert not proc._settle()
    assert made == [0, 1]
    proc._begin(Batch([], []), 0.0)  # the new p0 commits
    assert proc._settle()
    proc._begin(Batch([], []), 0.0)  # the new p1 is fenced again: another instance has it
    with pytest.raises(Exception, match="failed fatally") as got:
        proc._settle()
    assert type(got.value).__name__ == "KafkaUnavailable"
    assert made == [0, 1]


def test_close_survives_a_flush_that_reports_its_fence_as_a_system_error(
    proc: TransactionalProcessor,
) -> None:
    p0, p1 = fakes(proc)
    p0.fail["flush"] = masked(fenced())
    proc._consumer = None
    proc.close()
    assert p0.calls == ["flush"] and p1.calls == ["flush"] and proc._producers == []


def test_a_stop_whose_last_commit_fails_still_closes_everything(
    proc: TransactionalProcessor,
) -> None:
    """The loop failing already (`quiet`): the transaction in flight fails too, its error
    is logged, and consumer, stores and producers are closed all the same."""
    p0, p1 = fakes(proc)
    p0.fail["commit"] = MemoryError("driver trouble")
    proc._begin(Batch([], []), 0.0)
    proc._shutdown(quiet=True)
    assert proc._inflight is None and proc._consumer is None and proc._producers == []
    assert p0.calls[-1] == "flush" and p1.calls == ["flush"]


def test_a_clean_stop_whose_last_commit_fails_says_so_and_still_closes(
    proc: TransactionalProcessor,
) -> None:
    p0, p1 = fakes(proc)
    p0.fail["commit"] = MemoryError("driver trouble")
    proc._begin(Batch([], []), 0.0)
    with pytest.raises(RuntimeError, match="failed unexpectedly"):
        proc._shutdown(quiet=False)
    assert proc._consumer is None and proc._producers == []
    assert p0.calls[-1] == "flush" and p1.calls == ["flush"]


# -- a failed commit that committed after all ---------------------------------------------


class OffsetsConsumer(FakeConsumer):
    """A group consumer that records the seeks; `committed` stands for the group's
    committed offsets, as `stable_offsets` reads them (patched in by `owning`)."""

    def __init__(self, committed: dict[tuple[str, int], int]) -> None:
        self.offsets = committed
        self.seeks: list[tuple[str, int, int]] = []
        self.asked = 0

    def seek(self, tp: Any) -> None:
        self.seeks.append((tp.topic, tp.partition, tp.offset))


def read(first: dict[tuple[str, int], int], end: dict[tuple[str, int], int]) -> Batch:
    """A batch that read [first, end) of each input partition."""
    b = Batch([], [])
    b.first.update(first)
    b.offsets.update(end)
    return b


def stuck() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._TIMED_OUT, "transaction commit stuck", fatal=True))


@pytest.fixture
def owning(proc: TransactionalProcessor, monkeypatch: pytest.MonkeyPatch) -> TransactionalProcessor:
    """`proc` owning partitions 0 and 1, renewing producers without a broker."""
    proc.partitions.update({0: object(), 1: object()})  # type: ignore[dict-item]
    monkeypatch.setattr(
        proc, "_transactional_producer", lambda slot, patience_s=0.0: W(FakeProducer("new"))
    )

    def offsets(config: Any, group: str, tps: list[tuple[str, int]], *a: Any, **k: Any) -> Any:
        consumer: OffsetsConsumer = proc._consumer  # type: ignore[assignment]
        consumer.asked += 1
        return {tp: consumer.offsets[tp] for tp in tps}

    monkeypatch.setattr(failures, "stable_offsets", offsets)
    return proc


C = "session.commands"


def test_a_stuck_commit_the_coordinator_committed_counts_as_committed(
    owning: TransactionalProcessor,
) -> None:
    """librdkafka can hang in commit_transaction after a broker restart although the
    coordinator committed (the new producer's init_transactions completes it): the batch's
    decisions stand — decided again, they would be appended a second time on top of a store
    that never had them."""
    consumer = owning._consumer = OffsetsConsumer({(C, 0): 10, (C, 1): 7})  # type: ignore[assignment]
    seen: list[Batch] = []
    owning.observer.committed = lambda outcomes, timers: seen.append(batch)  # type: ignore[method-assign]
    fakes(owning)[0].fail["commit"] = stuck()
    batch = read({(C, 0): 4, (C, 1): 2}, {(C, 0): 10, (C, 1): 7})
    owning._begin(batch, 0.0)
    assert owning._settle()
    assert seen == [batch]  # step 5 ran: its states went to the stores
    assert consumer.seeks == []  # and nothing of it is read again
    assert fakes(owning)[0].name == "new"


def test_a_stuck_commit_that_did_not_commit_is_read_again(owning: TransactionalProcessor) -> None:
    consumer = owning._consumer = OffsetsConsumer({(C, 0): 4, (C, 1): 2})  # type: ignore[assignment]
    fakes(owning)[0].fail["commit"] = stuck()
    owning._begin(read({(C, 0): 4, (C, 1): 2}, {(C, 0): 10, (C, 1): 7}), 0.0)
    assert not owning._settle()
    assert sorted(consumer.seeks) == [(C, 0, 4), (C, 1, 2)]


def test_the_batch_decided_on_top_of_one_that_committed_after_all_is_read_again(
    owning: TransactionalProcessor,
) -> None:
    """The later batch was never produced: it is decided again, now on the committed one."""
    consumer = owning._consumer = OffsetsConsumer({(C, 0): 10})  # type: ignore[assignment]
    fakes(owning)[0].fail["commit"] = stuck()
    owning._begin(read({(C, 0): 4}, {(C, 0): 10}), 0.0)
    later = read({(C, 0): 10}, {(C, 0): 12})
    assert not owning._settle(also=later)
    assert consumer.seeks == [(C, 0, 10)]


def test_an_abort_the_coordinator_took_is_certain_and_read_again(
    owning: TransactionalProcessor,
) -> None:
    consumer = owning._consumer = OffsetsConsumer({(C, 0): 4})  # type: ignore[assignment]
    fakes(owning)[0].fail["commit"] = KafkaException(
        KafkaError(KafkaError.NOT_COORDINATOR, "moved", txn_requires_abort=True)
    )
    owning._begin(read({(C, 0): 4}, {(C, 0): 10}), 0.0)
    assert not owning._settle()
    assert consumer.asked == 0 and consumer.seeks == [(C, 0, 4)]


def test_partitions_that_disagree_on_a_transaction_stop_the_processor(
    owning: TransactionalProcessor,
) -> None:
    owning._consumer = OffsetsConsumer({(C, 0): 10, (C, 1): 2})  # type: ignore[assignment]
    fakes(owning)[0].fail["commit"] = stuck()
    owning._begin(read({(C, 0): 4, (C, 1): 2}, {(C, 0): 10, (C, 1): 7}), 0.0)
    with pytest.raises(Exception, match="committed on some of its partitions") as got:
        owning._settle()
    assert type(got.value).__name__ == "SingleWriterViolation"


def test_a_produce_failure_before_the_commit_is_not_asked_about(
    owning: TransactionalProcessor,
) -> None:
    consumer = owning._consumer = OffsetsConsumer({(C, 0): 4})  # type: ignore[assignment]
    fakes(owning)[0].fail["produce"] = KafkaException(KafkaError(KafkaError._STATE, "failed"))
    batch = read({(C, 0): 4}, {(C, 0): 10})
    batch.events.append((0, b"k", b"v", event("run.steered")))
    owning._begin(batch, 0.0)
    assert consumer.asked == 0 and consumer.seeks == [(C, 0, 4)]


def test_an_abort_that_cannot_finish_leaves_the_outcome_to_the_offsets(
    owning: TransactionalProcessor,
) -> None:
    """The commit failed and the abort did not go through (fenced): the new producer's
    init_transactions ended the transaction, which may have been the commit."""
    consumer = owning._consumer = OffsetsConsumer({(C, 0): 10})  # type: ignore[assignment]
    p0 = fakes(owning)[0]
    p0.fail["commit"] = KafkaException(KafkaError(KafkaError._TIMED_OUT, "timed out"))
    p0.fail["abort"] = masked(fenced())
    owning._begin(read({(C, 0): 4}, {(C, 0): 10}), 0.0)
    assert owning._settle()
    assert consumer.asked == 1 and consumer.seeks == []


# -- two transactions in flight -----------------------------------------------------------


class GatedProducer(FakeProducer):
    """commit_transaction waits for `gate` (a coordinator slow to answer EndTxn)."""

    def __init__(self, name: str, fail: dict[str, BaseException] | None = None) -> None:
        super().__init__(name, fail)
        import threading

        self.gate = threading.Event()

    def commit_transaction(self, *args: Any) -> None:
        assert self.gate.wait(10), "the gate was never opened"
        self._call("commit")


def test_the_next_transaction_produces_while_the_one_before_commits_and_commits_after_it(
    owning: TransactionalProcessor,
) -> None:
    p0, p1 = GatedProducer("p0"), FakeProducer("p1")
    owning._producers = wrap(p0, p1)
    owning._consumer = OffsetsConsumer({})  # type: ignore[assignment]
    owning._begin(read({(C, 0): 0}, {(C, 0): 4}), 0.0)  # A on p0: its commit hangs
    first = owning._inflight
    assert first is not None and first.appended.wait(5)
    owning._begin(read({(C, 0): 4}, {(C, 0): 6}), 0.0)  # B on p1, decided on top of A
    second = owning._inflight
    assert second is not None and second.appended.wait(5)
    assert p1.calls == ["begin", "send_offsets", "flush"]  # in; its commit waits for A's
    assert not second.done()
    p0.gate.set()
    assert owning._settle() and owning._older is None  # A
    assert owning._settle() and owning._inflight is None  # B
    assert p0.calls == p1.calls == ["begin", "send_offsets", "flush", "commit"]


def test_when_the_transaction_before_fails_the_next_one_aborts_and_both_are_read_again(
    owning: TransactionalProcessor,
) -> None:
    p0 = GatedProducer(
        "p0",
        {"commit": KafkaException(KafkaError(KafkaError._STATE, "x", txn_requires_abort=True))},
    )
    p1 = FakeProducer("p1")
    owning._producers = wrap(p0, p1)
    consumer = owning._consumer = OffsetsConsumer({(C, 0): 0})  # type: ignore[assignment]
    owning._begin(read({(C, 0): 0}, {(C, 0): 4}), 0.0)
    owning._begin(read({(C, 0): 4, (C, 1): 9}, {(C, 0): 6, (C, 1): 10}), 0.0)
    p0.gate.set()
    assert not owning._settle()
    assert owning._inflight is None and owning._older is None
    assert "commit" not in p1.calls and p1.calls[-1] == "abort"
    assert sorted(consumer.seeks) == [(C, 0, 0), (C, 1, 9)]  # the earliest of each partition


def test_a_failure_before_the_records_are_in_reads_the_next_batch_again(
    owning: TransactionalProcessor,
) -> None:
    """The batch decided on top of a transaction whose records failed: it never began."""
    p0 = FakeProducer("p0", {"flush": KafkaException(KafkaError(KafkaError._STATE, "x"))})
    owning._producers = wrap(p0, FakeProducer("p1"))
    consumer = owning._consumer = OffsetsConsumer({(C, 0): 0})  # type: ignore[assignment]
    owning._begin(read({(C, 0): 0}, {(C, 0): 4}), 0.0)
    assert not owning._appended(also=read({(C, 0): 4}, {(C, 0): 6}))
    assert owning._inflight is None and consumer.seeks == [(C, 0, 0)]


def test_a_transaction_waiting_too_long_for_the_one_before_gives_itself_up() -> None:
    """The coordinator aborts and fences a transaction open past transaction.timeout.ms:
    one waiting for a slow commit before it ends itself first, an error that aborts."""
    first = GatedProducer("p0")
    before = TransactionCommit(Batch([], []), slot=0)
    before.start(first, [], object())  # type: ignore[arg-type]
    waiting = TransactionCommit(Batch([], []), slot=1, after=before, after_limit_s=0.3)
    second = FakeProducer("p1")
    waiting.start(second, [], object())  # type: ignore[arg-type]
    error = waiting.wait(5)
    assert error is not None and error.requires_abort
    assert "did not commit within" in error.reason
    assert "commit" not in second.calls
    first.gate.set()
    assert before.wait(5) is None


def test_a_fence_after_the_transaction_timeout_is_not_taken_for_another_instance(
    owning: TransactionalProcessor,
) -> None:
    """Renewed a moment ago, fenced again: another instance — unless the fenced transaction
    was open for the whole transaction timeout (the coordinator fenced it)."""
    owning._consumer = OffsetsConsumer({(C, 0): 4})  # type: ignore[assignment]
    owning._renewed_at[0] = time.monotonic()
    fakes(owning)[0].fail["commit"] = masked(fenced())
    owning._begin(read({(C, 0): 4}, {(C, 0): 10}), 0.0)
    assert owning._inflight is not None
    owning._inflight.begun_at -= owning.settings.transaction_timeout_ms / 1000 + 1
    assert not owning._settle()  # renewed, read again: not stopped
    assert fakes(owning)[0].name == "new"


def test_after_a_failed_begin_the_next_transaction_is_never_on_the_producer_in_flight(
    owning: TransactionalProcessor,
) -> None:
    p0, p1 = GatedProducer("p0"), FakeProducer("p1")
    p1.fail["produce"] = KafkaException(KafkaError(KafkaError._STATE, "x"))
    owning._producers = wrap(p0, p1)
    owning._consumer = OffsetsConsumer({})  # type: ignore[assignment]
    owning._begin(read({(C, 0): 0}, {(C, 0): 4}), 0.0)  # on p0, its commit hangs
    failing = read({(C, 0): 4}, {(C, 0): 6})
    failing.events.append((0, b"k", b"v", event("run.steered")))
    owning._begin(failing, 0.0)  # p1: produce fails, aborted, read again
    assert owning._inflight is not None and owning._inflight.slot == 0
    p1.fail.clear()
    owning._begin(read({(C, 0): 4}, {(C, 0): 6}), 0.0)
    assert owning._inflight.slot == 1  # p1 again, not p0 whose transaction is committing
    p0.gate.set()
    owning._settle_all()


def test_a_producer_whose_transactions_keep_timing_out_is_replaced(
    owning: TransactionalProcessor,
) -> None:
    """librdkafka can keep a producer's coordinator requests queued for good after a broker
    restart: each transaction times out and aborts. The third in a row renews it; a
    commit in between starts the count again."""
    owning._consumer = OffsetsConsumer({(C, 0): 0})  # type: ignore[assignment]
    p0, p1 = fakes(owning)
    timeout = KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to add offsets"))

    def round_(fail: bool) -> None:
        if fail:
            fakes(owning)[0].fail["send_offsets"] = timeout
        owning._begin(read({(C, 0): 0}, {(C, 0): 4}), 0.0)  # slot 0
        assert owning._settle() is not fail
        owning._begin(read({(C, 0): 0}, {(C, 0): 4}), 0.0)  # slot 1 commits
        assert owning._settle()

    round_(True)
    round_(True)
    assert owning._producers[0].driver is p0  # two in a row: kept
    round_(True)
    assert fakes(owning)[0].name == "new"  # the third: replaced
    owning._producers[0] = W(p0)
    round_(True)
    round_(False)
    round_(True)
    round_(True)
    assert owning._producers[0].driver is p0 and owning._producers[1].driver is p1


class HangingSendOffsets(FakeProducer):
    """send_offsets_to_transaction never returns, whatever its timeout (librdkafka#5456)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        import threading

        self.release = threading.Event()

    def send_offsets_to_transaction(self, *args: Any) -> None:
        self.calls.append("send_offsets")
        self.release.wait(30)


def test_a_stuck_commit_is_given_up_at_its_bound_from_the_start_not_per_wait(
    owning: TransactionalProcessor,
) -> None:
    """The processor waits for the records to be in (to overlap the next transaction),
    then for the end: each wait with the whole bound held a commit stuck in send_offsets
    twice as long, past max.poll.interval.ms (seen after a broker restart: 120 s)."""
    hanging = HangingSendOffsets("p0")
    owning._producers = wrap(hanging, FakeProducer("p1"))
    consumer = owning._consumer = OffsetsConsumer({(C, 0): 0})  # type: ignore[assignment]
    try:
        owning._begin(read({(C, 0): 0}, {(C, 0): 4}), 0.0)
        commit = owning._inflight
        assert commit is not None
        commit.limit_s = 1.0
        t0 = time.monotonic()
        assert not owning._appended(also=read({(C, 0): 4}, {(C, 0): 6}))
        elapsed = time.monotonic() - t0
        assert elapsed < 1.8, f"waited {elapsed:.2f} s for a bound of 1 s"
        assert consumer.seeks == [(C, 0, 0)]  # read again, with the batch on top of it
        assert fakes(owning)[0].name == "new"  # given up: a new producer took its id
    finally:
        hanging.release.set()


def test_a_stuck_commit_renews_the_idle_producers_made_before_it_too(
    owning: TransactionalProcessor,
) -> None:
    """After a broker restart the producers connected before it wedge one after the other:
    one stuck commit renews the idle producer made before it too (not only when found stuck
    itself, a whole commit bound later)."""
    owning._consumer = OffsetsConsumer({(C, 0): 0})  # type: ignore[assignment]
    fakes(owning)[0].fail["commit"] = stuck()
    owning._begin(read({(C, 0): 0}, {(C, 0): 4}), 0.0)
    assert not owning._settle()
    assert [p.name for p in fakes(owning)] == ["new", "new"]


def test_a_producer_made_after_the_stuck_commit_began_is_kept(
    owning: TransactionalProcessor,
) -> None:
    owning._consumer = OffsetsConsumer({(C, 0): 0})  # type: ignore[assignment]
    p1 = fakes(owning)[1]
    fakes(owning)[0].fail["commit"] = stuck()
    owning._begin(read({(C, 0): 0}, {(C, 0): 4}), 0.0)
    owning._born[1] = time.monotonic() + 1  # renewed while that commit was under way
    assert not owning._settle()
    assert fakes(owning)[0].name == "new" and owning._producers[1].driver is p1


def fresh_producers(p: TransactionalProcessor) -> list[FakeProducer]:
    """Two new stand-in producers, as if just started: none made or renewed lately."""
    p._producers = wrap(FakeProducer("p0"), FakeProducer("p1"))
    p._born.clear()
    p._renewed_at.clear()
    p._slot = 0
    return fakes(p)


def test_a_coordinator_fault_renews_the_idle_producers_made_before_it_and_a_fence_does_not(
    owning: TransactionalProcessor,
) -> None:
    """INVALID_TXN_STATE after a broker restart: the other producer is renewed too. A fence
    is about one transactional id: the other producer is kept."""
    owning._consumer = OffsetsConsumer({(C, 0): 0})  # type: ignore[assignment]
    fakes(owning)[0].fail["commit"] = KafkaException(
        KafkaError(KafkaError.INVALID_TXN_STATE, "Failed to end transaction", fatal=True)
    )
    owning._begin(read({(C, 0): 0}, {(C, 0): 4}), 0.0)
    assert not owning._settle()
    assert [p.name for p in fakes(owning)] == ["new", "new"]
    fresh_producers(owning)
    p1 = fakes(owning)[1]
    fakes(owning)[0].fail["commit"] = masked(fenced())
    owning._begin(read({(C, 0): 0}, {(C, 0): 4}), 0.0)
    assert not owning._settle()
    assert fakes(owning)[0].name == "new" and owning._producers[1].driver is p1


def test_a_fence_by_the_transaction_timeout_renews_the_idle_producers_made_before_it(
    owning: TransactionalProcessor,
) -> None:
    """A broker outage longer than the transaction timeout: the coordinator aborts the open
    transaction and fences its producer. That is a broker fault, not another instance: the
    idle producer connected before it is renewed too (kept, it stuck in send_offsets for a
    whole commit bound in most runs of the broker-restart fault test). Both ways the fence
    arrives: at the commit, and at the abort of a transaction that failed otherwise."""
    timeout_s = owning.settings.transaction_timeout_ms / 1000
    owning._consumer = OffsetsConsumer({(C, 0): 0})  # type: ignore[assignment]
    fakes(owning)[0].fail["commit"] = masked(fenced())
    owning._begin(read({(C, 0): 0}, {(C, 0): 4}), 0.0)
    assert owning._inflight is not None
    owning._inflight.begun_at -= timeout_s + 1
    assert not owning._settle()
    assert [p.name for p in fakes(owning)] == ["new", "new"]

    fresh_producers(owning)
    p0 = fakes(owning)[0]
    p0.fail["commit"] = KafkaException(
        KafkaError(
            KafkaError._INCONSISTENT, "9 message(s) failed delivery", txn_requires_abort=True
        )
    )
    p0.fail["abort"] = masked(fenced())
    owning._begin(read({(C, 0): 0}, {(C, 0): 4}), 0.0)
    assert owning._inflight is not None
    owning._inflight.begun_at -= timeout_s + 1
    assert not owning._settle()
    assert p0.calls[-1] == "abort"
    assert [p.name for p in fakes(owning)] == ["new", "new"]


class OutcomesGatedProducer(FakeProducer):
    """The second flush (the outcome records' acknowledgement) waits for `gate`."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        import threading

        self.gate = threading.Event()
        self.flushes = 0

    def flush(self, *args: Any) -> int:
        self.flushes += 1
        if self.flushes == 2:
            assert self.gate.wait(10), "the gate was never opened"
        return super().flush()


def test_the_next_transaction_begins_before_the_outcome_records_before_it_are_in() -> None:
    """The next transaction may produce once the one before has its records in, all but
    its outcome records; its own outcome records go out only after those of the one
    before are acknowledged (every topic keeps the transactions' order)."""
    first = OutcomesGatedProducer("p0")
    before = TransactionCommit(
        Batch([], []), slot=0, follow=lambda: [(0, b"a", b"A", [])], follow_topic="outcomes"
    )
    before.start(first, [], object())  # type: ignore[arg-type]
    assert before.first_round.wait(5)
    assert not before.appended.is_set()  # its outcome records are not in yet
    made: list[str] = []

    def follow() -> list[tuple[int, bytes, bytes, list[Any]]]:
        made.append("b")
        return [(0, b"b", b"B", [])]

    waiting = TransactionCommit(
        Batch([], []), slot=1, follow=follow, follow_topic="outcomes", after=before
    )
    second = FakeProducer("p1")
    waiting.start(second, [], object())  # type: ignore[arg-type]
    assert waiting.first_round.wait(5)  # its own records are in: a third may begin
    deadline = time.monotonic() + 5
    while waiting.step != "after's follow-up records" and time.monotonic() < deadline:
        time.sleep(0.001)
    assert waiting.step == "after's follow-up records"
    assert made == [] and second.calls == ["flush"]  # no outcome record of its own yet
    first.gate.set()
    assert before.wait(5) is None and waiting.wait(5) is None
    assert made == ["b"]
    assert first.calls == ["flush", "produce", "flush", "commit"]
    assert second.calls == ["flush", "produce", "flush", "commit"]
