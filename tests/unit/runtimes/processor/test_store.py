"""The processor's local store on a real RocksDB (in a temp dir): checkpoints written with
their records, the deadline index, the cache in front of the disk, a held store, and when a
checkpoint is trusted."""

from __future__ import annotations

from pathlib import Path

import pytest
import rocksdict
from confluent_kafka import OFFSET_BEGINNING

from sessionstream.core.state import RunState, Schedule, SessionState, evolved
from sessionstream.core.state_codec import encode_state
from sessionstream.core.step import DedupRecord
from sessionstream.core.timers import next_due
from sessionstream.runtimes.processor.partition import PartitionState
from sessionstream.runtimes.processor.restore import _start
from sessionstream.runtimes.processor.store import (
    Checkpoint,
    PartitionStore,
    open_partition_store,
    remove_private,
)

CACHE = rocksdict.Cache(1 << 20)


def _store(root: Path, cache: int = 100) -> PartitionStore:
    return PartitionStore(root, 0, cache_sessions=cache, dedup_ttl_s=3600, block_cache=CACHE)


def _active(sid: str, timeout_at: int = 5_000) -> SessionState:
    run = RunState(
        run_id=f"r-{sid}",
        status="running",
        seq=1,
        started_at=1_000,
        timeout_at=timeout_at,
        prompt="p",
        source_command_id="c",
    )
    return SessionState(session_id=sid, tenant_id="t", active=run, runs_started=1, clock=1_000)


def _part(store: PartitionStore) -> PartitionState:
    return PartitionState(0, store, state_topic_id="state-id", outcomes_topic_id="dedup-id")


def test_a_commit_survives_a_reopen_with_its_checkpoint(tmp_path: Path) -> None:
    part = _part(_store(tmp_path))
    a, idle = _active("a"), SessionState(session_id="idle", tenant_id="t", clock=1)
    delta = part.commit(
        [(a, encode_state(a)), (idle, encode_state(idle))],
        [DedupRecord("a", 7, 99, 1_000)],
        state_offset=12,
        dedup_offset=3,
    )
    assert delta == 1 and part.active == 1
    part.close()

    again = _part(_store(tmp_path))
    assert again.state("a") == a and again.state("idle") == idle
    assert again.state("nobody") is None
    assert again.seen("a", 7) == (99, 1_000) and again.seen("a", 8) is None
    assert again.store.state_db.checkpoint() == Checkpoint("state-id", 12)
    assert again.store.dedup_db.checkpoint() == Checkpoint("dedup-id", 3)
    # only the active session is in the deadline index, with its earliest deadline
    again.load_timers()
    assert again.active == 1
    assert list(again.store.deadlines()) == [(next_due(a), "a", True)]
    again.close()


def test_a_session_with_a_schedule_and_no_run_is_watched_and_not_counted_active(
    tmp_path: Path,
) -> None:
    """Its schedule's next firing is a deadline: in the index (a restart fires it), but the
    session has no active run (the active runs' gauge does not count it)."""

    part = _part(_store(tmp_path))
    sc = Schedule(
        schedule_id="s1",
        revision=1,
        interval_ms=60_000,
        text="t",
        next_nominal_at=5_000,
        next_at=5_000,
    )
    idle = evolved(SessionState.initial("idle"), tenant_id="acme", schedules=(sc,))
    a = _active("a")
    part.commit([(idle, encode_state(idle)), (a, encode_state(a))], [], 1, None)
    assert part.active == 1
    part.close()
    again = _part(_store(tmp_path))
    again.load_timers()
    assert sorted(again.store.deadlines()) == sorted(
        [(5_000, "idle", False), (next_due(a), "a", True)]
    )
    assert again.active == 1
    again.close()


def test_an_idle_sessions_retention_deadline_is_indexed_apart_from_the_active_runs(
    tmp_path: Path,
) -> None:
    """With retention set, a session whose run finished has a deadline (its erasure) but no
    active run: restored, the wheel watches it and the count of active runs stays right."""
    part = PartitionState(
        0, _store(tmp_path), state_topic_id="s", outcomes_topic_id="d", retention_ms=60_000
    )
    a = _active("a")
    part.commit([(a, encode_state(a))], [], 1, None)
    idle = evolved(a, active=None, idle_since=2_000, clock=2_000)
    assert part.commit([(idle, encode_state(idle))], [], 2, None) == -1
    assert list(part.store.deadlines()) == [(62_000, "a", False)]
    part.close()
    again = PartitionState(
        0, _store(tmp_path), state_topic_id="s", outcomes_topic_id="d", retention_ms=60_000
    )
    again.load_timers()
    assert again.active == 0 and again.timers.pending == 1
    [fired] = again.timers.due(62_000, again.state)
    assert fired.payload.model_dump()["kind"] == "retention" and fired.run_id == "_session"
    # erased: the marker has no deadline, nothing stays in the index
    marker = SessionState(session_id="a", tenant_id="t", clock=62_000, erased_at=62_000)
    again.commit([(marker, encode_state(marker))], [], 3, None)
    assert list(again.store.deadlines()) == []
    again.close()


