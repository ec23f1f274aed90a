"""What a partition may commit: the first event not done for every endpoint, and what is
done above it, in metadata the next owner reads back."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstream.runtimes.webhooks.ledger import MAX_METADATA, Done, Ledger, parse_metadata


def test_the_commit_point_is_the_first_event_not_done() -> None:
    led = Ledger(10)
    assert led.position() == (10, "")
    led.add(10, {"a", "b"})
    led.add(11, set())  # matched nothing
    led.add(12, {"a"})
    led.add(14, set())  # 13 removed by compaction (or a transaction marker)
    assert led.position() == (10, '{"r":[[1,1],[4,4]]}')  # 12 is open between them
    led.done(12, "a")
    assert led.position() == (10, '{"r":[[1,4]]}')  # 11..14: one range over the gap
    led.done(10, "a")
    pos = led.position()
    assert pos is not None and pos[0] == 10
    assert json.loads(pos[1]) == {"r": [[1, 4]], "s": ["a"], "p": {"0": [0]}}
    led.done(10, "b")
    assert led.position() == (15, "")
    assert led.open == 0


def test_without_a_committed_offset_the_first_record_starts() -> None:
    led = Ledger()
    assert led.position() is None
    led.add(7, set())
    assert led.position() == (8, "")


def test_the_metadata_reads_back() -> None:
    done = parse_metadata(100, '{"r":[[1,4],[9,9]],"s":["a","b"],"p":{"0":[0],"6":[1,0]}}')
    assert done.finished(100) == {"a"}
    assert done.finished(103) is None and done.finished(109) is None
    assert done.finished(106) == {"a", "b"}
    assert done.finished(107) == frozenset()


def test_metadata_not_ours_means_nothing_is_known() -> None:
    for text in (None, "", "other tool's note", "{bad json", '{"r": 5}', '{"p":{"1":[3]}}'):
        assert parse_metadata(0, text) == Done()


def test_metadata_is_cut_to_fit_and_what_is_cut_is_sent_again() -> None:
    led = Ledger(0)
    subs = [f"wh_{i:016x}" for i in range(40)]
    for o in range(2000):
        led.add(o, set(subs[o % 40 : o % 40 + 3]))
    for o in range(1, 2000, 2):
        led.done(o, subs[o % 40])  # partly done: each lists a subscription
    pos = led.position()
    assert pos is not None and pos[0] == 0
    assert 0 < len(pos[1]) <= MAX_METADATA
    done = parse_metadata(0, pos[1])
    listed = [o for o in range(2000) if done.finished(o) != frozenset()]
    assert listed and listed == list(range(1, 2 * len(listed), 2))  # a prefix, in order


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_order_of_completion(data: st.DataObject) -> None:
    """Whatever order deliveries finish in: nothing below the committed offset is
    unfinished, and the metadata claims only what is finished."""
    n = data.draw(st.integers(1, 40))
    subs = ["a", "b", "c"]
    led = Ledger(0)
    pending: dict[int, set[str]] = {}
    for o in range(n):
        if data.draw(st.booleans()):
            continue  # a gap
        want = set(data.draw(st.lists(st.sampled_from(subs), unique=True)))
        led.add(o, want)
        pending[o] = set(want)
    finished: dict[int, set[str]] = {o: set() for o in pending}
    order = [(o, s) for o, ss in pending.items() for s in ss]
    for o, s in data.draw(st.permutations(order)):
        led.done(o, s)
        finished[o].add(s)
        pos = led.position()
        assert pos is not None
        start, meta = pos
        assert all(finished[x] == pending[x] for x in pending if x < start)
        first_open = min((x for x in pending if finished[x] != pending[x]), default=None)
        assert start <= (first_open if first_open is not None else n)
        if first_open is None:
            assert start > max(pending, default=-1)
        claims = parse_metadata(start, meta)
        for x in pending:
            if x < start:
                continue
            said = claims.finished(x)
            if said is None:
                assert finished[x] == pending[x]
            else:
                assert said <= finished[x]
