"""The worker fault suite: 4 workers, 50 concurrent runs, the holder killed or frozen.

One round of `kill -9` and one of SIGSTOP/SIGCONT (`make soak`: three of each), each on
the worker that holds the most runs of a fresh batch of 50 (a tenth of them aborted by
their user). After each round: every run ends with exactly one terminal status; every
completed run sent its email exactly once and no cancelled run sent any; every action a
faulted worker's runs executed belongs to the generation that finished them; a frozen
worker, resumed, wrote nothing but stale records. The takeover time of every run of the
faulted worker (fault -> next grant, on the broker's clock) is printed and kept in
`worker_suite.json` under the test's tmp dir; the figures are judged by
`bench/bench_worker.py`, not here.
"""

from __future__ import annotations

import json
import signal
import statistics
import time
import uuid
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from sessionstream.adapters.kafka import read_topic
from sessionstream.adapters.registry import reader_codec
from sessionstream.client import SessionClient
from sessionstream.schemas.events import Event, LeaseGranted, RunFinished
from sessionstream.settings import Settings, get_settings
from tests.integration.faults import SOAK
from tests.integration.helpers import check_log, wait_until
from tests.integration.procs import Proc, processor
from tests.integration.runtimes.worker import test_worker as _tw
from tests.integration.runtimes.worker.test_worker import ready, start_worker

pytestmark = pytest.mark.integration

db = _tw.db  # (`iso` is conftest's)

WORKERS = 4
RUNS = 50
LEASE_MS = 2000
#: long enough for a fault and a takeover mid-run; the email is the run's last step
TEXT = "steps=3 tool_ms=1500 email=end"
CODEC = reader_codec(get_settings())


def _events(s: Settings) -> list[Event]:
    return [CODEC.decode_event(r.value or b"") for r in read_topic(s, s.events_topic)]


def _holders(evs: list[Event], runs: set[str]) -> dict[str, str]:
    """run -> the worker holding its lease now (runs nobody holds are absent)."""
    holder: dict[str, str] = {}
    for e in evs:
        if e.run_id not in runs:
            continue
        if e.type == "run.lease_granted":
            holder[e.run_id] = e.payload_as(LeaseGranted).worker_id
        elif e.type in ("run.lease_expired", "run.lease_released", "run.finished"):
            holder.pop(e.run_id, None)
    return holder


def _accepted_from_non_holder(evs: list[Event], runs: set[str], worker: str) -> list[Event]:
    """`worker`'s writes to `runs` the log accepted while another worker held the lease, or
    none did after it lost it (the single-writer rule). Read from the log itself, not from
    the clock: a command the worker produced just before it was frozen may be appended
    after the test's fault time, while its lease still held, and is rightly accepted."""
    holder: dict[str, str | None] = {}
    lost: set[str] = set()
    out = []
    for e in evs:
        if e.run_id not in runs:
            continue
        if e.type == "run.lease_granted":
            holder[e.run_id] = e.payload_as(LeaseGranted).worker_id
            if holder[e.run_id] != worker:
                lost.add(e.run_id)
        elif e.type in ("run.lease_expired", "run.lease_released", "run.finished"):
            holder[e.run_id] = None
            if e.type == "run.lease_expired":
                lost.add(e.run_id)
        elif (
            e.run_id in lost
            and holder.get(e.run_id) != worker
            and e.type != "run.stale_write_recorded"
            # the ends a lease expiry gives the calls the holder left open name it, but are
            # the processor's (caused by its timer), not the worker's writes
            and not e.command_id.startswith("timer:")
            and e.payload.model_dump().get("worker_id") == worker
        ):
            out.append(e)
    return out


def _leased_once(evs: list[Event], runs: set[str]) -> set[str]:
    """The runs of `runs` some worker has been granted a lease on."""
    return {e.run_id for e in evs if e.type == "run.lease_granted" and e.run_id in runs}