def test_an_erasure_forgets_the_sessions_remembered_ids(tmp_path: Path) -> None:
    part = _part(_store(tmp_path))
    part.commit([], [DedupRecord("a", 7, 99, 1_000), DedupRecord("b", 7, 98, 1_000)], None, 1)
    assert sorted(part.remembered_ids("a")) == [7]
    part.commit([], [], None, 2, forgotten=[("a", 7)])
    assert part.seen("a", 7) is None and part.seen("b", 7) == (98, 1_000)
    assert part.remembered_ids("a") == []
    part.close()


def test_a_session_that_goes_idle_leaves_the_deadline_index(tmp_path: Path) -> None:
    part = _part(_store(tmp_path))
    a = _active("a")
    part.commit([(a, encode_state(a))], [], 1, None)
    idle = evolved(a, active=None)
    assert part.commit([(idle, encode_state(idle))], [], 2, None) == -1
    assert list(part.store.deadlines()) == [] and part.active == 0
    # no dedup records in the batch: the dedup checkpoint is not touched
    assert part.store.dedup_db.checkpoint() is None
    part.close()


def test_the_cache_holds_the_most_recent_and_the_disk_the_rest(tmp_path: Path) -> None:
    store = _store(tmp_path, cache=2)
    states = [SessionState(session_id=f"s{i}", clock=i) for i in range(5)]
    store.write_states([(s, s.session_id, encode_state(s), None) for s in states], None)
    assert len(store.cache) == 2  # the two written last
    assert store.state("s0") == states[0]  # from disk
    assert store.cache.misses == 1
    assert store.state("s0") == states[0]
    assert store.cache.hits >= 1 and store.cache.misses == 1
    assert len(store.cache) == 2
    store.close()


def test_a_tombstone_removes_the_session(tmp_path: Path) -> None:
    store = _store(tmp_path)
    a = _active("a")
    store.write_states([(a, "a", encode_state(a), next_due(a))], None)
    store.write_states([(None, "a", None, None)], Checkpoint("x", 5))
    assert store.state("a") is None and list(store.deadlines()) == []
    store.close()


def test_a_store_held_by_another_process_gives_a_private_one(tmp_path: Path) -> None:
    first, private = open_partition_store(
        tmp_path, 0, cache_sessions=10, dedup_ttl_s=60, block_cache=CACHE
    )
    assert not private
    second, private = open_partition_store(
        tmp_path, 0, cache_sessions=10, dedup_ttl_s=60, block_cache=CACHE
    )
    assert private and second.root != first.root and second.root.parent == tmp_path
    remove_private(second)
    assert not second.root.exists()
    first.close()


@pytest.mark.parametrize(
    ("checkpoint", "bounds", "expected", "why"),
    [
        (None, (0, 10), OFFSET_BEGINNING, "the store has no checkpoint"),
        (
            Checkpoint("other-id", 4),
            (0, 10),
            OFFSET_BEGINNING,
            "another topic's checkpoint",
        ),
        (Checkpoint("id", 11), (0, 10), OFFSET_BEGINNING, "the store is ahead of the log"),
        (Checkpoint("id", 2), (3, 10), OFFSET_BEGINNING, "the log was truncated"),
        (Checkpoint("id", 4), (0, 10), 4, None),
        (Checkpoint("id", 10), (0, 10), 10, None),
    ],
)
def test_when_a_checkpoint_is_trusted(
    tmp_path: Path,
    checkpoint: Checkpoint | None,
    bounds: tuple[int, int],
    expected: int,
    why: str | None,
) -> None:
    store = _store(tmp_path)
    s = SessionState(session_id="s", clock=1)
    store.write_states([(s, "s", encode_state(s), None)], checkpoint)
    start, reason = _start(store.state_db, "id", bounds)
    assert start == expected
    if why is None:
        assert reason is None and store.state("s") == s
    else:
        assert reason is not None and reason.startswith(why)
        store.cache = type(store.cache)(10)  # forget the cached copy
        assert store.state("s") is None  # an untrusted store is emptied
    store.close()
