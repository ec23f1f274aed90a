"""Questions to a person through the gateway on the real stack (docs/http.md#questions): a
processor, a sink, the gateway and a worker running `tests.integration.question_agent`
(`ctx.ask_user`). Another tenant's key is refused as if the run did not exist, a body may
not name who answers nor leave the answer out, a question never asked is refused
`unknown_question`; the answer is recorded once, by the key's actor, and the run
completes."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from sessionstream.apps._procs import settings_env
from sessionstream.settings import Settings
from tests.integration.apps.gateway.test_console_browser import _css, _shot, _wait
from tests.integration.gateway_world import GatewayWorld, gateway_world
from tests.integration.helpers import wait_until
from tests.integration.procs import Proc

pytestmark = pytest.mark.integration

AGENT = "tests.integration.question_agent:run"
EXE = str(Path(sys.executable).with_name("sessionstream"))


@pytest.fixture(scope="module")
def world(settings: Settings) -> Iterator[GatewayWorld]:
    w = gateway_world(settings, "ask", gateway_key_cache_s=0.5)
    try:
        w.start()
        p = Proc(w.settings, "worker", "--worker-id", "w-ask", "--agent", AGENT).start()
        w.procs.append(p)
        p.wait_log("ready:", timeout=60)
        yield w
    finally:
        w.stop()


def _events(w: GatewayWorld, run_id: str, type_: str) -> list[dict[str, Any]]:
    with w.conn() as conn:
        rows = conn.execute(
            "select payload from agent_run_events where run_id = %s and type = %s order by seq",
            (run_id, type_),
        ).fetchall()
    return [r[0] if isinstance(r[0], dict) else json.loads(r[0]) for r in rows]


def _answer(http: httpx.Client, run_id: str, qid: str, **body: Any) -> httpx.Response:
    return http.post(f"/v1/runs/{run_id}/questions/{qid}/answer", json=body)


def test_answer_through_the_gateway_tenants_and_forged_actors(world: GatewayWorld) -> None:
    w = world
    acme = w.client(w.key("acme", "user:bo"))
    globex = w.client(w.key("globex", "mallory"))
    sid = f"ask-{uuid.uuid4().hex[:6]}"
    r = acme.post(
        f"/v1/sessions/{sid}/commands", json={"type": "prompt", "payload": {"text": "pay"}}
    )
    assert r.status_code == 200, r.text
    run_id = r.json()["runId"]
    asked = wait_until(
        lambda: _events(w, run_id, "question.asked"), timeout=30, what="the run's question"
    )
    assert asked[0]["questionId"] == "question-1" and asked[0]["question"] == "Which account?"
    # a person finds it open: in the run view and in `questions list` (another tenant's
    # list does not show it)
    view = acme.get(f"/v1/runs/{run_id}").json()["questions"]
    assert [(q["questionId"], q["status"]) for q in view] == [("question-1", "open")]
    listed = _cli(w, "questions", "list", "--json", "--tenant", "acme")
    assert [(q["runId"], q["questionId"]) for q in json.loads(listed.stdout)] == [
        (run_id, "question-1")
    ]
    assert json.loads(_cli(w, "questions", "list", "--json", "--tenant", "globex").stdout) == []
    # another tenant: as if unknown, nothing sent
    refused = _answer(globex, run_id, "question-1", answer="acme-travel")
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_found"
    # a body may not name who answers; an answer is required (null would be one)
    forged = _answer(acme, run_id, "question-1", answer="acme-main", answeredBy="ceo")
    assert forged.status_code == 400 and forged.json()["error"]["code"] == "forbidden_field"
    assert _answer(acme, run_id, "question-1").status_code == 400
    # a question never asked: rejected, recorded
    unknown = _answer(acme, run_id, "question-9", answer="acme-main")
    assert unknown.status_code == 409 and unknown.json()["reason"] == "unknown_question"
    ok = _answer(acme, run_id, "question-1", answer="acme-main")
    assert ok.status_code == 200, ok.text
    events = ok.json()["events"]
    assert [e["type"] for e in events] == ["question.answered"]
    assert events[0]["payload"]["answeredBy"] == "user:bo"
    again = _answer(acme, run_id, "question-1", answer="acme-travel")
    assert again.status_code == 409
    assert again.json()["reason"] in ("question_not_open", "run_not_active")

    def finished() -> dict[str, Any] | None:
        run = acme.get(f"/v1/runs/{run_id}")
        body = run.json() if run.status_code == 200 else {}
        return body if body.get("terminalStatus") else None

    run = wait_until(finished, timeout=30, what="the run's end")
    assert run["terminalStatus"] == "completed"
    assert len(_events(w, run_id, "question.answered")) == 1
    # the run view says who answered what; the CLI refuses an answer to a closed run's
    (q,) = run["questions"]
    assert (q["status"], q["answer"], q["answeredBy"]) == ("answered", "acme-main", "user:bo")
    late = _cli(w, "questions", "answer", run_id, "question-1", "x", "--text", "--tenant", "acme")
    assert late.returncode == 1, late.stdout + late.stderr


def _cli(w: GatewayWorld, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [EXE, *args],
        env=settings_env(w.settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    return done


def test_the_console_answers_an_open_question_and_shows_who(
    world: GatewayWorld, browser: WebDriver
) -> None:
    key = world.key("acme", "ui:alice")
    sid = f"ask-console-{uuid.uuid4().hex[:6]}"
    browser.get(f"{world.url}/?key={key}#/sessions/{sid}")
    _wait(browser, "live stream", 30, lambda d: _css(d, '#live[data-on="1"]'))
    r = world.client(key).post(
        f"/v1/sessions/{sid}/commands", json={"type": "prompt", "payload": {"text": "pay"}}
    )
    assert r.status_code == 200, r.text
    open_ = 'li.question[data-id="question-1"][data-status="open"]'
    _wait(browser, "the open question", 30, lambda d: _css(d, open_))
    item = browser.find_element(By.CSS_SELECTOR, open_)
    assert item.find_element(By.CSS_SELECTOR, ".what").text == "Which account?"
    _wait(
        browser,
        "time left",
        10,
        lambda d: "left" in d.find_element(By.CSS_SELECTOR, f"{open_} .left").text,
    )
    _shot(browser, "question-1-open")
    # words, not JSON: sent as a string, which the agent's Literal accepts
    item.find_element(By.CSS_SELECTOR, "input.answer-box").send_keys("acme-travel")
    item.find_element(By.CSS_SELECTOR, "button.answer").click()
    answered = 'li.question[data-id="question-1"][data-status="answered"] .decided'
    _wait(
        browser,
        "who answered",
        30,
        lambda d: "answered by ui:alice" in d.find_element(By.CSS_SELECTOR, answered).text,
    )
    _wait(
        browser, "completed run", 30, lambda d: d.find_element(By.ID, "status").text == "completed"
    )
    assert "answer question-1: accepted" in browser.find_element(By.ID, "outcomes").text
    (done,) = wait_until(
        lambda: _events(world, r.json()["runId"], "run.finished"), timeout=30, what="the end"
    )
    assert json.loads(done["result"]) == {"account": "acme-travel"}
    _shot(browser, "question-2-answered")
