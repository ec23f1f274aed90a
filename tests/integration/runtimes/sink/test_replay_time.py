"""Replay by time: the CLI's `replay offsets --since/--until`, the gateway's
event stream from a time and its `history` of a session by offset or time, on the real
broker (the events topic stamped by the broker: `LogAppendTime`)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sessionstream.apps._procs import settings_env
from sessionstream.settings import Settings
from tests.integration.gateway_world import SSE, GatewayWorld, gateway_world

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def world(settings: Settings) -> Iterator[tuple[GatewayWorld, str, str, int]]:
    """A session with a first part (a prompt, a rejected prompt, an abort), then a moment
    `split` (ms), then a second part (a prompt and an abort)."""
    w = gateway_world(settings, "rtime")
    w.start()
    key = w.key("acme")
    local = f"t-{int(time.time() * 1000) % 10**8}"
    with w.client(key) as c:
        for body in (
            {"type": "prompt", "payload": {"text": "one"}},
            {"type": "prompt", "payload": {"text": "busy"}},
            {"type": "abort"},
        ):
            assert c.post(f"/v1/sessions/{local}/commands", json=body).status_code in (200, 409)
        split = int(time.time() * 1000) + 1  # every event above was appended before it
        while int(time.time() * 1000) <= split:
            time.sleep(0.005)
        for body in ({"type": "prompt", "payload": {"text": "two"}}, {"type": "abort"}):
            assert c.post(f"/v1/sessions/{local}/commands", json=body).status_code == 200
    try:
        yield w, key, local, split
    finally:
        w.stop()


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _cli(s: Settings, *args: str) -> list[dict[str, object]]:
    exe = Path(sys.executable).with_name("sessionstream")
    out = subprocess.run(
        [str(exe), *args, "--json"], env=settings_env(s), capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


FIRST = ["run.started", "command.rejected", "run.cancel_requested", "run.finished"]
SECOND = ["run.started", "run.cancel_requested", "run.finished"]


def test_the_cli_replays_a_session_by_time(world: tuple[GatewayWorld, str, str, int]) -> None:
    w, _key, local, split = world
    sid = f"acme:{local}"
    before = _cli(w.settings, "replay", "offsets", "--session", sid, "--until", _iso(split))
    after = _cli(w.settings, "replay", "offsets", "--session", sid, "--since", _iso(split))
    assert [e["type"] for e in before] == FIRST
    assert [e["type"] for e in after] == SECOND
    assert [e["type"] for e in _cli(w.settings, "replay", "offsets", "--session", sid)] == (
        FIRST + SECOND
    )
    since_ms = _cli(w.settings, "replay", "offsets", "--session", sid, "--since", str(split))
    assert since_ms == after, "epoch milliseconds mean the same time"


def test_the_gateway_streams_from_a_time_and_pages_a_history(
    world: tuple[GatewayWorld, str, str, int],
) -> None:
    w, key, local, split = world
    with w.client(key) as c:
        with c.stream("GET", f"/v1/sessions/{local}/events", params={"since": _iso(split)}) as r:
            assert r.status_code == 200
            stream = SSE(r)
            got = [next(stream)[1] for _ in SECOND]
        assert got == SECOND
        whole = c.get(f"/v1/sessions/{local}/history").json()
        assert [e["type"] for e in whole["events"]] == FIRST + SECOND
        assert whole["next"] is None and whole["sessionId"] == local
        assert all(e["sessionId"] == local for e in whole["events"])
        offsets = [e["offset"] for e in whole["events"]]
        later = c.get(f"/v1/sessions/{local}/history", params={"since": _iso(split)}).json()
        assert [e["offset"] for e in later["events"]] == offsets[len(FIRST) :]
        earlier = c.get(f"/v1/sessions/{local}/history", params={"until": str(split)}).json()
        assert [e["offset"] for e in earlier["events"]] == offsets[: len(FIRST)]
        # a page at a time: `next` is where the next page starts
        page = c.get(f"/v1/sessions/{local}/history", params={"limit": 2}).json()
        assert [e["offset"] for e in page["events"]] == offsets[:2]
        rest = c.get(
            f"/v1/sessions/{local}/history", params={"from": page["next"], "limit": 100}
        ).json()
        assert [e["offset"] for e in rest["events"]] == offsets[2:]
        window = c.get(
            f"/v1/sessions/{local}/history", params={"from": offsets[1], "to": offsets[3]}
        ).json()
        assert [e["offset"] for e in window["events"]] == offsets[1:3]
        bad = c.get(f"/v1/sessions/{local}/history", params={"since": "yesterday"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request"
    # another tenant's same id is another session: nothing of acme's
    with w.client(w.key("globex")) as other:
        assert other.get(f"/v1/sessions/{local}/history").json()["events"] == []
