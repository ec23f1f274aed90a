"""The analytics fold: exact numbers through duplicates, crashes that lose unflushed writes,
and expiry; checked against counts made by hand (tests/analytics_world.py)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstream.core.partitioning import partition_for
from sessionstream.runtimes.analytics import stats
from sessionstream.runtimes.analytics.fold import Folder, Write
from sessionstream.schemas.codec import Codec
from tests.analytics_world import Expected, make_world

PARTITIONS = 4
START = 1_767_225_600_000
ALL = stats.Window(since=0, until=2**53)
CODEC = Codec()


def _log(events: list, dup_every: int = 0) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) in log order; every `dup_every`th event re-emitted later."""
    offsets: Counter[int] = Counter()
    out = []
    records = list(events)
    if dup_every:
        records += events[::dup_every]
    for e in records:
        p = partition_for(e.session_id.encode(), PARTITIONS)
        out.append((p, offsets[p], CODEC.encode_event(e)))
        offsets[p] += 2  # a commit marker after each record, as in a transactional topic
    return out


def _numbers(folder: Folder) -> tuple:
    return (
        stats.runs(folder.runs(), ALL)["totals"],
        stats.rejections(folder.rejections(), ALL)["totals"],
        stats.cancel_latency(folder.runs(), ALL)["overall"],
        stats.active_runs(folder.runs()),
    )


def _expected(exp: Expected) -> tuple:
    fields = ("started", "cancelled", "completed", "failed", "timedOut")
    runs: dict[str, Counter[str]] = {}
    for (_, t), c in exp.runs.items():
        runs.setdefault(t, Counter()).update(c)
    rej: dict[str, Counter[str]] = {}
    for (_, t, r), n in exp.rejections.items():
        rej.setdefault(t, Counter())[r] += n
    lat = sorted(exp.latencies)
    return (
        {t: {f: c[f] for f in fields} for t, c in sorted(runs.items())},
        {t: dict(sorted(c.items())) for t, c in sorted(rej.items())},
        {
            "count": len(lat),
            "p50": stats.percentile(lat, 50),
            "p90": stats.percentile(lat, 90),
            "p99": stats.percentile(lat, 99),
            "max": lat[-1] if lat else None,
        },
        {"total": sum(exp.active.values()), "tenants": dict(sorted(exp.active.items()))},
    )


def _compact(changelog: list[Write]) -> list[tuple[str, bytes]]:
    table: dict[str, bytes] = {}
    for key, value in changelog:
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
    return list(table.items())


def _run(log: list[tuple[int, int, bytes]], crashes: list[tuple[int, int]]) -> Folder:
    """Fold `log` like the app: a crash after record i keeps only the first `kept` of the
    writes not yet flushed, and the restarted folder resumes each partition at its cursor."""
    durable: list[Write] = []
    folder = Folder(retention_ms=10**12)
    folder.recovered(range(PARTITIONS), [])
    pending: list[Write] = []
    crash_at = dict(crashes)
    i = 0
    while i < len(log):
        p, off, value = log[i]
        if off >= (folder.resume_offset(p) or 0):  # what the seek to the cursor skips
            pending.extend(folder.fold(p, off, value))
        if i in crash_at:
            durable.extend(pending[: crash_at.pop(i)])
            pending = []
            folder = Folder(retention_ms=10**12)
            folder.recovered(range(PARTITIONS), _compact(durable))
            i = 0  # every partition is re-read from its recovered cursor
            continue
        i += 1
    durable.extend(pending)
    # what a restart after the end recovers must give the same numbers
    folder = Folder(retention_ms=10**12)
    folder.recovered(range(PARTITIONS), _compact(durable))
    return folder


def test_folds_a_history_exactly() -> None:
    w = make_world(40, 4, START)
    folder = _run(_log(w.events), [])
    assert _numbers(folder) == _expected(w.expected)


