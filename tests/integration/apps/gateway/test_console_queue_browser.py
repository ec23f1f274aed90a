"""The console's queue in a real browser (headless Chromium, as test_console_browser.py):
the waiting tasks behind a running run are listed in start order with who queued them, a
task's Remove button takes it out (DELETE .../queue/{commandId}: `run.dequeued`), a task
queued meanwhile appears live, and Clear queue empties it. No worker runs, so the first
run stays running and the tasks keep waiting. A browser that cannot start fails the test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from sessionstream.settings import Settings
from tests.integration.apps.gateway.test_console_browser import _css, _shot, _wait
from tests.integration.gateway_world import GatewayWorld, gateway_world

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def world(settings: Settings) -> Iterator[GatewayWorld]:
    w = gateway_world(settings, "console-queue")
    try:
        yield w.start()
    finally:
        w.stop()


def _queued(driver: WebDriver) -> list[str]:
    """The command ids of the queue list's items, in order (read in one script)."""
    ids = driver.execute_script(
        "return [...document.querySelectorAll('#queue-list li')].map(li => li.dataset.commandId)"
    )
    return [str(x) for x in ids]


def _prompt(http: httpx.Client, sid: str, cid: str, text: str, policy: str) -> None:
    r = http.post(
        f"/v1/sessions/{sid}/commands",
        json={"type": "prompt", "commandId": cid, "payload": {"text": text, "policy": policy}},
    )
    assert r.status_code == 200, r.text


def test_console_lists_the_queue_and_removes_a_task(
    world: GatewayWorld, browser: WebDriver
) -> None:
    tenant = f"cq{uuid.uuid4().hex[:6]}"
    key = world.key(tenant, "ui:ana")
    http = world.client(world.key(tenant, "api:bo"))
    sid = "queue"
    _prompt(http, sid, "task-a", "plan the offsite", "reject")
    _prompt(http, sid, "task-b", "book the venue", "enqueue")
    _prompt(http, sid, "task-c", "send the invites", "enqueue")
    world.wait_sink(f"{tenant}:{sid}", "run.queued")

    browser.get(f"{world.url}/#key={key}")
    browser.get(f"{world.url}/#/sessions/{sid}")
    _wait(browser, "live stream", 30, lambda d: _css(d, '#live[data-on="1"]'))
    _wait(browser, "two queued tasks", 30, lambda d: _queued(d) == ["task-b", "task-c"])
    first = browser.execute_script(
        "return document.querySelector('#queue-list li[data-command-id=\"task-b\"]').innerText"
    )
    assert "book the venue" in first and "api:bo" in first
    assert browser.find_element(By.ID, "queue").text == "2 queued"

    # a task queued meanwhile (another producer) appears live, at the back
    _prompt(http, sid, "task-d", "order lunch", "enqueue")
    _wait(browser, "live queued task", 30, lambda d: _queued(d) == ["task-b", "task-c", "task-d"])
    _shot(browser, "queue-1-listed")

    # Remove: the task leaves the list, and the session's log says who removed it
    browser.find_element(
        By.CSS_SELECTOR, '#queue-list li[data-command-id="task-b"] button.remove'
    ).click()
    _wait(browser, "task-b removed", 30, lambda d: _queued(d) == ["task-c", "task-d"])
    _wait(
        browser,
        "dequeue outcome",
        10,
        lambda d: "dequeue: accepted" in d.find_element(By.ID, "outcomes").text,
    )
    world.wait_sink(f"{tenant}:{sid}", "run.dequeued")
    with world.conn() as conn:
        row = conn.execute(
            "select payload->>'actor', payload->>'queuedBy' from agent_run_events"
            " where session_id = %s and type = 'run.dequeued'",
            (f"{tenant}:{sid}",),
        ).fetchone()
    assert row == ("ui:ana", "api:bo")

    # Clear queue: nothing waits; the running run goes on
    browser.find_element(By.ID, "clear-queue").click()
    _wait(browser, "empty queue", 30, lambda d: _queued(d) == [])
    assert not browser.find_element(By.ID, "queue-wrap").is_displayed()
    assert browser.find_element(By.ID, "status").text == "running"
    _shot(browser, "queue-2-cleared")

    # a reload rebuilds the same picture from PostgreSQL: running, nothing waiting
    world.wait_sink(f"{tenant}:{sid}", "run.dequeued")
    assert http.get(f"/v1/sessions/{sid}").json()["queue"] == []
    browser.refresh()
    _wait(browser, "reloaded session", 30, lambda d: _css(d, '#live[data-on="1"]'))
    _wait(
        browser, "reloaded status", 30, lambda d: d.find_element(By.ID, "status").text == "running"
    )
    assert _queued(browser) == [] and not browser.find_element(By.ID, "queue-wrap").is_displayed()
