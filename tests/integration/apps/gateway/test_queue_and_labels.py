"""Queue control and run labels end to end: a real gateway, processor, sink and PostgreSQL
(one isolated world for the module, no workers: a run stays running, so the tasks behind it
wait), written from the feature's text and docs/protocol.md#queue-control / #labels:

- a queued task is named by the command id that queued it (`run.queued.sourceCommandId`),
  the session view lists the queue (id, kind, text, actor, queued at), `DELETE
  .../queue/{commandId}` removes it (`run.dequeued` naming who: the key's actor) and
  `DELETE .../queue` removes every one; a second removal, an unknown id, an empty queue and
  a task that has started are refused 409 with their reason, and another tenant's key
  reaches none of it;
- labels: prompts with `metadata` sent through the SDK and through the gateway (one of them
  queued, started later) are found by `GET /v1/runs?label=` and `GET /v1/sessions?label=`,
  exactly those runs; labels beyond their bounds are refused before anything is sent.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sessionstream.client import SessionClient
from sessionstream.settings import Settings
from tests.integration.gateway_world import GatewayWorld, gateway_world
from tests.integration.helpers import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def world(settings: Settings) -> Iterator[GatewayWorld]:
    w = gateway_world(settings, "queue", gateway_rate_per_s=1000.0, gateway_rate_burst=1000)
    try:
        yield w.start()
    finally:
        w.stop()


def _tenant() -> str:
    return f"q{uuid.uuid4().hex[:8]}"


def _post(http: httpx.Client, session: str, body: dict[str, Any]) -> dict[str, Any]:
    r = http.post(f"/v1/sessions/{session}/commands", json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _types(out: dict[str, Any]) -> list[str]:
    return [e["type"] for e in out["events"]]


def _queue_view(w: GatewayWorld, http: httpx.Client, session: str, want: int) -> list[Any]:
    """The session view's queue once the sink has caught up to `want` waiting tasks."""

    last: list[str] = []

    def got() -> tuple[list[Any]] | None:  # a tuple: an empty queue is found too
        r = http.get(f"/v1/sessions/{session}")
        last[:] = [f"{r.status_code} {r.text[:2000]}"]
        if r.status_code != 200:
            return None
        queue: list[Any] = r.json()["queue"]
        return (queue,) if len(queue) == want else None

    return wait_until(
        got, timeout=30, what=lambda: f"{want} tasks in {session}'s queue view: {last}"
    )[0]


def test_the_queue_is_shown_and_controlled_over_http(world: GatewayWorld) -> None:
    tenant = _tenant()
    http = world.client(world.key(tenant, "user:ana"))
    bo = world.client(world.key(tenant, "user:bo"))
    session = "plan"
    assert _types(_post(http, session, {"type": "prompt", "payload": {"text": "A"}})) == [
        "run.started"
    ]
    queued = _post(
        http,
        session,
        {
            "type": "prompt",
            "commandId": "task-b",
            "payload": {"text": "B", "policy": "enqueue", "metadata": {"team": "growth"}},
        },
    )
    # named when queued: the id the producer chose
    assert [(e["type"], e["payload"]["sourceCommandId"]) for e in queued["events"]] == [
        ("run.queued", "task-b")
    ]
    _post(
        http,
        session,
        {"type": "prompt", "commandId": "task-c", "payload": {"text": "C", "policy": "enqueue"}},
    )
    _post(
        http,
        session,
        {"type": "prompt", "commandId": "task-d", "payload": {"text": "D", "policy": "enqueue"}},
    )
    view = _queue_view(world, http, session, 3)
    assert [(q["sourceCommandId"], q["kind"], q["text"], q["actor"]) for q in view] == [
        ("task-b", "prompt", "B", "user:ana"),
        ("task-c", "prompt", "C", "user:ana"),
        ("task-d", "prompt", "D", "user:ana"),
    ]
    assert all(isinstance(q["queuedAt"], int) for q in view)
    assert view[0]["metadata"] == {"team": "growth"}

    # Step 1: another tenant's key addresses its own namespace: nothing of ours is touched
    other = world.client(world.key(_tenant(), "mallory"))
    r = other.delete(f"/v1/sessions/{session}/queue/task-b")
    assert r.status_code == 409 and r.json()["reason"] == "not_queued", r.text
    assert other.delete(f"/v1/sessions/{session}/queue").json()["reason"] == "queue_empty"

    # Step 2: dequeue B: its fate names it and who removed it (the key's actor)
    r = bo.delete(f"/v1/sessions/{session}/queue/task-b")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "accepted" and _types(body) == ["run.dequeued"]
    fate = body["events"][0]["payload"]
    assert (fate["sourceCommandId"], fate["reason"], fate["actor"], fate["queuedBy"]) == (
        "task-b",
        "dequeued",
        "user:bo",
        "user:ana",
    )
    # twice: the same Idempotency-Key is the same command (a duplicate); a new one is
    # refused, saying who removed it
    again = bo.delete(f"/v1/sessions/{session}/queue/task-b", headers={"Idempotency-Key": "k1"})
    assert again.status_code == 409 and again.json()["reason"] == "not_queued"
    same = bo.delete(f"/v1/sessions/{session}/queue/task-b", headers={"Idempotency-Key": "k1"})
    assert same.status_code == 200 and same.json()["status"] == "duplicate"
    unknown = bo.delete(f"/v1/sessions/{session}/queue/nobody")
    assert unknown.status_code == 409 and unknown.json()["reason"] == "not_queued"

    # Step 3: the run ends (an abort: no worker holds it), C starts: a late dequeue of C
    # is refused and C goes on
    aborted = _post(http, session, {"type": "abort"})
    assert _types(aborted)[-2:] == ["run.finished", "run.started"]
    late = bo.delete(f"/v1/sessions/{session}/queue/task-c")
    assert late.status_code == 409 and late.json()["reason"] == "not_queued"
    refusal = late.json()["events"][0]["payload"]
    assert refusal["targetStatus"] == "running"

    # Step 4: clear the queue (D), then it is empty
    cleared = bo.delete(f"/v1/sessions/{session}/queue")
    assert cleared.status_code == 200, cleared.text
    assert [
        (e["type"], e["payload"]["sourceCommandId"], e["payload"]["reason"])
        for e in cleared.json()["events"]
    ] == [("run.dequeued", "task-d", "cleared")]
    empty = bo.delete(f"/v1/sessions/{session}/queue")
    assert empty.status_code == 409 and empty.json()["reason"] == "queue_empty"
    assert _queue_view(world, http, session, 0) == []
    # the same commands by name through the generic route
    by_body = http.post(
        f"/v1/sessions/{session}/commands",
        json={"type": "dequeue", "payload": {"commandId": "task-d"}},
    )
    assert by_body.status_code == 409 and by_body.json()["reason"] == "not_queued"


