"""Questions to a person on the real stack (docs/protocol.md#questions-to-a-person): a
processor and two workers running `tests.integration.question_agent` (`ctx.ask_user`).

The holder asks and is killed -9 while it waits; the next holder asks the same question
again, for its generation and the original window; an answer naming the old generation is
refused `question_stale`, another tenant's refused; the SDK's answer is recorded once and
the run's result is the answer."""

from __future__ import annotations

import json
import uuid

import pytest

from sessionstream.adapters.kafka import read_topic
from sessionstream.client import SessionClient
from sessionstream.schemas.events import RunFinished
from sessionstream.settings import Settings
from tests.integration.helpers import check_log, wait_until
from tests.integration.procs import Proc, processor
from tests.integration.runtimes.worker.test_worker import run_events, terminal, wait_event

pytestmark = pytest.mark.integration

AGENT = "tests.integration.question_agent:run"


def _worker(s: Settings, worker_id: str) -> Proc:
    return Proc(s, "worker", "--worker-id", worker_id, "--lease-ms", "2000", "--agent", AGENT)


def test_a_takeover_asks_the_same_question_and_one_answer_completes_the_run(
    iso: Settings, procs: list[Proc]
) -> None:
    procs.append(processor(iso))
    first = _worker(iso, "w-q1").start()
    procs.append(first)
    first.wait_log("ready:", timeout=60)
    sid = f"ask-{uuid.uuid4().hex[:6]}"
    with SessionClient("tenant-w", iso, actor="user:bo") as c:
        out = c.wait(c.prompt(sid, "pay the hotel"), timeout=60)
        assert out.status == "accepted" and out.run_id
        run_id = out.run_id
        asked = wait_event(iso, run_id, "question.asked", procs=procs)
        assert asked.generation == 1
        # the holder dies while the person thinks; the next worker takes the run over
        first.kill9()
        procs.append(second := _worker(iso, "w-q2").start())
        second.wait_log("ready:", timeout=60)

        def again() -> bool:
            evs = [e for e in run_events(iso, run_id) if e.type == "question.asked"]
            return len(evs) == 2

        wait_until(again, timeout=30, interval=0.2, what="the new holder's question")
        re_asked = [e for e in run_events(iso, run_id) if e.type == "question.asked"][1]
        assert re_asked.generation == 2
        first_p, again_p = asked.payload.model_dump(), re_asked.payload.model_dump()
        assert again_p["expires_at"] == first_p["expires_at"]
        assert again_p["question_id"] == first_p["question_id"] == "question-1"
        # an answer for the old generation's question, and one from another tenant
        stale = c.wait(c.answer(sid, run_id, "question-1", "acme-travel", generation=1))
        assert (stale.status, stale.reason) == ("rejected", "question_stale")
        with SessionClient("tenant-x", iso, actor="mallory") as x:
            foreign = x.wait(x.answer(sid, run_id, "question-1", "acme-travel"))
        assert foreign.status == "rejected"
        answered = c.wait(c.answer(sid, run_id, "question-1", "acme-main"))
        assert answered.status == "accepted", answered
        # a second answer: the question is answered (or, the holder being quick, the run
        # has already completed with the first one)
        twice = c.wait(c.answer(sid, run_id, "question-1", "acme-travel"))
        assert twice.status == "rejected"
        assert twice.reason in ("question_not_open", "run_not_active"), twice
    assert terminal(iso, run_id, timeout=30) == "completed"
    evs = run_events(iso, run_id)
    done = next(e for e in evs if e.type == "run.finished").payload_as(RunFinished)
    assert json.loads(done.result or "null") == {"account": "acme-main"}
    answers = [e for e in evs if e.type == "question.answered"]
    assert len(answers) == 1 and answers[0].payload.model_dump()["answered_by"] == "user:bo"
    report = check_log(read_topic(iso, iso.events_topic))
    assert report.ok, report.violations
