"""The web console in a real browser: headless Chromium (Debian's `chromium` and
`chromium-driver`, which `make test` installs) driven by selenium against a real gateway,
processor, sink, worker and analytics app. Open the console, send a prompt, watch the
run's timeline grow live and the model's answer stream in, abort it, see `cancelled`; then
the stats page draws its charts.
Screenshots go to tests/artifacts/ (git-ignored). A browser that cannot start fails the
test: it is never skipped.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from sessionstream.adapters.kafka import read_topic
from sessionstream.settings import Settings
from tests.integration.gateway_world import GatewayWorld, gateway_world

pytestmark = pytest.mark.integration

ARTIFACTS = Path(__file__).resolve().parents[3] / "artifacts"


@pytest.fixture(scope="module")
def world(settings: Settings) -> Iterator[GatewayWorld]:
    w = gateway_world(settings, "console")
    try:
        yield w.start(workers=1, analytics=True)
    finally:
        w.stop()


def _shot(driver: WebDriver, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / f"console-{name}.png"))


def _wait(driver: WebDriver, what: str, timeout: float, cond: object) -> object:
    try:
        wait = WebDriverWait(
            driver,
            timeout,
            poll_frequency=0.1,
            ignored_exceptions=(StaleElementReferenceException,),
        )
        return wait.until(cond)  # type: ignore[arg-type]
    except Exception as e:
        _shot(driver, f"failed-{what.replace(' ', '-')}")
        logs = driver.get_log("browser") if hasattr(driver, "get_log") else []
        raise AssertionError(f"console: no {what} within {timeout}s; browser log: {logs}") from e


def _open_tool_width(driver: WebDriver) -> float:
    """The widest open tool bar, read in one script (the SVG is redrawn every 250 ms, so
    an element found a moment ago may be gone)."""
    return float(
        driver.execute_script(
            "return Math.max(0, ...[...document.querySelectorAll("
            "'rect.bar.tool[data-state=\"open\"]')].map(r => +r.getAttribute('width')))"
        )
    )


def _css(driver: WebDriver, selector: str) -> list[object]:
    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def test_console_sends_a_prompt_shows_the_live_timeline_and_aborts(
    world: GatewayWorld, browser: WebDriver
) -> None:
    key = world.key("acme", "ui:alice")
    sid = f"console-{uuid.uuid4().hex[:8]}"
    browser.get(f"{world.url}/?key={key}#/sessions/{sid}")
    _wait(browser, "live stream", 30, lambda d: _css(d, '#live[data-on="1"]'))
    assert "key=" not in browser.current_url, "the key does not stay in the address bar"
    assert "tenant acme" in browser.find_element(By.ID, "whoami").text

    text = browser.find_element(By.ID, "text")
    text.send_keys("compile the report steps=4 tool_ms=3000 model_ms=300 email=end")
    browser.find_element(By.ID, "send").click()

    # the run starts and its bars appear while it runs: model requests, then a tool
    _wait(
        browser,
        "running status",
        30,
        lambda d: d.find_element(By.ID, "status").text == "running",
    )
    _wait(browser, "lease mark", 30, lambda d: _css(d, 'g.mark[data-type="run.lease_granted"]'))
    _wait(browser, "model bar", 30, lambda d: _css(d, "rect.bar.model"))
    # the model's answer streams in (token deltas), then its call is finished
    _wait(
        browser,
        "streamed answer",
        30,
        lambda d: d.find_element(By.ID, "answer").text.startswith("answer["),
    )
    _wait(
        browser,
        "finished answer",
        30,
        lambda d: d.find_element(By.ID, "answer").get_attribute("data-state") == "done",
    )
    _wait(browser, "open tool bar", 30, lambda d: _css(d, 'rect.bar.tool[data-state="open"]'))
    _shot(browser, "1-running")
    width = _open_tool_width(browser)
    _wait(browser, "growing tool bar", 10, lambda d: _open_tool_width(d) > width)

    browser.find_element(By.ID, "abort").click()
    _wait(browser, "cancel mark", 30, lambda d: _css(d, 'g.mark[data-type="run.cancel_requested"]'))
    _wait(
        browser,
        "cancelled status",
        45,
        lambda d: d.find_element(By.ID, "status").text == "cancelled",
    )
    assert _css(browser, 'g.terminal[data-status="cancelled"]')
    assert _css(browser, 'g.mark[data-type="run.cancel_acknowledged"]'), "the worker acked"
    assert _css(browser, "rect.bar.tool"), "the tool is on the timeline"
    assert not _css(browser, 'rect.bar[data-state="open"]'), "nothing runs after the cancel"
    outcomes = browser.find_element(By.ID, "outcomes").text
    assert "send: accepted" in outcomes and "abort: accepted" in outcomes
    # the sessions list follows the log too: the session's run is over
    _wait(
        browser,
        "idle session in the list",
        15,
        lambda d: _css(d, f'li[data-session="{sid}"] .badge[data-status="idle"]'),
    )
    _shot(browser, "2-cancelled")

    # a reload rebuilds the same picture from PostgreSQL
    browser.refresh()
    _wait(
        browser, "replayed terminal", 30, lambda d: _css(d, 'g.terminal[data-status="cancelled"]')
    )
    assert _css(browser, "rect.bar.model") and _css(browser, "rect.bar.tool")
    _wait(browser, "session in the list", 15, lambda d: _css(d, f'li[data-session="{sid}"]'))
    _shot(browser, "3-replayed")

    # the stats page: the cancelled run is counted by the analytics app
    browser.get(f"{world.url}/#/stats")
    _wait(browser, "runs chart", 90, lambda d: _css(d, '#chart-runs rect[data-key="cancelled"]'))
    _wait(browser, "cancel latency", 30, lambda d: _css(d, "#chart-cancel circle"))
    assert "1 active" not in browser.find_element(By.ID, "stats-active").text
    _shot(browser, "4-stats")


def test_the_event_stream_carries_each_model_calls_token_deltas(world: GatewayWorld) -> None:
    """Over SSE, as a client sees them: `model.delta` events without an id (never resumed),
    per model call numbered from 1 without a gap, between the call's started and finished
    events, joined to the answer the run recorded."""
    import httpx

    from tests.integration.gateway_world import SSE

    key = world.key("acme")
    sid = f"deltas-{uuid.uuid4().hex[:8]}"
    seen: list[tuple[str | None, str | None, dict[str, object]]] = []
    with world.client(key) as c, c.stream("GET", f"/v1/sessions/{sid}/events") as resp:
        assert resp.status_code == 200
        stream = SSE(resp)
        r = c.post(
            f"/v1/sessions/{sid}/commands",
            json={"type": "prompt", "payload": {"text": "steps=1 tool_ms=0 model_ms=400 email=no"}},
        )
        assert r.status_code == 200, r.text
        run_id = r.json()["runId"]
        for eid, event, data in stream:
            seen.append((eid, event, data))
            if event == "run.finished" and data.get("runId") == run_id:
                break
    assert isinstance(resp, httpx.Response)
    deltas = [d for _, e, d in seen if e == "model.delta"]
    published = [
        json.loads(r.value or b"")
        for r in read_topic(world.settings, world.settings.deltas_topic)
        if json.loads(r.value or b"").get("runId") == run_id
    ]
    assert deltas, ([e for _, e, _ in seen], published)
    assert [d["seq"] for d in deltas] == [d["seq"] for d in published], published
    assert all(eid is None for eid, e, _ in seen if e == "model.delta"), "deltas carry no id"
    assert {d["runId"] for d in deltas} == {run_id} and {d["sessionId"] for d in deltas} == {sid}
    started = [d for _, e, d in seen if e == "model.request.started"]
    assert len(started) == 1
    call_id = started[0]["payload"]["callId"]  # type: ignore[index]
    assert {d["callId"] for d in deltas} == {call_id}
    assert [d["seq"] for d in deltas] == list(range(1, len(deltas) + 1))
    kinds = [e for _, e, _ in seen if e and e.startswith("model.")]
    # the answer streamed: pieces came between the call's start and its end (the last one
    # is sent as the call ends, on another topic than the finished event: either first)
    assert kinds[0] == "model.request.started", kinds
    assert kinds.index("model.delta") < kinds.index("model.request.finished"), kinds
    finished = next(d for _, e, d in seen if e == "run.finished")
    answer = "".join(str(d["text"]) for d in deltas)
    assert finished["payload"]["result"] == f"done: {answer}"  # type: ignore[index]