def test_labels_from_the_sdk_and_the_gateway_are_found_by_run_search(
    world: GatewayWorld,
) -> None:
    tenant = _tenant()
    http = world.client(world.key(tenant, "user:ana"))
    growth = {"team": "growth", "env": "prod"}
    # Step 1: through the SDK: one labelled run, one without labels
    with SessionClient(tenant, world.settings, actor="sdk:ana") as client:
        sdk_session = client.session_id("sdk")
        labelled = client.wait(client.prompt(sdk_session, "from the sdk", metadata=growth))
        assert labelled.status == "accepted", labelled
        plain = client.wait(client.prompt(client.session_id("sdk-plain"), "no labels"))
        assert plain.status == "accepted"
        with pytest.raises(ValueError, match="metadata"):
            client.prompt(sdk_session, "x", metadata={"bad key": "v"})
    # Step 2: through the gateway: a run started with labels, and one queued with other
    # labels that starts later (the queued task keeps them until then)
    started = _post(
        http,
        "gw",
        {"type": "prompt", "payload": {"text": "from the gateway", "metadata": growth}},
    )
    queued = _post(
        http,
        "gw",
        {
            "type": "prompt",
            "payload": {"text": "later", "policy": "enqueue", "metadata": {"team": "ops"}},
        },
    )
    assert queued["events"][0]["payload"]["metadata"] == {"team": "ops"}
    next_run = _post(http, "gw", {"type": "abort"})["events"][-1]
    assert next_run["type"] == "run.started" and next_run["payload"]["metadata"] == {"team": "ops"}
    too_many = http.post(
        "/v1/sessions/gw/commands",
        json={
            "type": "prompt",
            "payload": {"text": "x", "metadata": {f"k{i}": "v" for i in range(17)}},
        },
    )
    assert too_many.status_code == 400 and too_many.json()["error"]["code"] == "invalid_command"

    # Step 3: search by label finds exactly those runs, once the sink has them
    want = {labelled.run_id, started["runId"]}

    def ids(label: str) -> set[str]:
        r = http.get("/v1/runs", params={"label": label})
        assert r.status_code == 200, r.text
        return {x["runId"] for x in r.json()["runs"]}

    def found() -> bool:
        return ids("team:growth") == want and ids("team:ops") == {next_run["runId"]}

    wait_until(found, timeout=30, what="the labelled runs in PostgreSQL")
    both = http.get("/v1/runs", params=[("label", "team:growth"), ("label", "env:prod")])
    assert {x["runId"] for x in both.json()["runs"]} == want
    runs = http.get("/v1/runs", params={"label": "team:growth"}).json()["runs"]
    assert all(x["labels"] == growth for x in runs)
    ops = http.get("/v1/runs", params={"label": "team:ops"}).json()["runs"]
    assert [x["runId"] for x in ops] == [next_run["runId"]]
    assert http.get("/v1/runs", params={"label": "team:nobody"}).json()["runs"] == []
    sessions = http.get("/v1/sessions", params={"label": "team:growth"}).json()["sessions"]
    assert {s["sessionId"] for s in sessions} == {"sdk", "gw"}
