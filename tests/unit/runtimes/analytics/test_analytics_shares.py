"""Several analytics instances, one answer: shares cut by kind and window, sent as JSON, and
merged by partition give the numbers of one instance folding everything — whoever holds
which partitions, overlaps included — or `Incomplete`, never a short answer."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstream.runtimes.analytics import shares, stats
from sessionstream.runtimes.analytics.facts import Rejection, RunFacts
from sessionstream.runtimes.analytics.fold import Folder
from tests.analytics_world import make_world
from tests.unit.runtimes.analytics.test_analytics_fold import ALL, PARTITIONS, START, _log

KINDS: list[shares.Kind] = ["runs", "finished", "active", "rejections"]


def _folded() -> Folder:
    folder = Folder(retention_ms=10**12)
    folder.recovered(range(PARTITIONS), [])
    for p, off, value in _log(make_world(40, 3, START, seed=21).events):
        folder.fold(p, off, value)
    return folder


FOLDER = _folded()


def _share(
    url: str, held: set[int], offset: int, kind: shares.Kind, w: stats.Window
) -> shares.Share:
    records = shares.select(kind, FOLDER.runs(), FOLDER.rejections(), w)
    return shares.Share(
        url=url,
        partitions=dict.fromkeys(held, offset),
        records=[r for r in records if r.partition in held],
    )


def _whole(w: stats.Window) -> tuple:
    runs = list(FOLDER.runs())
    return (
        stats.runs(runs, w),
        stats.durations(runs, w),
        stats.cancel_latency(runs, w),
        stats.rejections(FOLDER.rejections(), w),
        stats.active_runs(runs, w.tenant),
    )


@settings(max_examples=60, deadline=None)
@given(
    holders=st.lists(st.sets(st.integers(0, PARTITIONS - 1)), min_size=1, max_size=3).filter(
        lambda hs: set().union(*hs) == set(range(PARTITIONS))
    ),
    offsets=st.lists(st.integers(0, 5), min_size=3, max_size=3),
    window=st.sampled_from(
        [ALL, stats.Window(START, START + 10 * 60_000), stats.Window(0, 2**53, "acme")]
    ),
)
def test_a_merge_of_shares_equals_one_instance(
    holders: list[set[int]], offsets: list[int], window: stats.Window
) -> None:
    got: dict[str, list[shares.Record]] = {}
    for kind in KINDS:
        answered = [
            # through JSON, as a peer's page sends it
            shares.Share.from_json(
                json.loads(json.dumps(_share(f"u{i}", held, offsets[i], kind, window).to_json()))
            )
            for i, held in enumerate(holders)
        ]
        got[kind] = shares.merge(answered, PARTITIONS)
    pages = (
        stats.runs(_runs(got["runs"]), window),
        stats.durations(_runs(got["finished"]), window),
        stats.cancel_latency(_runs(got["finished"]), window),
        stats.rejections([r for r in got["rejections"] if isinstance(r, Rejection)], window),
        stats.active_runs(_runs(got["active"]), window.tenant),
    )
    assert pages == _whole(window)


def _runs(records: list[shares.Record]) -> list[RunFacts]:
    return [r for r in records if isinstance(r, RunFacts)]


def test_an_unserved_partition_is_an_error_not_a_short_answer() -> None:
    half = _share("http://a", {0, 1}, 3, "runs", ALL)
    with pytest.raises(shares.Incomplete) as e:
        shares.merge([half], PARTITIONS)
    assert e.value.missing == [2, 3] and "http://a" in str(e.value)


def test_a_partition_held_twice_is_taken_once_from_the_one_folded_furthest() -> None:
    ahead = _share("http://b", set(range(PARTITIONS)), 9, "runs", ALL)
    # a revoked holder's copy, behind and short of one record
    behind = _share("http://a", {0}, 5, "runs", ALL)
    behind = shares.Share(behind.url, behind.partitions, behind.records[1:])
    merged = shares.merge([behind, ahead], PARTITIONS)
    assert sorted(map(repr, merged)) == sorted(map(repr, ahead.records))


def test_a_share_this_version_cannot_read_is_refused() -> None:
    body = _share("http://a", {0}, 1, "runs", ALL).to_json()
    body["records"].append({"t": "from-a-newer-version"})
    with pytest.raises(KeyError):
        shares.Share.from_json(body)