def test_byte_identical_duplicates_count_once() -> None:
    w = make_world(40, 4, START)
    log = _log(w.events, dup_every=3)
    assert _numbers(_run(log, [])) == _expected(w.expected)
    live = Folder(retention_ms=10**12)
    live.recovered(range(PARTITIONS), [])
    for p, off, value in log:
        live.fold(p, off, value)
    assert _numbers(live) == _expected(w.expected)
    assert live.stats.repeats > 0


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_crashes_neither_double_count_nor_lose(data: st.DataObject) -> None:
    w = make_world(12, 3, START, seed=data.draw(st.integers(0, 5)))
    log = _log(w.events, dup_every=data.draw(st.sampled_from([0, 5])))
    n = data.draw(st.integers(0, 4))
    points = sorted(set(data.draw(st.lists(st.integers(0, len(log) - 1), max_size=n))))
    crashes = [(i, data.draw(st.integers(0, 30))) for i in points]
    assert _numbers(_run(log, crashes)) == _expected(w.expected)


def test_unknown_and_undecodable_records_are_skipped() -> None:
    folder = Folder(retention_ms=10**12)
    folder.recovered([0], [])
    assert folder.fold(0, 0, b"\xc3\x01garbage") == []
    assert folder.fold(0, 1, b"not avro") == []
    assert folder.stats.undecodable == 2
    # a partition not recovered yet is not folded (it is re-read from its cursor)
    assert folder.fold(1, 0, b"x") == []
    assert folder.stats.unowned == 1


def test_finished_runs_expire_active_ones_stay_and_late_repeats_are_ignored() -> None:
    w = make_world(30, 3, START)
    log = _log(w.events)
    folder = Folder(retention_ms=60 * 60_000)
    folder.recovered(range(PARTITIONS), [])
    for p, off, value in log:
        folder.fold(p, off, value)
    before = stats.active_runs(folder.runs())
    # an event two hours later on every partition moves the horizon past all of the history
    later = make_world(PARTITIONS * 8, 1, START + 4 * 3600_000, seed=99).events
    nxt = {p: (folder.resume_offset(p) or 0) for p in range(PARTITIONS)}
    for e in later:
        p = partition_for(e.session_id.encode(), PARTITIONS)
        folder.fold(p, nxt[p], CODEC.encode_event(e))
        nxt[p] += 1
    assert folder.stats.expired > 0
    assert all(r.active or r.started_at >= START + 4 * 3600_000 for r in folder.runs())
    old_active = sum(1 for r in folder.runs() if r.active and r.started_at < START + 3600_000)
    assert old_active == before["total"]
    assert not any(x.at < START + 3600_000 for x in folder.rejections())
    # a re-emission of an expired run's start is older than the horizon: ignored
    first = next(e for e in w.events if e.type == "run.started")
    p = partition_for(first.session_id.encode(), PARTITIONS)
    late = folder.stats.late
    writes = folder.fold(p, nxt[p], CODEC.encode_event(first))
    assert all(not k.startswith("r|") for k, _ in writes)
    assert folder.stats.late == late + 1


def test_durations_are_start_to_finish_per_minute_tenant_and_status() -> None:
    from sessionstream.runtimes.analytics.facts import RunFacts

    def run(rid: str, tenant: str, start: int, end: int | None, status: str | None) -> RunFacts:
        return RunFacts("s", rid, tenant, 0, 3, start, None, end, status)

    minute = 60_000
    records = [
        run("a", "acme", 0, 1_000, "completed"),
        run("b", "acme", 500, 3_500, "cancelled"),
        run("c", "globex", 0, minute + 2_000, "timed_out"),
        run("d", "acme", 0, None, None),  # still running: no duration yet
    ]
    got = stats.durations(records, stats.Window(0, 10 * minute))
    assert got["overall"] == {
        "count": 3,
        "p50": 3_000,
        "p90": minute + 2_000,
        "p99": minute + 2_000,
        "max": minute + 2_000,
    }
    assert got["tenants"]["acme"]["count"] == 2 and got["tenants"]["globex"]["max"] == 62_000
    assert set(got["byStatus"]) == {"completed", "cancelled", "timedOut"}
    assert [m["minute"] for m in got["minutes"]] == [0, minute]
    only = stats.durations(records, stats.Window(0, 10 * minute, tenant="globex"))
    assert only["overall"]["count"] == 1
