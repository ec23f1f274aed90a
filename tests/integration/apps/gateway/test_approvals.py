"""Approval at the action gate on the real stack: a processor whose settings say payments
need a person (`SESSIONSTREAM_APPROVAL_KINDS=payment`), a sink, the gateway and two workers
running `tests.integration.approval_agent` (it asks to pay once per run, through
`ctx.action(kind="payment")`, and counts each payment made in a file).

One run is approved through the gateway (the actor taken from the key) after its holder was
killed -9 while the payment was pending: the next holder waits on the same pending decision,
one approval, one payment. Another is denied; another tenant's key is refused as if the run
did not exist; the SDK's approve after the deny is rejected with the reason; the CLI lists
what waits; the audit's approval point passes, then fails on a planted execution."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from sessionstream.adapters.postgres import connect
from sessionstream.apps._procs import settings_env
from sessionstream.client import SessionClient
from sessionstream.runtimes.sink.audit import Check, run_audit
from sessionstream.runtimes.worker._approval import args_digest
from sessionstream.settings import Settings
from tests.integration.apps.gateway.test_console_browser import _css, _shot, _wait
from tests.integration.gateway_world import SSE, GatewayWorld, gateway_world
from tests.integration.helpers import wait_until
from tests.integration.procs import Proc

pytestmark = pytest.mark.integration

AGENT = "tests.integration.approval_agent:run"
LEASE_MS = 2500
DIGEST = args_digest({"amount": 42})
EXE = str(Path(sys.executable).with_name("sessionstream"))


@pytest.fixture(scope="module")
def world(settings: Settings) -> Iterator[GatewayWorld]:
    """The stack and two workers (the first test kills one: the others need one alive)."""
    w = gateway_world(settings, "appr", approval_kinds="payment", gateway_key_cache_s=0.5)
    try:
        w.start()
        for wid in ("worker-a", "worker-b"):
            _worker(w, wid)
        for p in w.procs[-2:]:
            p.wait_log("ready:", timeout=60)
        yield w
    finally:
        w.stop()


def _workers(w: GatewayWorld) -> dict[str, Proc]:
    return {p.args[2]: p for p in w.procs if p.args[:1] == ["worker"]}


def _worker(w: GatewayWorld, worker_id: str) -> Proc:
    p = Proc(
        w.settings,
        "worker",
        "--worker-id",
        worker_id,
        "--lease-ms",
        str(LEASE_MS),
        "--agent",
        AGENT,
    ).start()
    w.procs.append(p)
    return p


def _calls(path: Path) -> Counter[str]:
    """ "asked <key>" / "paid <key>" lines, without the worker that wrote them."""
    out: Counter[str] = Counter()
    for line in path.read_text().splitlines() if path.exists() else []:
        what, _who, key = line.split()
        out[f"{what} {key}"] += 1
    return out


def _run(http: httpx.Client, run_id: str) -> dict[str, Any]:
    r = http.get(f"/v1/runs/{run_id}")
    return r.json() if r.status_code == 200 else {}


def _pending(http: httpx.Client, run_id: str, generation: int) -> dict[str, Any] | None:
    for a in _run(http, run_id).get("actions", []):
        if a["decision"] == "pending" and a["generation"] == generation:
            return dict(a)
    return None


def _finished(http: httpx.Client, run_id: str) -> dict[str, Any] | None:
    run = _run(http, run_id)
    return run if run.get("terminalStatus") else None


def _decide(http: httpx.Client, run_id: str, key: str, verb: str, **body: Any) -> httpx.Response:
    return http.post(f"/v1/runs/{run_id}/actions/{key}/{verb}", json=body)


def test_approve_deny_tenants_and_a_takeover_while_pending(
    world: GatewayWorld, tmp_path: Path
) -> None:
    w, calls = world, tmp_path / "calls.log"
    acme = w.client(w.key("acme", "user:bo"))
    globex = w.client(w.key("globex", "mallory"))
    workers = _workers(w)

    # -- run A: pending, visible, refused to another tenant -------------------------------
    sid = f"pay-{uuid.uuid4().hex[:6]}"
    r = acme.post(
        f"/v1/sessions/{sid}/commands",
        json={"type": "prompt", "payload": {"text": f"calls={calls} amount=42"}},
    )
    assert r.status_code == 200, r.text
    run_a = r.json()["runId"]
    key_a = f"pay-{run_a}"
    first = wait_until(lambda: _pending(acme, run_a, 1), timeout=30, what="run A's payment pending")
    assert (first["key"], first["kind"], first["argsDigest"]) == (key_a, "payment", DIGEST)
    assert first["expiresAt"] > time.time() * 1000 + 60_000  # 15 min by default
    # the session view shows it too, and the tenant's list of what waits
    active = acme.get(f"/v1/sessions/{sid}").json()["activeRun"]
    assert [a["key"] for a in active["actions"] if a["decision"] == "pending"] == [key_a]
    listed = acme.get("/v1/approvals").json()["approvals"]
    assert [(a["runId"], a["key"], a["sessionId"]) for a in listed] == [(run_a, key_a, sid)]
    # another tenant: as if unknown, nothing revealed, nothing sent
    for verb in ("approve", "deny"):
        refused = _decide(globex, run_a, key_a, verb, argsDigest=DIGEST)
        assert refused.status_code == 404, refused.text
        assert refused.json()["error"]["code"] == "not_found"
    assert globex.get(f"/v1/runs/{run_a}").status_code == 404
    assert globex.get("/v1/approvals").json() == {"approvals": []}
    # a body may not name who decides
    forged = _decide(acme, run_a, key_a, "approve", argsDigest=DIGEST, actor="ceo")
    assert forged.status_code == 400 and forged.json()["error"]["code"] == "forbidden_field"
    # a digest the person was not shown: rejected, recorded, the key still pending
    wrong = _decide(acme, run_a, key_a, "approve", argsDigest="sha256:other")
    assert wrong.status_code == 409 and wrong.json()["reason"] == "digest_mismatch", wrong.text

    # -- kill -9 of the holder while the payment is pending -------------------------------
    holder = _run(acme, run_a)["leaseOwner"]
    assert holder in workers, holder
    workers[holder].kill9()
    second = wait_until(
        lambda: _pending(acme, run_a, 2), timeout=30, what="the new holder's pending request"
    )
    # the same request, the same window: a takeover never extends a person's time
    assert (second["argsDigest"], second["expiresAt"]) == (DIGEST, first["expiresAt"])
    assert _run(acme, run_a)["leaseOwner"] not in (None, holder)
    # a decision for the dead holder's generation is stale
    stale = _decide(acme, run_a, key_a, "approve", argsDigest=DIGEST, generation=1)
    assert stale.status_code == 409 and stale.json()["reason"] == "approval_stale", stale.text

    # -- approve through the gateway: the actor is the key's --------------------------------
    ok = _decide(acme, run_a, key_a, "approve", argsDigest=DIGEST, generation=2)
    assert ok.status_code == 200, ok.text
    body = ok.json()
    assert body["status"] == "accepted" and body["runId"] == run_a
    assert [(e["type"], e["payload"]["decidedBy"]) for e in body["events"]] == [
        ("action.approved", "user:bo")
    ]
    # twice: refused — not pending any more, or (the payment was quick) the run has ended
    again = _decide(acme, run_a, key_a, "approve", argsDigest=DIGEST)
    assert again.status_code == 409, again.text
    assert again.json()["reason"] in ("action_not_pending", "run_not_active"), again.text
    done = wait_until(lambda: _finished(acme, run_a), timeout=30, what="run A to finish")
    assert done["terminalStatus"] == "completed", done
    decided = next(a for a in done["actions"] if a["key"] == key_a)
    assert (decided["decision"], decided["decidedBy"], decided["completed"]) == (
        "approved",
        "user:bo",
        True,
    )
    n = _calls(calls)
    assert n[f"asked {key_a}"] == 2, n  # both holders asked
    assert n[f"paid {key_a}"] == 1, n  # one payment
    with w.conn() as conn:
        rows = conn.execute(
            "select generation, status from agent_actions where idempotency_key = %s", (key_a,)
        ).fetchall()
    assert rows == [(2, "done")], rows
    # the session's live stream carried the gate's events
    with acme.stream("GET", f"/v1/sessions/{sid}/events", params={"lastEventId": "-1"}) as s:
        seen = []
        for _id, event, data in SSE(s):
            if event and event.startswith("action."):
                seen.append((event, data["payload"].get("decidedBy")))
            if event == "run.finished":
                break
    assert ("action.pending", None) in seen and ("action.approved", "user:bo") in seen, seen
    assert [e for e in seen if e[0] == "action.approved"] == [("action.approved", "user:bo")]

    # -- run B: denied by a person; the SDK's approve after it is rejected -----------------
    sid_b = f"pay-{uuid.uuid4().hex[:6]}"
    r = acme.post(
        f"/v1/sessions/{sid_b}/commands",
        json={"type": "prompt", "payload": {"text": f"calls={calls} amount=42"}},
    )
    run_b = r.json()["runId"]
    key_b = f"pay-{run_b}"
    wait_until(lambda: _pending(acme, run_b, 1), timeout=30, what="run B's payment pending")
    cli = subprocess.run(
        [EXE, "approvals", "list", "--json", "--tenant", "acme"],
        env=settings_env(w.settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr
    assert [(a["runId"], a["key"]) for a in json.loads(cli.stdout)] == [(run_b, key_b)]
    # the CLI names a tenant too: another tenant's run is not found, nothing is sent
    other = subprocess.run(
        [EXE, "approvals", "approve", run_b, key_b, "--digest", DIGEST, "--tenant", "globex"],
        env=settings_env(w.settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert other.returncode == 2 and "no run" in other.stderr, other.stderr
    with SessionClient("acme", w.settings, actor="user:cy") as c:
        # the SDK: wait() answers a decision's outcome, a rejection with its reason
        odd = c.wait(c.approve(f"acme:{sid_b}", run_b, key_b, args_digest="sha256:x"), 30)
    assert (odd.status, odd.reason) == ("rejected", "digest_mismatch"), odd
    no = _decide(acme, run_b, key_b, "deny", argsDigest=DIGEST, reason="not this month")
    assert no.status_code == 200, no.text
    denied = no.json()["events"][0]
    assert denied["type"] == "action.denied"
    assert (denied["payload"]["reason"], denied["payload"]["detail"]) == (
        "denied",
        "not this month",
    )
    assert denied["payload"]["decidedBy"] == "user:bo"
    done_b = wait_until(lambda: _finished(acme, run_b), timeout=30, what="run B to finish")
    with SessionClient("acme", w.settings, actor="user:cy") as c:
        late = c.wait(c.deny(f"acme:{sid_b}", run_b, key_b, args_digest=DIGEST), timeout=30)
    assert (late.status, late.reason) == ("rejected", "run_not_active"), late
    run_finished = acme.get(f"/v1/runs/{run_b}/events").json()["events"][-1]
    assert json.loads(run_finished["payload"]["result"]) == {"denied": "denied by user:bo"}
    assert done_b["terminalStatus"] == "completed"
    assert _calls(calls)[f"paid {key_b}"] == 0

    # -- the audit: no action executed without its approval; then a planted one -----------
    with connect(w.settings) as conn:
        assert _approval_check(w.settings, conn).ok
        conn.execute(
            "insert into agent_run_events (session_id, run_id, seq, type, payload, generation,"
            " command_id, tenant_id, ts, kafka_partition, kafka_offset) select session_id,"
            " run_id, 1000, 'action.completed',"
            " jsonb_build_object('idempotencyKey', %s::text, 'ok', true), generation,"
            " 'planted', tenant_id, ts, kafka_partition, -1 from agent_run_events"
            " where run_id = %s and seq = 1",
            (key_b, run_b),
        )
        conn.commit()
        nine = _approval_check(w.settings, conn)
    assert not nine.ok and any(f"{run_b}/{key_b}#1000" in line for line in nine.evidence), nine


def _approval_check(settings: Settings, conn: Any) -> Check:
    (check,) = [
        c
        for c in run_audit(settings, conn, policy="payment")
        if c.title == "no action executed without its required approval"
    ]
    return check


def test_the_console_shows_a_pending_action_and_who_approved_it(
    world: GatewayWorld, browser: WebDriver, tmp_path: Path
) -> None:
    calls = tmp_path / "calls.log"
    key = world.key("acme", "ui:alice")
    sid = f"console-{uuid.uuid4().hex[:8]}"
    browser.get(f"{world.url}/?key={key}#/sessions/{sid}")
    _wait(browser, "live stream", 30, lambda d: _css(d, '#live[data-on="1"]'))
    r = world.client(key).post(
        f"/v1/sessions/{sid}/commands",
        json={"type": "prompt", "payload": {"text": f"calls={calls} amount=7"}},
    )
    assert r.status_code == 200, r.text
    pay = f"pay-{r.json()['runId']}"
    pending = f'li.approval[data-key="{pay}"][data-decision="pending"]'
    _wait(browser, "pending action", 30, lambda d: _css(d, pending))
    item = browser.find_element(By.CSS_SELECTOR, pending)
    assert "payment" in item.find_element(By.CSS_SELECTOR, ".what").text
    digest = args_digest({"amount": 7})
    assert item.find_element(By.CSS_SELECTOR, ".digest").get_attribute("title") == digest
    _wait(
        browser,
        "time left",
        10,
        lambda d: "left" in d.find_element(By.CSS_SELECTOR, f"{pending} .left").text,
    )
    assert item.find_element(By.CSS_SELECTOR, "button.deny").is_displayed()
    _shot(browser, "approval-1-pending")
    item.find_element(By.CSS_SELECTOR, "button.approve").click()
    approved = f'li.approval[data-key="{pay}"][data-decision="approved"] .decided'
    _wait(
        browser,
        "who approved",
        30,
        lambda d: "approved by ui:alice" in d.find_element(By.CSS_SELECTOR, approved).text,
    )
    _wait(
        browser, "completed run", 30, lambda d: d.find_element(By.ID, "status").text == "completed"
    )
    _wait(
        browser,
        "executed action",
        15,
        lambda d: "executed" in d.find_element(By.CSS_SELECTOR, approved).text,
    )
    assert f"approve {pay}: accepted" in browser.find_element(By.ID, "outcomes").text
    assert _calls(calls)[f"paid {pay}"] == 1
    _shot(browser, "approval-2-approved")
