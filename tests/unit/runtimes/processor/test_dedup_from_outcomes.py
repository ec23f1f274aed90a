"""The processor's dedup store is restored from the outcome records (docs/protocol.md,
duplicates): every outcome says what its command id is remembered as once decided, so a
store rebuilt from what compaction leaves of `session.outcomes` (the last record under each
key) remembers what the live store remembers, and forgets what an erasure forgot.

Written from the protocol's rules, not from the processor's code: an exact re-send is a
duplicate, another content under a used id is refused and the id keeps its first meaning,
another tenant never takes an id from the session's owner, an erasure forgets its
session's ids. Each of those records lands under the key of the first one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import rocksdict

from sessionstream.core.partitioning import partition_for
from sessionstream.core.state import command_hash
from sessionstream.core.step import FORGET, CommandStep, encode_state
from sessionstream.runtimes.processor.batch import (
    DEDUP_HEADER,
    decide_batch,
    input_classes,
    outcome_records,
)
from sessionstream.runtimes.processor.partition import PartitionState
from sessionstream.runtimes.processor.restore import apply_outcome
from sessionstream.runtimes.processor.store import PartitionStore
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.commands import Command
from sessionstream.settings import Settings

CACHE = rocksdict.Cache(8 << 20)
T0 = 1_700_000_000_000


class Rec:
    """What `decide_batch` reads of a consumed record."""

    def __init__(self, topic: str, offset: int, key: bytes, value: bytes, ts: int) -> None:
        self._t, self._o, self._k, self._v, self._ts = topic, offset, key, value, ts

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._o

    def key(self) -> bytes:
        return self._k

    def value(self) -> bytes:
        return self._v

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return 2, self._ts


def _part(root: Path) -> PartitionState:
    store = PartitionStore(root, 0, cache_sessions=100, dedup_ttl_s=3600, block_cache=CACHE)
    return PartitionState(0, store, state_topic_id="s", outcomes_topic_id="o")


class World:
    """One partition decided command by command, each batch committed to its store, and
    the outcome records it wrote, in order."""

    def __init__(self, root: Path) -> None:
        self.s = Settings()
        self.codec = Codec()
        self.step = CommandStep(self.codec, partitions=1)
        self.part = _part(root)
        #: (key, outcome, what its header says the id is remembered as)
        self.outcomes: list[tuple[bytes, Any, str | None]] = []
        self.offset = 0

    def send(self, value: bytes, key: bytes, topic: str | None = None) -> Any:
        self.offset += 1
        rec = Rec(topic or self.s.commands_topic, self.offset, key, value, T0 + self.offset)
        batch = decide_batch(
            self.step,
            [rec],
            [],
            {0: self.part},
            None,
            input_classes(self.s),  # type: ignore[list-item]
        )
        self.part.commit(
            [(st, encode_state(st)) for st in batch.staged.values()],
            batch.remembered.values(),
            None,
            None,
            batch.forgotten_by_partition().get(0, ()),
        )
        for _p, k, v, headers in outcome_records(
            batch, self.codec, lambda m: self.codec.peek_ids(m.value())
        ):
            carried = dict(headers).get(DEDUP_HEADER)
            text = carried.decode() if isinstance(carried, bytes) else carried
            self.outcomes.append((k, self.codec.decode_outcome(v), text))
        return self.outcomes[-1][1]

    @property
    def carried(self) -> str | None:
        """What the last outcome record's header says."""
        return self.outcomes[-1][2]

    def cmd(self, sid: str, type_: str, payload: dict[str, Any], cid: str, **kw: Any) -> Any:
        c = Command(
            command_id=cid,
            session_id=sid,
            tenant_id=kw.pop("tenant", "acme"),
            type=type_,
            ts=T0,
            payload=payload,
            **kw,
        )
        topic = self.s.timers_topic if type_ == "session.erase" else None
        return self.send(self.codec.encode_command(c), sid.encode(), topic)


