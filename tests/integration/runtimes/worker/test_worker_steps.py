"""Durable steps on the real broker and database: a processor and two workers running
`tests.integration.step_agent`; the holder is killed -9 after a step was recorded, and
between a step's end and its record. Every model and tool call is counted in a file."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from sessionstream.schemas.events import LeaseGranted, StepDelivered, StepRecorded
from sessionstream.settings import Settings
from tests.integration.helpers import wait_until
from tests.integration.procs import Proc, processor
from tests.integration.runtimes.worker.test_worker import (
    prompt,
    ready,
    run_events,
    terminal,
    wait_event,
)

pytestmark = pytest.mark.integration

LEASE_MS = 2500
AGENT = "tests.integration.step_agent:run"


def _worker(s: Settings, worker_id: str) -> Proc:
    return Proc(
        s, "worker", "--worker-id", worker_id, "--lease-ms", str(LEASE_MS), "--agent", AGENT
    ).start()


def _calls(path: Path) -> Counter[str]:
    """Calls by kind and target: "model", "tool-start <idempotency id>", ... (the line
    without the worker that made it)."""
    out: Counter[str] = Counter()
    for line in path.read_text().splitlines() if path.exists() else []:
        kind, _who, *rest = line.split()
        out[" ".join([kind, *rest])] += 1
    return out


def _start(iso: Settings, procs: list[Proc], words: str, tmp_path: Path) -> tuple[Proc, Path, str]:
    """worker-a takes the run alone; worker-b, the standby, is up before the test kills a."""
    calls = tmp_path / "calls.log"
    procs.append(processor(iso))
    a = _worker(iso, "worker-a")
    procs.append(a)
    ready(a)
    run_id = prompt(iso, f"steps-{uuid.uuid4().hex[:6]}", f"flights calls={calls} {words}")
    grant = wait_event(iso, run_id, "run.lease_granted", procs=procs)
    assert grant.payload_as(LeaseGranted).worker_id == "worker-a"
    b = _worker(iso, "worker-b")
    procs.append(b)
    ready(b)
    return a, calls, run_id


def _take_over(iso: Settings, a: Proc, run_id: str) -> None:
    a.kill9()
    assert terminal(iso, run_id, timeout=90) == "completed"


def test_kill9_after_a_step_was_recorded_calls_each_recorded_step_once(
    iso: Settings, procs: list[Proc], tmp_path: Path
) -> None:
    a, calls, run_id = _start(iso, procs, "t1=3000 t2=8000", tmp_path)
    # killed while tool:search-2 runs: model-1 and tool:search-1 are recorded by then
    wait_until(
        lambda: _calls(calls)[f"tool-start {run_id}/tool:search-2"] == 1,
        timeout=60,
        what="worker-a in its second tool",
    )

    def recorded() -> list[str]:
        evs = run_events(iso, run_id)
        return [e.payload_as(StepRecorded).step_id for e in evs if e.type == "step.recorded"]

    wait_until(lambda: len(recorded()) == 2, timeout=30, what="two steps recorded")
    assert recorded() == ["model-1", "tool:search-1"]
    _take_over(iso, a, run_id)

    n = _calls(calls)
    # each recorded step's model and tool ran once, on worker-a only
    assert n["model"] == 1, n
    assert n[f"tool-start {run_id}/tool:search-1"] == 1, n
    assert n[f"tool-done {run_id}/tool:search-1"] == 1, n
    # the step that started and never finished ran again, under the same idempotency id
    assert n[f"tool-start {run_id}/tool:search-2"] == 2, n
    assert n[f"tool-done {run_id}/tool:search-2"] == 1, n

    evs = run_events(iso, run_id)
    grant = next(e for e in evs if e.type == "run.lease_granted" and e.generation == 2)
    g = grant.payload_as(LeaseGranted)
    assert g.worker_id == "worker-b"
    assert (g.checkpoint_ref, g.steps_delivered) == (f"s3://ckpt/{run_id}/1", 2)
    delivered = [e.payload_as(StepDelivered) for e in evs if e.type == "step.delivered"]
    assert [(d.step_id, d.generation) for d in delivered] == [("model-1", 1), ("tool:search-1", 1)]
    # worker-b started from the checkpoint and got worker-a's answers back
    finished = next(e for e in evs if e.type == "run.finished")
    result = json.loads(finished.payload.model_dump()["result"])
    assert result["contextRef"] == f"s3://ckpt/{run_id}/1"
    assert result["plan"] == "plan for flights"
    assert result["hits"] == ["hit after 3000 ms", "hit after 8000 ms"]
    # a replay shows what the model said and what each tool got and returned
    steps = {
        p.step_id: p for p in (e.payload_as(StepRecorded) for e in evs if e.type == "step.recorded")
    }
    assert sorted(steps) == ["model-1", "tool:search-1", "tool:search-2"]
    assert json.loads(steps["model-1"].result or "") == "plan for flights"
    assert json.loads(steps["tool:search-1"].input or "") == {"q": "plan for flights"}
    assert json.loads(steps["tool:search-1"].result or "") == ["hit after 3000 ms"]
    assert steps["tool:search-2"].worker_id == "worker-b"
    # generation 2 reported no call for the steps it got back
    started = [
        e.payload.model_dump()["call_id"]
        for e in evs
        if e.generation == 2 and e.type in ("model.request.started", "tool.started")
    ]
    assert started == ["tool:search-2"]


def test_kill9_between_a_steps_end_and_its_record_runs_that_step_again(
    iso: Settings, procs: list[Proc], tmp_path: Path
) -> None:
    a, calls, run_id = _start(iso, procs, "t1=200 t2=200 hold=model-1", tmp_path)
    wait_until(
        lambda: _calls(calls)["holding model-1"] == 1,
        timeout=60,
        what="worker-a holding after the model answered",
    )
    killed_at = time.time()
    _take_over(iso, a, run_id)
    evs = run_events(iso, run_id)
    # nothing of generation 1 was recorded: the model step runs again on worker-b, and
    # every step after it once
    assert not [e for e in evs if e.type == "step.recorded" and e.generation == 1]
    n = _calls(calls)
    assert n["model"] == 2, n
    assert n[f"tool-start {run_id}/tool:search-1"] == 1, n
    assert n[f"tool-start {run_id}/tool:search-2"] == 1, n
    recorded = [
        (e.generation, e.payload_as(StepRecorded).step_id) for e in evs if e.type == "step.recorded"
    ]
    assert recorded == [(2, "model-1"), (2, "tool:search-1"), (2, "tool:search-2")]
    grant = next(e for e in evs if e.type == "run.lease_granted" and e.generation == 2)
    assert grant.payload_as(LeaseGranted).steps_delivered == 0
    print(f"takeover after kill -9: {grant.ts / 1000 - killed_at:.2f}s")
    # worker-a's model request, started and never finished, was closed by the lease's loss
    closes = [
        (e.generation, e.payload.model_dump()["worker_id"], e.payload.model_dump()["detail"])
        for e in evs
        if e.type == "model.request.finished" and e.payload.model_dump()["call_id"] == "model-1"
    ]
    assert closes[0] == (2, "worker-a", "abandoned: lease_lost"), closes
    assert wait_event(iso, run_id, "run.finished").generation == 2


def test_a_step_result_over_the_inline_bound_comes_back_from_postgresql(
    iso: Settings, procs: list[Proc], tmp_path: Path
) -> None:
    """A tool result larger than the log holds inline (8 KiB) is stored in PostgreSQL by
    the worker and recorded by pointer; after a kill -9 the next holder reads it back from
    there instead of calling the tool again."""
    big = 20_000
    a, calls, run_id = _start(iso, procs, f"t1=200 t2=8000 big={big}", tmp_path)
    wait_until(
        lambda: _calls(calls)[f"tool-start {run_id}/tool:search-2"] == 1,
        timeout=60,
        what="worker-a in its second tool",
    )

    def stored() -> StepRecorded | None:
        for e in run_events(iso, run_id):
            if e.type == "step.recorded" and e.payload_as(StepRecorded).step_id == "tool:search-1":
                return e.payload_as(StepRecorded)
        return None

    rec = wait_until(stored, timeout=30, what="tool:search-1 recorded")
    assert rec.result is None and (rec.result_ref or "").startswith(f"pg:{run_id}/tool:search-1#")
    _take_over(iso, a, run_id)
    n = _calls(calls)
    assert n[f"tool-start {run_id}/tool:search-1"] == 1, n  # not called again: read back
    finished = next(e for e in run_events(iso, run_id) if e.type == "run.finished")
    result = json.loads(finished.payload.model_dump()["result"])
    assert result["hits"] == ["hit after 200 ms", "x" * big, "hit after 8000 ms"]
