"""A chat agent's tool loop on the real broker and database, with the OpenAI-compatible
adapter against the local model server: the holder is killed -9 after the model asked for a
tool and the tool's result was recorded; the new holder asks neither again (docs/workers.md
#chat: every chat call and every tool call is a durable step)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from sessionstream.schemas.events import LeaseGranted, RunFinished, StepRecorded
from sessionstream.settings import Settings
from tests.integration.helpers import wait_until
from tests.integration.procs import Proc, processor
from tests.integration.runtimes.worker.test_adapters import ThreadedServer
from tests.integration.runtimes.worker.test_worker import (
    prompt,
    ready,
    run_events,
    terminal,
    wait_event,
)

pytestmark = pytest.mark.integration

AGENT = "tests.integration.chat_agent:run"


def _worker(s: Settings, worker_id: str) -> Proc:
    return Proc(s, "worker", "--worker-id", worker_id, "--lease-ms", "2500", "--agent", AGENT)


def test_a_takeover_mid_tool_loop_asks_neither_the_model_nor_the_tool_again(
    iso: Settings, procs: list[Proc], tmp_path: Path
) -> None:
    calls = tmp_path / "calls.log"
    with ThreadedServer(token_ms=5) as server:
        ws = iso.model_copy(update={"model_base_url": server.url, "model_name": "chat-test"})
        procs.append(processor(iso))
        a = _worker(ws, "worker-a").start()
        procs.append(a)
        ready(a)
        session = f"chat-{uuid.uuid4().hex[:6]}"
        text = f"where is 42 call=lookup calls={calls} hold=tool"
        run_id = prompt(iso, session, text)
        grant = wait_event(iso, run_id, "run.lease_granted", procs=procs)
        assert grant.payload_as(LeaseGranted).worker_id == "worker-a"
        b = _worker(ws, "worker-b").start()
        procs.append(b)
        ready(b)

        def recorded() -> list[tuple[int, str]]:
            evs = run_events(iso, run_id)
            return [
                (e.generation, e.payload_as(StepRecorded).step_id)
                for e in evs
                if e.type == "step.recorded"
            ]

        wait_until(lambda: len(recorded()) == 2, timeout=60, what="model-1 and the tool recorded")
        wait_until(lambda: "holding 1" in calls.read_text(), timeout=30, what="worker-a holding")
        a.kill9()
        assert terminal(iso, run_id, timeout=90) == "completed"
        served = list(server.served)

    # the model was asked twice in all: for the tool (generation 1), for the answer (2)
    assert len(served) == 2, [s.body["messages"] for s in served]
    first, second = (s.body["messages"] for s in served)
    assert [m["role"] for m in first] == ["system", "user"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool"]
    assert json.loads(second[3]["content"]) == {
        "order": text[:40],
        "status": "in transit",
    }
    # the tool ran once, by generation 1, under the step's idempotency id
    assert calls.read_text().splitlines() == [f"tool 1 {run_id}/tool:lookup-1", "holding 1"]
    assert recorded() == [(1, "model-1"), (1, "tool:lookup-1"), (2, "model-2")]

    evs = run_events(iso, run_id)
    steps = {
        p.step_id: p for p in (e.payload_as(StepRecorded) for e in evs if e.type == "step.recorded")
    }
    # a replay shows what the model was asked and said, and what the tool got and returned
    asked = json.loads(steps["model-1"].input or "")
    assert asked["messages"] == first and asked["tools"][0]["function"]["name"] == "lookup"
    said = json.loads(steps["model-1"].result or "")
    assert said["toolCalls"][0]["function"]["name"] == "lookup"
    assert said["finishReason"] == "tool_calls"
    assert json.loads(steps["tool:lookup-1"].input or "") == {"order": text[:40]}
    finished = next(e for e in evs if e.type == "run.finished").payload_as(RunFinished)
    result = json.loads(finished.result or "")
    assert result["turns"] == 2
    assert result["answer"] == json.loads(steps["model-2"].result or "")["text"]
    # generation 2 made one model request of its own and started no tool
    started = [
        e.payload.model_dump()["call_id"]
        for e in evs
        if e.generation == 2 and e.type in ("model.request.started", "tool.started")
    ]
    assert started == ["model-2"]
    usage = [
        e.payload.model_dump()
        for e in evs
        if e.type == "model.request.finished" and e.generation == 2
    ]
    assert usage and usage[0]["model"] == "chat-test" and usage[0]["input_tokens"] > 0
