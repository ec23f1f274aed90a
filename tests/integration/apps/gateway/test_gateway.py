"""`sessionstream gateway` over HTTP against the real broker, PostgreSQL, processor, sink and
analytics app (one isolated world for the module): keys, auth, bad input, outcomes,
idempotency, tenants, Server-Sent Events with resume, replay, stats, rate limit."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition

from sessionstream.adapters.kafka import read_topic
from sessionstream.adapters.registry import reader_codec
from sessionstream.apps._procs import settings_env
from sessionstream.core.partitioning import partition_for
from sessionstream.settings import Settings, get_settings
from tests.integration.gateway_world import SSE, GatewayWorld, gateway_world
from tests.integration.helpers import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def world(settings: Settings) -> Iterator[GatewayWorld]:
    w = gateway_world(settings, "gw", gateway_key_cache_s=0.5)
    try:
        yield w.start(analytics=True)
    finally:
        w.stop()


def _cli(w: GatewayWorld, *args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("sessionstream")
    return subprocess.run(
        [str(exe), *args],
        env=settings_env(w.settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _ends(s: Settings, topic: str) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": s.kafka_bootstrap, "group.id": f"it-{uuid.uuid4()}"})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
            for p in parts
        }
    finally:
        c.close()


def _sid() -> str:
    return f"gw-{uuid.uuid4().hex[:10]}"


def _prompt(text: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"type": "prompt", "payload": {"text": text}, **extra}


# -- keys and authentication ------------------------------------------------------------------
def test_keys_create_prints_the_key_once_and_stores_only_its_hash(world: GatewayWorld) -> None:
    out = _cli(world, "keys", "create", "--tenant", "acme", "--actor", "alice", "--json")
    assert out.returncode == 0, out.stderr
    made = json.loads(out.stdout)
    key = made["key"]
    assert key.startswith(f"ssk_{made['keyId']}_") and len(key) > 50
    with world.conn() as conn:
        rows = conn.execute("select * from api_keys where key_id = %s", (made["keyId"],))
        cols = [d.name for d in rows.description or []]
        row = dict(zip(cols, rows.fetchone() or (), strict=True))
    assert row["key_hash"] == hashlib.sha256(key.encode()).hexdigest()
    assert row["tenant_id"] == "acme" and row["actor"] == "alice"
    assert all(key not in str(v) for v in row.values()), "the key itself is never stored"
    listed = _cli(world, "keys", "list", "--tenant", "acme", "--json")
    assert made["keyId"] in listed.stdout and key not in listed.stdout
    with world.client(key) as c:
        assert c.get("/v1/whoami").json() == {
            "keyId": made["keyId"],
            "tenantId": "acme",
            "actor": "alice",
        }


def test_no_key_or_a_wrong_key_is_401(world: GatewayWorld) -> None:
    key = world.key("acme")
    forged = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")
    for headers in (
        {},
        {"Authorization": "Bearer nonsense"},
        {"Authorization": f"Bearer {forged}"},
        {"Authorization": f"Basic {key}"},
    ):
        with httpx.Client(base_url=world.url, headers=headers) as c:
            for r in (
                c.get("/v1/sessions"),
                c.post("/v1/sessions/x/commands", json=_prompt()),
                c.get("/v1/stats"),
            ):
                assert r.status_code == 401, (headers, r.text)
                assert r.json()["error"]["code"] == "unauthorized"
    with httpx.Client(base_url=world.url, headers={"X-API-Key": key}) as c:
        assert c.get("/v1/sessions").status_code == 200


def test_a_revoked_key_stops_working(world: GatewayWorld) -> None:
    key = world.key("acme")
    with world.client(key) as c:
        assert c.get("/v1/sessions").status_code == 200
        out = _cli(world, "keys", "revoke", key)
        assert out.returncode == 0, out.stderr
        # the gateway trusts its cache for gateway_key_cache_s (0.5 s here)
        wait_until(
            lambda: c.get("/v1/sessions").status_code == 401, timeout=5, what="401 after revoke"
        )
    assert _cli(world, "keys", "revoke", key).returncode == 1  # already revoked


# -- commands: bad input never reaches Kafka ------------------------------------------------
def test_bad_input_is_a_clear_json_error_and_nothing_reaches_kafka(world: GatewayWorld) -> None:
    s = world.settings
    before = (_ends(s, s.commands_topic), _ends(s, s.dlq_topic))
    url = f"/v1/sessions/{_sid()}/commands"
    big = s.gateway_max_body_bytes + 10
    cases: list[tuple[dict[str, Any], int, str]] = [
        (
            {"content": b"{not json", "headers": {"Content-Type": "application/json"}},
            400,
            "malformed_json",
        ),
        (
            {"content": b"\xff\xfe", "headers": {"Content-Type": "application/json"}},
            400,
            "malformed_json",
        ),
        ({"json": [1, 2]}, 400, "invalid_command"),
        ({"json": {"type": "explode", "payload": {}}}, 400, "unknown_type"),
        ({"json": {"type": "lease.acquire", "payload": {}}}, 400, "unknown_type"),
        ({"json": {"type": "timer.fired", "payload": {}}}, 400, "unknown_type"),
        ({"json": {**_prompt(), "tenantId": "globex"}}, 400, "forbidden_field"),
        ({"json": {**_prompt(), "actor": "mallory"}}, 400, "forbidden_field"),
        ({"json": {**_prompt(), "sessionId": "other"}}, 400, "forbidden_field"),
        ({"json": {**_prompt(), "surprise": 1}}, 400, "invalid_command"),
        (
            {"json": {"type": "prompt", "payload": {"text": "x", "policy": "yolo"}}},
            400,
            "invalid_command",
        ),
        ({"json": {"type": "prompt", "payload": {"txt": "x"}}}, 400, "invalid_command"),
        ({"json": {**_prompt(), "commandId": "x" * 201}}, 400, "invalid_command"),
        (
            {"content": b'{"type": "prompt"}', "headers": {"Content-Type": "text/plain"}},
            415,
            "unsupported_media_type",
        ),
        ({"content": b'{"type": "prompt"}'}, 415, "unsupported_media_type"),
        (
            {
                "content": json.dumps(_prompt("x" * big)).encode(),
                "headers": {"Content-Type": "application/json"},
            },
            413,
            "body_too_large",
        ),
    ]
    with world.client(world.key("acme")) as c:
        for kwargs, status, code in cases:
            r = c.post(url, **kwargs)
            assert r.status_code == status, (kwargs.get("json"), r.text)
            assert r.json()["error"]["code"] == code, r.text
            assert r.json()["error"]["message"]

        # a chunked body (no Content-Length) is cut off as it streams in
        def chunks() -> Iterator[bytes]:
            yield b'{"type": "prompt", "payload": {"text": "'
            for _ in range(big // 4096 + 2):
                yield b"y" * 4096
            yield b'"}}'

        r = c.post(url, content=chunks(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
        r = c.post("/v1/sessions/" + "s" * 201 + "/commands", json=_prompt())
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
    assert (_ends(s, s.commands_topic), _ends(s, s.dlq_topic)) == before


# -- commands: outcomes, idempotency, tenants ---------------------------------------------
def test_outcomes_accepted_rejected_duplicate_and_tenant_from_the_key(world: GatewayWorld) -> None:
    sid = _sid()
    with world.client(world.key("acme", "alice")) as c:
        r = c.post(f"/v1/sessions/{sid}/commands", json=_prompt(commandId="c-1"))
        assert r.status_code == 200, r.text
        first = r.json()
        assert first["status"] == "accepted" and first["runId"]
        started = first["events"][0]
        assert started["type"] == "run.started"
        assert (started["tenantId"], started["payload"]["actor"]) == ("acme", "alice")

        busy = c.post(f"/v1/sessions/{sid}/commands", json=_prompt("again"))
        assert busy.status_code == 409 and busy.json()["status"] == "rejected"
        assert busy.json()["reason"] == "session_busy"

        # the same command again: a duplicate, nothing decided twice; its first outcome
        # comes from PostgreSQL once the sink has it
        world.wait_sink(f"acme:{sid}", "run.started")
        dup = c.post(f"/v1/sessions/{sid}/commands", json=_prompt(commandId="c-1"))
        assert dup.status_code == 200 and dup.json()["status"] == "duplicate", dup.text
        assert dup.json()["original"]["status"] == "accepted"
        assert dup.json()["original"]["runId"] == first["runId"]

        reused = c.post(f"/v1/sessions/{sid}/commands", json=_prompt("other", commandId="c-1"))
        assert reused.status_code == 409 and reused.json()["reason"] == "command_id_reused"

        stale = c.post(f"/v1/sessions/{sid}/commands", json={"type": "abort", "runId": "not-a-run"})
        assert stale.status_code == 409 and stale.json()["reason"] == "run_not_active"
        abort = c.post(
            f"/v1/sessions/{sid}/commands", json={"type": "abort", "runId": first["runId"]}
        )
        assert abort.status_code == 200
        assert [e["type"] for e in abort.json()["events"]] == [
            "run.cancel_requested",
            "run.finished",
        ]
    world.wait_sink(f"acme:{sid}", "run.finished")
    with world.conn() as conn:
        rows = conn.execute(
            "select distinct tenant_id from agent_run_events where session_id = %s",
            (f"acme:{sid}",),
        ).fetchall()
    assert rows == [("acme",)], "stored under the tenant's namespace, as the key's tenant"
    assert started["sessionId"] == sid, "shown as the tenant knows it"


def test_only_an_admin_key_erases_and_not_while_a_run_is_active(world: GatewayWorld) -> None:
    """Erasure is admin-only (docs/protocol.md#erasure-and-retention): a producer key gets 403
    on the admin route and on the command route; an admin key's erase is refused while a
    run is active (409 session_busy) and erases the finished session: its rows go."""
    from sessionstream.apps.gateway.keys import create_key

    sid = _sid()
    with world.conn() as conn:
        admin_key, rec = create_key(conn, "acme", "ops", role="admin")
    assert rec.role == "admin"
    with world.client(world.key("acme", "alice")) as c, world.client(admin_key) as admin:
        run_id = c.post(f"/v1/sessions/{sid}/commands", json=_prompt("secret")).json()["runId"]
        refused = c.post(f"/v1/admin/sessions/{sid}/erase", json={})
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "admin_only")
        via_commands = c.post(
            f"/v1/sessions/{sid}/commands", json={"type": "session.erase", "payload": {}}
        )
        assert via_commands.status_code == 403
        busy = admin.post(f"/v1/admin/sessions/{sid}/erase", json={"reason": "ticket 7"})
        assert busy.status_code == 409 and busy.json()["reason"] == "session_busy", busy.text
        c.post(f"/v1/sessions/{sid}/commands", json={"type": "abort", "runId": run_id})
        world.wait_sink(f"acme:{sid}", "run.finished")
        done = admin.post(f"/v1/admin/sessions/{sid}/erase", json={"reason": "ticket 7"})
        assert done.status_code == 200, done.text
        assert [e["type"] for e in done.json()["events"]] == ["session.erased"]
        assert done.json()["events"][0]["payload"]["actor"] == "ops"

        def gone() -> bool:
            with world.conn() as conn:
                n = conn.execute(
                    "select count(*) from agent_run_events where session_id = %s",
                    (f"acme:{sid}",),
                ).fetchone()
            return n == (0,)

        wait_until(gone, timeout=30, what="the sink to erase the session's rows")
        assert c.get(f"/v1/sessions/{sid}").status_code == 404
        assert c.get(f"/v1/runs/{run_id}").status_code == 404


def test_concurrent_retries_of_one_command_share_its_outcome(world: GatewayWorld) -> None:
    sid = _sid()
    key = world.key("acme")
    results: list[httpx.Response] = []

    def post() -> None:
        with world.client(key) as c:
            results.append(c.post(f"/v1/sessions/{sid}/commands", json=_prompt(commandId="r-1")))

    threads = [threading.Thread(target=post) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = sorted(r.json()["status"] for r in results)
    # in flight together they share one outcome; one that arrived after it was decided is
    # a duplicate; never two runs
    assert set(statuses) <= {"accepted", "duplicate"} and "accepted" in statuses, statuses
    run_ids = {r.json()["runId"] for r in results if r.json()["status"] == "accepted"}
    assert len(run_ids) == 1


def test_two_tenants_one_session_id_are_two_sessions_and_nothing_tells_them_apart(
    world: GatewayWorld,
) -> None:
    """Session ids were one namespace for all tenants: globex could take acme's future
    session id first (acme then got 404 for its own session), and globex's abort answered
    404 for a session of acme's but 409 `no_active_run` for an unused id, which told the
    two apart. Now each tenant's `S` is its own session (`acme:S`, `globex:S`)."""
    sid, unused = _sid(), _sid()
    with world.client(world.key("globex")) as squatter:  # globex first, with acme's id
        r = squatter.post(f"/v1/sessions/{sid}/commands", json=_prompt("mine"))
        assert r.status_code == 200, r.text
        squat_run = r.json()["runId"]
    with world.client(world.key("acme")) as owner:
        r = owner.post(f"/v1/sessions/{sid}/commands", json=_prompt())
        assert r.status_code == 200 and r.json()["status"] == "accepted", r.text
        run_id = r.json()["runId"]
        assert run_id != squat_run
    world.wait_sink(f"acme:{sid}", "run.started")
    world.wait_sink(f"globex:{sid}", "run.started")
    with world.client(world.key("acme")) as owner:
        assert owner.get(f"/v1/sessions/{sid}").json()["activeRun"]["runId"] == run_id
        assert owner.get(f"/v1/runs/{squat_run}").status_code == 404
    with world.client(world.key("globex")) as other:
        mine = other.get(f"/v1/sessions/{sid}").json()
        assert mine["activeRun"]["runId"] == squat_run and "acme" not in json.dumps(mine)
        for path in (f"/v1/runs/{run_id}", f"/v1/runs/{run_id}/events"):
            assert other.get(path).status_code == 404
        # no answer depends on another tenant having the id: acme's active session and
        # an id nobody uses answer alike
        seen = {}
        for name, target in (("acme's", sid), ("unused", unused)):
            other.post(f"/v1/sessions/{target}/commands", json={"type": "abort"})
            again = other.post(f"/v1/sessions/{target}/commands", json={"type": "abort"})
            got = other.get(f"/v1/sessions/{target}")
            seen[name] = (again.status_code, again.json().get("reason"))
            assert got.status_code in (200, 404)
        assert seen["acme's"] == seen["unused"] == (409, "no_active_run"), seen
        assert other.get(f"/v1/sessions/{unused}").status_code == 404
    with world.client(world.key("acme")) as owner:  # globex's aborts never reached acme's
        assert owner.get(f"/v1/sessions/{sid}").json()["activeRun"]["runId"] == run_id


# -- Server-Sent Events -------------------------------------------------------------------
def _session_offsets(s: Settings, local: str, tenant: str = "acme") -> list[tuple[int, str]]:
    sid = f"{tenant}:{local}"
    p = partition_for(sid.encode(), s.partitions)
    codec = reader_codec(get_settings())
    out = []
    for rec in read_topic(s, s.events_topic, partitions=[p]):
        if rec.key and rec.key.startswith(f"{sid}/".encode()):
            out.append((rec.offset, codec.decode_event(rec.value or b"").type))
    return out


def test_sse_live_then_resume_with_last_event_id_without_gap_or_repeat(
    world: GatewayWorld,
) -> None:
    sid = _sid()
    key = world.key("acme")
    got: list[tuple[int, str]] = []
    with world.client(key) as c, c.stream("GET", f"/v1/sessions/{sid}/events") as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        stream = SSE(resp)
        r = c.post(f"/v1/sessions/{sid}/commands", json=_prompt())
        run_id = r.json()["runId"]
        eid, event, data = next(stream)
        assert event == "run.started" and data["runId"] == run_id and data["tenantId"] == "acme"
        got.append((int(eid or -1), event))
    # disconnected: three more commands' events happen meanwhile
    with world.client(key) as c:
        for cmd in (_prompt("busy"), {"type": "abort"}, _prompt("next")):
            assert c.post(f"/v1/sessions/{sid}/commands", json=cmd).status_code in (200, 409)
        last = got[-1][0]
        with c.stream(
            "GET", f"/v1/sessions/{sid}/events", headers={"Last-Event-ID": str(last)}
        ) as resp:
            stream = SSE(resp)
            expected = len(_session_offsets(world.settings, sid)) + 1
            # a live one after the catch-up (run B is active: one rejection event)
            busy = c.post(f"/v1/sessions/{sid}/commands", json=_prompt("busy again"))
            assert busy.json()["reason"] == "session_busy"
            while len(got) < expected:
                eid, event, _ = next(stream)
                got.append((int(eid or -1), event or ""))
    assert got == _session_offsets(world.settings, sid)
    offsets = [o for o, _ in got]
    assert offsets == sorted(set(offsets)), "no repeat, in log order"


def test_a_revoked_key_ends_its_open_event_streams(world: GatewayWorld) -> None:
    """The key was checked once, when the stream opened, and its pings kept it open: a
    revoked key went on receiving the session's events for as long as it stayed
    connected. It is asked again every `gateway_key_cache_s` (0.5 s here)."""
    sid = _sid()
    key = world.key("acme")
    with (
        world.client(world.key("acme")) as other,
        world.client(key) as c,
        c.stream("GET", f"/v1/sessions/{sid}/events") as resp,
    ):
        assert resp.status_code == 200
        stream = SSE(resp)
        assert other.post(f"/v1/sessions/{sid}/commands", json=_prompt()).status_code == 200
        _, event, _ = next(stream)
        assert event == "run.started"
        assert _cli(world, "keys", "revoke", key).returncode == 0
        started = time.monotonic()
        _, event, data = next(stream)  # no event of the session happens meanwhile
        assert event == "unauthorized" and data["error"]["code"] == "unauthorized"
        assert time.monotonic() - started < 10
        with pytest.raises(StopIteration):
            next(stream)  # and the stream has ended


def test_sse_rejects_a_bad_last_event_id(world: GatewayWorld) -> None:
    with world.client(world.key("acme")) as c:
        r = c.get(f"/v1/sessions/{_sid()}/events", headers={"Last-Event-ID": "abc"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_last_event_id"


# -- reads: sessions, runs, stats -------------------------------------------------------------
def test_session_state_and_runs_replayed_from_postgres(world: GatewayWorld) -> None:
    sid = _sid()
    with world.client(world.key("acme")) as c:
        run_id = c.post(f"/v1/sessions/{sid}/commands", json=_prompt("one")).json()["runId"]
        queued = c.post(
            f"/v1/sessions/{sid}/commands",
            json={"type": "prompt", "payload": {"text": "two", "policy": "enqueue"}},
        )
        assert queued.json()["status"] == "accepted"
        world.wait_sink(f"acme:{sid}", "run.queued")
        state = c.get(f"/v1/sessions/{sid}").json()
        assert state["status"] == "running" and state["activeRun"]["runId"] == run_id
        assert state["generation"] == 1
        assert [q["text"] for q in state["queue"]] == ["two"]
        assert state["lastEventId"] is not None
        c.post(f"/v1/sessions/{sid}/commands", json={"type": "abort", "runId": run_id})
        world.wait_sink(f"acme:{sid}", "run.finished")
        run = c.get(f"/v1/runs/{run_id}").json()
        assert run["status"] == "cancelled" and run["sessionId"] == sid
        # no worker ran it: no model request, and the usage says so
        assert run["usage"] == {
            "modelRequests": 0,
            "inputTokens": 0,
            "outputTokens": 0,
            "costUsd": None,
            "modelMs": 0,
        }
        events = c.get(f"/v1/runs/{run_id}/events").json()["events"]
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        assert [e["type"] for e in events][:1] == ["run.started"]
        assert "run.finished" in [e["type"] for e in events]
        assert all(isinstance(e["offset"], int) for e in events)
        listed = c.get("/v1/sessions").json()["sessions"]
        assert sid in [x["sessionId"] for x in listed]
        assert c.get("/v1/runs/no-such-run").status_code == 404
        assert c.get(f"/v1/sessions/{_sid()}").status_code == 404


def test_schedules_created_listed_replaced_and_deleted_per_tenant(world: GatewayWorld) -> None:
    """The schedule routes are commands with outcomes; the list (from PostgreSQL) has the
    next firing; a bad definition is the session's `invalid_schedule` with its reason, a
    bad id a 400; another tenant's key sees and deletes nothing of them."""
    sid = _sid()
    daily = {
        "scheduleId": "daily",
        "cron": "30 9 * * mon-fri",
        "timezone": "Europe/Lisbon",
        "text": "the daily report",
        "input": {"team": "ops"},
        "overlap": "enqueue",
    }
    with world.client(world.key("acme")) as c, world.client(world.key("globex")) as other:
        r = c.post(f"/v1/sessions/{sid}/schedules", json={**daily, "commandId": f"{sid}-1"})
        assert r.status_code == 200 and r.json()["status"] == "accepted", r.text
        created = r.json()["events"][0]
        assert created["type"] == "schedule.created" and created["payload"]["actor"]
        again = c.post(f"/v1/sessions/{sid}/schedules", json={**daily, "commandId": f"{sid}-1"})
        assert again.json()["status"] == "duplicate"
        bad = c.post(
            f"/v1/sessions/{sid}/schedules",
            json={"scheduleId": "bad", "cron": "0 0 30 2 *", "text": "x"},
        )
        assert bad.status_code == 409 and bad.json()["reason"] == "invalid_schedule"
        assert "30 February" in bad.json()["events"][0]["payload"]["detail"]
        slash = c.post(
            f"/v1/sessions/{sid}/schedules", json={"scheduleId": "a b", "intervalMs": 60_000}
        )
        assert slash.status_code == 400
        world.wait_sink(f"acme:{sid}", "schedule.created")
        listed = c.get(f"/v1/sessions/{sid}/schedules").json()["schedules"]
        assert [(x["scheduleId"], x["input"], x["nextAt"]) for x in listed] == [
            ("daily", {"team": "ops"}, created["payload"]["nextAt"])
        ]
        # the session has no run yet: its view is there all the same, with the schedule
        view = c.get(f"/v1/sessions/{sid}")
        assert view.status_code == 200, view.text
        assert (view.json()["status"], view.json()["userId"]) == ("idle", None)
        assert [x["scheduleId"] for x in view.json()["schedules"]] == ["daily"]
        # another tenant: its own session of that name, none of acme's schedules
        assert other.get(f"/v1/sessions/{sid}/schedules").json()["schedules"] == []
        assert other.get(f"/v1/sessions/{sid}").status_code == 404
        gone = other.delete(f"/v1/sessions/{sid}/schedules/daily")
        assert gone.status_code == 409 and gone.json()["reason"] == "unknown_schedule"
        put = c.put(
            f"/v1/sessions/{sid}/schedules/daily",
            json={"intervalMs": 3_600_000, "text": "hourly now"},
        )
        assert put.json()["events"][0]["type"] == "schedule.updated", put.text
        mismatch = c.put(
            f"/v1/sessions/{sid}/schedules/daily",
            json={"scheduleId": "other", "intervalMs": 3_600_000, "text": "x"},
        )
        assert mismatch.status_code == 400
        deleted = c.delete(f"/v1/sessions/{sid}/schedules/daily?commandId={sid}-del")
        assert deleted.json()["events"][0]["type"] == "schedule.deleted"
        world.wait_sink(f"acme:{sid}", "schedule.deleted")
        assert c.get(f"/v1/sessions/{sid}/schedules").json()["schedules"] == []


def test_a_typed_input_on_either_route_reaches_the_log_and_the_views(world: GatewayWorld) -> None:
    """A prompt's `input` (any JSON value) is taken by the fast path and by FastAPI's route
    (a percent-encoded path goes down the usual stack), carried by its run and its queued
    task, and shown by the session and run views as the JSON value it is."""
    sid = _sid()
    order = {"sku": "A-1", "qty": 2, "note": "é ✈", "tags": [None, 1.5, True]}
    encoded = sid.replace("-", "%2D", 1)  # the same session, not by the fast path
    with world.client(world.key("acme")) as c:
        first = c.post(
            f"/v1/sessions/{sid}/commands",
            json={"type": "prompt", "payload": {"text": "one", "input": order}},
        )
        assert first.status_code == 200, first.text
        run_id = first.json()["runId"]
        [started] = first.json()["events"]
        assert json.loads(started["payload"]["input"]) == order  # the event: its JSON text
        queued = c.post(
            f"/v1/sessions/{encoded}/commands",
            json={"type": "prompt", "payload": {"text": "two", "policy": "enqueue", "input": "B"}},
        )
        assert queued.status_code == 200, queued.text
        assert queued.json()["sessionId"] == sid
        assert json.loads(queued.json()["events"][0]["payload"]["input"]) == "B"
        # what JSON carries and the protocol does not: refused on both routes, 400
        deep: list[object] = []
        for _ in range(70):
            deep = [deep]
        for path in (sid, encoded):
            bad = c.post(
                f"/v1/sessions/{path}/commands",
                json={"type": "prompt", "payload": {"text": "x", "input": deep}},
            )
            assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_command")
        world.wait_sink(f"acme:{sid}", "run.queued")
        state = c.get(f"/v1/sessions/{sid}").json()
        assert state["activeRun"]["input"] == order
        assert [(q["text"], q["input"]) for q in state["queue"]] == [("two", "B")]
        c.post(f"/v1/sessions/{sid}/commands", json={"type": "abort", "runId": run_id})
        world.wait_sink(f"acme:{sid}", "run.finished")
        assert c.get(f"/v1/runs/{run_id}").json()["input"] == order
        runs = {r["runId"]: r for r in c.get(f"/v1/sessions/{sid}").json()["runs"]}
        assert runs[run_id]["input"] == order
        assert [r["input"] for r in runs.values() if r["runId"] != run_id] == ["B"]


def test_the_session_log_is_no_run_and_shows_no_tenant_anothers_events(
    world: GatewayWorld,
) -> None:
    """Every session's own log (queued prompts, rejections) is stored under the run id
    `_session`. `GET /v1/runs/_session/events` used to answer it whole for a key whose
    tenant's row came first: other tenants' queued prompt texts and rejections."""
    sids = {"acme": _sid(), "globex": _sid()}
    keys = {t: world.key(t) for t in sids}
    for tenant, sid in sids.items():
        with world.client(keys[tenant]) as c:
            first = c.post(f"/v1/sessions/{sid}/commands", json=_prompt("first"))
            assert first.status_code == 200, first.text
            secret = {"text": f"{tenant.upper()} SECRET", "policy": "enqueue"}
            queued = c.post(
                f"/v1/sessions/{sid}/commands", json={"type": "prompt", "payload": secret}
            )
            assert queued.json()["status"] == "accepted", queued.text
            busy = c.post(f"/v1/sessions/{sid}/commands", json=_prompt("busy"))
            assert busy.status_code == 409
        world.wait_sink(f"{tenant}:{sid}", "command.rejected")
    for tenant in sids:
        with world.client(keys[tenant]) as c:
            for path in ("/v1/runs/_session/events", "/v1/runs/_session"):
                r = c.get(path)
                assert r.status_code == 404, (tenant, path, r.text[:300])
                assert "SECRET" not in r.text


def test_text_no_database_can_store_is_refused_everywhere_and_the_sink_goes_on(
    world: GatewayWorld,
) -> None:
    """A NUL character (or a lone surrogate) in a command. The gateway took it and the
    processor decided it; PostgreSQL refuses NUL in jsonb and text, so the sink stopped
    on the first event that carried it — for every tenant, at every restart. Now: 400 at
    the gateway (a JSON error, also for an id in the path), and a command with it from
    another producer (raw JSON on the commands topic) is dead-lettered with the reason.
    The sink goes on: the session's next command reaches PostgreSQL."""
    import urllib.parse

    from confluent_kafka import Producer

    s = world.settings
    sid = _sid()
    with world.client(world.key("acme")) as c:
        for body in (
            _prompt("a\u0000b"),
            {"type": "abort", "commandId": "c\u0000"},
            _prompt("a\ud800b"),
        ):
            r = c.post(  # JSON escapes both, as a browser sends them
                f"/v1/sessions/{sid}/commands",
                content=json.dumps(body),
                headers={"content-type": "application/json"},
            )
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_command", r.text
        for path in (
            "/v1/sessions/{}",
            "/v1/runs/{}",
            "/v1/runs/{}/events",
            "/v1/sessions/{}/events",
        ):
            r = c.get(path.format(urllib.parse.quote("a\u0000b")))
            assert r.status_code == 400, (path, r.status_code, r.text)
            assert r.json()["error"]["code"] == "invalid_path"  # refused before routing
        cid = f"nul-{uuid.uuid4().hex[:8]}"
        raw = json.dumps(
            {
                "commandId": cid,
                "sessionId": sid,
                "tenantId": "acme",
                "type": "prompt",
                "ts": int(time.time() * 1000),
                "payload": {"text": "a\u0000b"},
            }
        ).encode()
        p = Producer({"bootstrap.servers": s.kafka_bootstrap})
        p.produce(s.commands_topic, key=sid.encode(), value=raw)
        assert p.flush(30) == 0

        def dead_lettered() -> bytes | None:
            for rec in read_topic(s, s.dlq_topic):
                if cid.encode() in (rec.value or b""):
                    return rec.headers.get("error.message", b"")
            return None

        why = wait_until(dead_lettered, timeout=60, what="the NUL command in the DLQ")
        assert b"NUL" in why, why
        ok = c.post(f"/v1/sessions/{sid}/commands", json=_prompt("after"))
        assert ok.status_code == 200, ok.text
    world.wait_sink(f"acme:{sid}", "run.started")


def test_stats_come_from_the_analytics_app_per_tenant(world: GatewayWorld) -> None:
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    sid = _sid()
    with world.client(world.key(tenant)) as c:
        run_id = c.post(f"/v1/sessions/{sid}/commands", json=_prompt()).json()["runId"]
        c.post(f"/v1/sessions/{sid}/commands", json=_prompt("busy"))
        c.post(f"/v1/sessions/{sid}/commands", json={"type": "abort", "runId": run_id})
        c.post(f"/v1/sessions/{_sid()}/commands", json=_prompt("still running"))

        def counted() -> dict[str, Any] | None:
            r = c.get("/v1/stats", params={"minutes": 10})
            if r.status_code != 200:
                return None
            body: dict[str, Any] = r.json()
            totals = body["runs"]["totals"].get(tenant, {})
            return body if totals.get("started") == 2 and totals.get("cancelled") == 1 else None

        stats = wait_until(counted, timeout=90, interval=0.5, what="analytics to count the runs")
    assert stats["tenantId"] == tenant
    assert set(stats["runs"]["totals"]) == {tenant}, "only the key's tenant"
    assert stats["rejections"]["totals"][tenant] == {"session_busy": 1}
    assert stats["cancelLatency"]["overall"]["count"] == 1
    assert stats["durations"]["overall"]["count"] == 1
    assert stats["active"] == {"total": 1, "tenants": {tenant: 1}}


def test_rate_limit_per_key_is_429_with_retry_after(world: GatewayWorld) -> None:
    s = world.settings
    limited, other = world.key("acme"), world.key("acme")
    with world.client(limited) as c:
        codes = [c.get("/v1/whoami") for _ in range(s.gateway_rate_burst + 20)]
    too_many = [r for r in codes if r.status_code == 429]
    assert too_many, [r.status_code for r in codes]
    assert int(too_many[0].headers["Retry-After"]) >= 1
    assert too_many[0].json()["error"]["code"] == "rate_limited"
    with world.client(other) as c:
        assert c.get("/v1/whoami").status_code == 200, "another key has its own bucket"
    time.sleep(1.0)
    with world.client(limited) as c:
        assert c.get("/v1/whoami").status_code == 200, "the bucket refills"


def test_openapi_and_the_console_are_served(world: GatewayWorld) -> None:
    with httpx.Client(base_url=world.url) as c:
        spec = c.get("/openapi.json").json()
        for path in (
            "/v1/sessions/{sessionId}/commands",
            "/v1/sessions/{sessionId}",
            "/v1/sessions/{sessionId}/events",
            "/v1/runs/{runId}",
            "/v1/runs/{runId}/events",
            "/v1/stats",
        ):
            assert path in spec["paths"], path
        body = spec["paths"]["/v1/sessions/{sessionId}/commands"]["post"]["requestBody"]
        assert "prompt" in json.dumps(body)
        page = c.get("/")
        assert page.status_code == 200 and "sessionstream" in page.text
        assert c.get("/v1/nothing").json()["error"]["code"] == "not_found"
        health = c.get("/healthz")
        assert health.status_code == 200, health.text
        assert health.json()["threads"] == {"commands": True, "events": True}


def test_an_unreadable_event_fails_only_its_sessions_waiting_command(settings: Settings) -> None:
    """A record on `session.events` the gateway cannot decode (a newer processor's event,
    or bytes that are no event) arrives while commands of its session and of another wait
    for their outcomes. The first gets 502 `incompatible_event`, the other its outcome,
    and the gateway goes on: the next command of the same session is answered, and
    /healthz is ok. (The commands thread used to die on it: every later POST waited
    forever.) Its own world: the sink stops on such an event by design."""
    import signal

    from confluent_kafka import Producer

    w = gateway_world(settings, "gwbad")
    try:
        w.start()
        s = w.settings
        w.procs[1].stop()  # the sink: it would stop at the record (upgrade the sink)
        proc = w.procs[0].popen
        assert proc is not None
        x, y = _sid(), _sid()
        with w.client(w.key("acme")) as c:
            sent = c.get("/healthz").json()["commandsSent"]
            results: dict[str, httpx.Response] = {}

            def post(sid: str) -> None:
                results[sid] = c.post(f"/v1/sessions/{sid}/commands?wait=30", json=_prompt())

            proc.send_signal(signal.SIGSTOP)  # no outcome before the record is there
            try:
                posts = [threading.Thread(target=post, args=(sid,)) for sid in (x, y)]
                for t in posts:
                    t.start()
                wait_until(
                    lambda: c.get("/healthz").json()["commandsSent"] >= sent + 2,
                    timeout=30,
                    what="both commands produced",
                )
                p = Producer({"bootstrap.servers": s.kafka_bootstrap})
                p.produce(
                    s.events_topic,
                    key=f"acme:{x}/r-unknown/0000000001".encode(),
                    value=b"\x00\x07not an event",
                    partition=partition_for(f"acme:{x}".encode(), s.partitions),
                )
                assert p.flush(30) == 0
            finally:
                proc.send_signal(signal.SIGCONT)
            for t in posts:
                t.join(60)
            assert results[x].status_code == 502, results[x].text
            err = results[x].json()["error"]
            assert err["code"] == "incompatible_event" and "cannot read" in err["message"]
            assert results[y].status_code == 200 and results[y].json()["status"] == "accepted"
            # the gateway goes on: the same session's next command is answered
            busy = c.post(f"/v1/sessions/{x}/commands", json=_prompt("again"))
            assert busy.status_code == 409 and busy.json()["reason"] == "session_busy", busy.text
            health = c.get("/healthz")
            assert health.status_code == 200 and health.json()["commandsRestarts"] == 0
        assert w.gateway is not None
        w.gateway.wait_log("this version cannot read", 10)
    finally:
        w.stop()