def _round(
    s: Settings, db: str, workers: dict[str, Proc], fault: str, n: int, out: list[dict[str, object]]
) -> None:
    tag = uuid.uuid4().hex[:6]
    sessions = [f"suite-{tag}-{i}" for i in range(RUNS)]
    with SessionClient("tenant-s", s) as c:
        handles = [c.prompt(sid, TEXT) for sid in sessions]
        runs = {sid: c.wait(h, timeout=60).run_id for sid, h in zip(sessions, handles, strict=True)}
        assert all(runs.values())
        run_ids = {r for r in runs.values() if r}
        # every run leased (and working) before the fault; "all held at one instant" is
        # not it: on a busy machine the first runs can end before the last are leased
        wait_until(
            lambda: _leased_once(_events(s), run_ids) == run_ids,
            timeout=60,
            what="all runs leased",
        )
        # a tenth of the users press stop
        aborted = {runs[sid] for sid in sessions[::10]}
        for sid in sessions[::10]:
            c.submit(c.command(sid, "abort", {"reason": "user"}, run_id=runs[sid]), track=False)
        c.flush()
    holders = _holders(_events(s), run_ids)
    victim, held = Counter(holders.values()).most_common(1)[0]
    victim_runs = {r for r, w in holders.items() if w == victim}
    proc = workers[victim]
    assert proc.popen is not None
    faulted_at = time.time() * 1000
    if fault == "kill":
        proc.kill9()
    else:
        proc.popen.send_signal(signal.SIGSTOP)

    def taken_over() -> bool:
        now = _holders(_events(s), victim_runs)
        ended = {e.run_id for e in _events(s) if e.type == "run.finished"}
        return all(r in ended or now.get(r, victim) != victim for r in victim_runs)

    try:
        wait_until(taken_over, timeout=60, interval=0.2, what=f"{victim}'s {held} runs taken over")
    finally:
        if fault == "stop":
            proc.popen.send_signal(signal.SIGCONT)
    if fault == "kill":
        workers[victim] = start_worker(s, victim, LEASE_MS)
        ready(workers[victim])
    # every run ends, once
    ended: dict[str, list[Event]] = {}

    def all_ended() -> bool:
        ended.clear()
        for e in _events(s):
            if e.run_id in run_ids and e.type == "run.finished":
                ended.setdefault(e.run_id, []).append(e)
        return len(ended) == RUNS

    wait_until(all_ended, timeout=120, interval=0.5, what="every run to end")
    assert all(len(v) == 1 for v in ended.values())
    status = {r: v[0].payload_as(RunFinished).terminal_status for r, v in ended.items()}
    evs = _events(s)
    takeovers = []
    for r in victim_runs:
        later = [
            e.ts
            for e in evs
            if e.run_id == r
            and e.type == "run.lease_granted"
            and e.ts >= faulted_at - 1000
            and e.payload_as(LeaseGranted).worker_id != victim
        ]
        if later:
            takeovers.append(min(later) - faulted_at)
    with psycopg.connect(db) as conn:
        mail = Counter(
            str(r)
            for (r,) in conn.execute(
                "select run_id from agent_outbox where run_id = any(%s)", (list(run_ids),)
            )
        )
        done_by = {
            str(r): int(g)
            for r, g in conn.execute(
                "select run_id, generation from agent_actions where run_id = any(%s)",
                (list(run_ids),),
            )
        }
    final_gen = {r: v[0].generation for r, v in ended.items()}
    for r in run_ids:
        if status[r] == "completed":
            assert mail[r] == 1, f"completed run {r} sent {mail[r]} emails"
        else:
            assert mail[r] == 0, f"{status[r]} run {r} sent an email"
        if r in done_by:
            assert done_by[r] == final_gen[r], f"run {r}: an action of a fenced generation"
    assert sum(1 for r in aborted if status[r] == "cancelled") >= len(aborted) // 2, (
        "the aborts reached their runs"
    )
    # resumed (stop) or restarted (kill), the victim's writes to the runs taken from it are
    # fenced: only stale records of them follow the takeover
    fenced = _accepted_from_non_holder(evs, victim_runs, victim)
    assert not fenced, [(e.run_id, e.seq, e.type) for e in fenced]
    summary = {
        "round": n,
        "fault": fault,
        "victim": victim,
        "runs_held": held,
        "takeover_ms": sorted(round(t) for t in takeovers),
        "statuses": dict(Counter(status.values())),
    }
    out.append(summary)
    med = statistics.median(takeovers) if takeovers else float("nan")
    print(
        f"round {n} {fault}: {victim} held {held} runs; takeover median {med:.0f} ms, "
        f"max {max(takeovers, default=0):.0f} ms (lease {LEASE_MS} ms); {summary['statuses']}"
    )


def test_holders_killed_and_frozen_lose_nothing(
    iso: Settings, db: str, procs: list[Proc], tmp_path: Path
) -> None:
    procs.append(processor(iso))
    workers = {f"sw{i}": start_worker(iso, f"sw{i}", LEASE_MS) for i in range(WORKERS)}
    ready(*workers.values())
    results: list[dict[str, object]] = []
    try:
        for n, fault in enumerate(["kill", "stop"] * (3 if SOAK else 1), 1):
            _round(iso, db, workers, fault, n, results)
    finally:
        procs.extend(workers.values())
        (tmp_path / "worker_suite.json").write_text(json.dumps(results, indent=2))
        print(f"takeover times: {tmp_path / 'worker_suite.json'}")
    assert check_log(read_topic(iso, iso.events_topic)).ok
    for w in workers.values():
        w.assert_alive()
