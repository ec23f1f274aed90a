"""Workers that die or pause: takeover by generation + 1, stale writes fenced, one email."""

from __future__ import annotations

import signal
import time
import uuid

import pytest

from sessionstream.adapters.kafka import read_topic
from sessionstream.schemas.events import LeaseGranted, RunFinished, StaleWriteRecorded
from sessionstream.settings import Settings
from tests.integration.helpers import check_log, wait_until
from tests.integration.procs import Proc, processor
from tests.integration.runtimes.worker import test_worker as _tw
from tests.integration.runtimes.worker.test_worker import (
    actions,
    outbox,
    prompt,
    ready,
    run_events,
    start_worker,
    terminal,
    wait_event,
)

pytestmark = pytest.mark.integration

# the fixture of test_worker.py, shared
db = _tw.db  # (`iso` is conftest's)

LEASE_MS = 2500


def _granted(s: Settings, run_id: str) -> list[tuple[str, int]]:
    return [
        (e.payload_as(LeaseGranted).worker_id, e.generation)
        for e in run_events(s, run_id)
        if e.type == "run.lease_granted"
    ]


def _start_a_then_b(
    iso: Settings, procs: list[Proc], text: str, wait_for: str
) -> tuple[Proc, Proc, str]:
    """A alone takes the run; B joins once A is at `wait_for` (B is the standby)."""
    procs.append(processor(iso))
    a = start_worker(iso, "worker-a", LEASE_MS)
    procs.append(a)
    ready(a)
    run_id = prompt(iso, f"fault-{uuid.uuid4().hex[:6]}", text)
    wait_event(iso, run_id, wait_for, procs=procs)
    assert _granted(iso, run_id) == [("worker-a", 1)]
    b = start_worker(iso, "worker-b", LEASE_MS)
    procs.append(b)
    ready(b)
    return a, b, run_id


def test_kill9_worker_mid_run_another_takes_over_and_the_email_runs_once(
    iso: Settings, db: str, procs: list[Proc]
) -> None:
    # the email goes out first, then a long tool: the crash lands after the action ran
    a, b, run_id = _start_a_then_b(iso, procs, "steps=1 tool_ms=7000 email=start", "tool.started")
    assert outbox(db, run_id), "worker A sent the email before the crash"
    killed_at = time.time()
    a.kill9()
    wait_until(lambda: len(_granted(iso, run_id)) == 2, timeout=60, what="the lease granted again")
    assert _granted(iso, run_id) == [("worker-a", 1), ("worker-b", 2)]
    takeover = next(
        e for e in run_events(iso, run_id) if e.type == "run.lease_granted" and e.generation == 2
    )
    print(f"takeover after kill -9: {takeover.ts / 1000 - killed_at:.2f}s")
    assert terminal(iso, run_id, timeout=60) == "completed"
    evs = run_events(iso, run_id)
    types = [e.type for e in evs]
    expired = types.index("run.lease_expired")
    assert evs[expired].generation == 2
    # after the expiry everything is generation 2, the result included
    assert all(e.generation == 2 for e in evs[expired:])
    assert evs[-1].type == "run.finished" and evs[-1].generation == 2
    # the gate answered B with A's decision; the executor returned A's recorded result
    assert "action.decision_replayed" in types
    assert len(outbox(db, run_id)) == 1
    assert actions(db, run_id) == [(f"{run_id}:email:start", 1, "done")]
    b.assert_alive()
    assert check_log(read_topic(iso, iso.events_topic)).ok


def test_paused_worker_comes_back_fenced_and_its_writes_are_recorded_as_stale(
    iso: Settings, db: str, procs: list[Proc]
) -> None:
    a, _b, run_id = _start_a_then_b(iso, procs, "steps=1 tool_ms=9000 email=end", "tool.started")
    assert a.popen is not None
    a.popen.send_signal(signal.SIGSTOP)
    try:
        wait_until(
            lambda: len(_granted(iso, run_id)) == 2, timeout=60, what="B granted generation 2"
        )
    finally:
        a.popen.send_signal(signal.SIGCONT)
    assert _granted(iso, run_id) == [("worker-a", 1), ("worker-b", 2)]

    def stale_from_a() -> list[StaleWriteRecorded]:
        return [
            e.payload_as(StaleWriteRecorded)
            for e in run_events(iso, run_id)
            if e.type == "run.stale_write_recorded"
        ]

    # Resumed, A stops the run by itself, whichever it learns first: that its own count of
    # the lease ran out, or that the processor expired it. Either way it says so with its
    # old generation, which the processor refuses and records in the run's trail.
    wait_until(stale_from_a, timeout=30, what="A's late write recorded as stale")
    for stale in stale_from_a():
        assert stale.worker_id == "worker-a" and stale.command_type == "lease.release"
        assert stale.stale_generation == 1 and stale.current_generation == 2
    a.wait_log(f"run {run_id}: self-fenced at generation 1", timeout=30)
    assert terminal(iso, run_id, timeout=60) == "completed"
    evs = run_events(iso, run_id)
    final = evs[-1]
    assert final.generation == 2 and final.payload_as(RunFinished).result
    # nothing from A was applied after the expiry: its writes exist only as stale records
    # (the expiry itself, and the ends it gives the calls A left open, name A but are the
    # processor's, caused by its timer)
    expired = [e.type for e in evs].index("run.lease_expired")
    applied_from_a = [
        e
        for e in evs[expired:]
        if e.payload.model_dump().get("worker_id") == "worker-a"
        and e.type not in ("run.stale_write_recorded", "run.lease_expired")
        and not e.command_id.startswith("timer:")
    ]
    assert any(
        e.payload.model_dump().get("detail") == "abandoned: lease_lost" for e in evs[expired:]
    ), "the tool A left running was not closed by the expiry"
    assert not applied_from_a, applied_from_a
    assert len(outbox(db, run_id)) == 1
    assert actions(db, run_id) == [(f"{run_id}:email:end", 2, "done")]
    a.assert_alive()
    assert check_log(read_topic(iso, iso.events_topic)).ok