def _restored(w: World, root: Path, compacted: bool) -> PartitionState:
    """A new store from the outcome records: all of them in order, or only what
    compaction keeps (the last under each key, in its place)."""
    records = w.outcomes
    if compacted:
        last = {k: i for i, (k, _o, _c) in enumerate(records)}
        records = [r for i, r in enumerate(records) if last[r[0]] == i]
    part = _part(root)
    for key, _o, carried in records:
        if carried is not None:
            pending: dict[bytes, bytes | None] = {}
            # what the restore does: the session from the key, the record from the header
            apply_outcome(pending, part, key.split(b"/", 1)[0].decode(), carried)
            part.store.write_dedup(list(pending.items()), None)
    return part


def test_a_store_restored_from_compacted_outcomes_remembers_what_the_live_one_does(
    tmp_path: Path,
) -> None:
    w = World(tmp_path / "live")
    first = w.cmd("s-1", "prompt", {"text": "go"}, "A")
    assert first.status == "accepted"
    carried = [w.carried]
    # every later record under A's key carries A's record
    again = w.cmd("s-1", "prompt", {"text": "go"}, "A")
    assert again.status == "duplicate"
    carried.append(w.carried)
    reused = w.cmd("s-1", "steer", {"text": "other"}, "A")
    assert (reused.status, reused.reason) == ("rejected", "command_id_reused")
    carried.append(w.carried)
    foreign = w.cmd("s-1", "prompt", {"text": "go"}, "A", tenant="mallory")
    assert (foreign.status, foreign.reason) == ("rejected", "tenant_mismatch")
    carried.append(w.carried)
    # bytes that cannot be decided, naming A: a dead letter under A's key
    broken = b'{"sessionId": "s-1", "commandId": "A", "type": "prompt"}'
    dead = w.send(broken, b"s-1")
    assert dead.status == "dead_letter" and dead.key == first.key
    carried.append(w.carried)
    assert carried[0] is not None and carried == [carried[0]] * 5, carried
    assert w.cmd("s-1", "abort", {}, "B").status == "accepted"

    h = command_hash("A", "acme")
    live = w.part.seen("s-1", h)
    assert live is not None and live[1] == first.ts
    for compacted in (False, True):
        part = _restored(w, tmp_path / f"restored-{compacted}", compacted)
        for cid in ("A", "B"):
            key = command_hash(cid, "acme")
            assert part.seen("s-1", key) == w.part.seen("s-1", key), (compacted, cid)
        # the foreign tenant's id was never remembered, restored or not
        assert part.seen("s-1", command_hash("A", "mallory")) is None
        part.close()
    w.part.close()


def test_an_erasure_forgets_in_the_restored_store_too(tmp_path: Path) -> None:
    w = World(tmp_path / "live")
    assert w.cmd("s-2", "prompt", {"text": "before"}, "C").status == "accepted"
    assert w.cmd("s-2", "abort", {}, "C2").status == "accepted"
    # another session, its id beginning with this one's, keeps its ids
    assert w.cmd("s-2x", "prompt", {"text": "other"}, "X").status == "accepted"
    erased = w.cmd("s-2", "session.erase", {}, "E", actor="ops")
    assert erased.status == "accepted" and w.carried == FORGET
    assert w.cmd("s-2", "prompt", {"text": "after"}, "D").status == "accepted"
    for compacted in (False, True):
        part = _restored(w, tmp_path / f"restored-{compacted}", compacted)
        assert part.seen("s-2", command_hash("C", "acme")) is None
        assert part.seen("s-2", command_hash("C2", "acme")) is None
        after = part.seen("s-2", command_hash("D", "acme"))
        assert after is not None and after == w.part.seen("s-2", command_hash("D", "acme"))
        assert part.seen("s-2x", command_hash("X", "acme")) is not None
        part.close()
    # the live store agrees: the pre-erasure ids are decided again
    assert w.part.seen("s-2", command_hash("C", "acme")) is None
    again = w.cmd("s-2", "prompt", {"text": "before"}, "C")
    assert again.status != "duplicate"
    w.part.close()


def test_one_partition_holds_the_sessions() -> None:
    # the worlds above decide everything on partition 0
    assert partition_for(b"s-1", 1) == partition_for(b"s-2", 1) == 0
