"""Where analytics fetches a changelog partition again after faust dropped a batch fetched
during a rebalance: from the last record recovery read (never past it, or recovery waits
for records nobody will fetch again), only for partitions this instance holds."""

from __future__ import annotations

from aiokafka import TopicPartition

from sessionstream.runtimes.analytics._transport import changelog_positions

CL = "app-analytics-changelog"


def tp(p: int) -> TopicPartition:
    return TopicPartition(CL, p)


def test_each_partition_restarts_at_the_last_record_recovery_read() -> None:
    assigned = {tp(0), tp(1), tp(2), tp(3)}
    got = changelog_positions(assigned, {tp(2): 274, tp(3): -1}, {tp(0): 121, tp(1): None})
    assert got == {tp(0): 121, tp(1): 0, tp(2): 274, tp(3): 0}


def test_partitions_no_longer_assigned_are_left_alone() -> None:
    # aiokafka refuses to seek a partition it does not hold (IllegalStateError)
    got = changelog_positions({tp(1)}, {tp(0): 10, tp(1): 5}, {tp(2): 7})
    assert got == {tp(1): 5}


def test_a_partition_both_readers_list_restarts_at_the_earlier() -> None:
    # while recovery promotes a standby to active; reading a record twice is harmless,
    # skipping one is not
    assert changelog_positions({tp(0)}, {tp(0): 3}, {tp(0): 90}) == {tp(0): 3}
    assert changelog_positions({tp(0)}, {tp(0): 90}, {tp(0): 3}) == {tp(0): 3}


def test_nothing_to_read_again_when_recovery_reads_nothing() -> None:
    assert changelog_positions({tp(0)}, {}, {}) == {}
