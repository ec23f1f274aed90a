"""The gateway under attack (the abuse limits), against the real broker, PostgreSQL, processor and
sink: each attempt an attacker made, run again, bounded in count and time, on loopback.
What must hold: one tenant never delays another's resumed stream beyond a second; every
way in has a time limit and a cap (429/503 with Retry-After); a flood of made-up keys
is refused before it becomes queries; browser hardening headers everywhere; no key in
any log; a client that leaves is an INFO line, not a traceback."""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from sessionstream.adapters.registry import reader_codec
from sessionstream.core.partitioning import partition_for
from sessionstream.schemas.events import Event
from sessionstream.settings import Settings, get_settings
from tests.integration.abuse import (
    fill_session,
    first_event_s,
    id_on_partition_of,
    raw_request,
    rss_mb,
    sse_head,
    stalled_streams,
)
from tests.integration.gateway_world import SSE, GatewayWorld, gateway_world
from tests.integration.helpers import wait_until

pytestmark = pytest.mark.integration

LIMITS = {
    "gateway_header_timeout_s": 2.0,
    "gateway_body_timeout_s": 2.0,
    "gateway_idle_timeout_s": 2,
    "gateway_max_connections": 40,
    "gateway_max_connections_per_address": 24,
    "gateway_sse_per_key": 10,
    "gateway_sse_per_tenant": 14,
    "gateway_sse_send_timeout_s": 2.0,
    "gateway_unauthenticated_per_s": 2.0,
    "gateway_unauthenticated_burst": 10,
    # the attacker's own set-up (hundreds of commands) is not what is tested here
    "gateway_rate_per_s": 500.0,
    "gateway_rate_burst": 1000,
}


@pytest.fixture(scope="module")
def world(settings: Settings) -> Iterator[GatewayWorld]:
    w = gateway_world(settings, "abuse", **LIMITS)
    try:
        yield w.start(gateway_args=("--access-log",))
    finally:
        w.stop()


def _host_port(w: GatewayWorld) -> tuple[str, int]:
    return "127.0.0.1", w.settings.gateway_port


def _health(w: GatewayWorld) -> dict[str, object]:
    with httpx.Client(base_url=w.url, timeout=10) as c:
        body: dict[str, object] = c.get("/healthz").json()
        return body


def _closed_within(sock: socket.socket, seconds: float) -> tuple[float, bytes]:
    """Read until the gateway closes `sock`: (seconds it took, what it sent)."""
    started = time.monotonic()
    sock.settimeout(seconds)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except TimeoutError:
        raise AssertionError(f"still open after {seconds}s; got {got[:200]!r}") from None
    except ConnectionResetError:
        pass
    return time.monotonic() - started, got


def _answer(sock: socket.socket) -> bytes:
    """A response's head, and its body when it has a length (an event stream has none)."""
    sock.settimeout(5)
    got = b""
    while b"\r\n\r\n" not in got:
        got += sock.recv(4096)
    head, _, body = got.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
         if line.startswith(b"content-length:")),
        None,
    )  # fmt: skip
    while length is not None and len(body) < length:
        body += sock.recv(4096)
    return head + b"\r\n\r\n" + body


# -- 1. one tenant's catch-ups cannot starve another's ---------------------------------------
def test_a_tenant_that_does_not_read_cannot_delay_another_tenants_resume(
    world: GatewayWorld,
) -> None:
    """B fills its session (20 x 240 KB prompts and abort reasons, 400 rejections), then
    holds 8 streams that resume it from the start and never read. A's resume of its own
    session, on the same partition, behind all of B's records, got its first event after
    27.5 s; now within a second, each time. B's stalled streams are cut off within
    seconds, and the gateway's memory stays bounded."""
    b_key, a_key = world.key("bee"), world.key("acme")
    big = f"big-{uuid.uuid4().hex[:6]}"
    with world.client(b_key, timeout=60) as b:
        fill_session(b, big)
    mine = id_on_partition_of(f"bee:{big}", "acme", world.settings.partitions)
    with world.client(a_key) as a:
        assert a.post(f"/v1/sessions/{mine}/commands", json={"type": "abort"}).status_code == 409
    assert world.gateway is not None
    pid = world.gateway.pid
    host, port = _host_port(world)
    quiet = first_event_s(world.url, a_key, mine, -1)
    rss_before = rss_mb(pid)
    with stalled_streams(host, port, big, b_key, 8):
        time.sleep(1.0)  # their first pages are read and their sockets fill
        delays = [first_event_s(world.url, a_key, mine, -1) for _ in range(3)]
        peak = rss_mb(pid)
        # the non-readers are closed once a write waits 2 s (gateway_sse_send_timeout_s)
        wait_until(
            lambda: _health(world)["sseClients"] == 0,
            timeout=20,
            what="the stalled streams closed",
        )
    print(
        f"resume: quiet {quiet:.3f}s, under attack {delays}; RSS {rss_before:.0f} -> {peak:.0f} MB"
    )
    assert max(delays) < 1.0, delays
    assert peak - rss_before < 150, (rss_before, peak)
    log = world.gateway.log_text()
    assert "took nothing for 2 s: closed" in log
    assert "Traceback" not in log and " ERROR " not in log


def test_one_tenant_reads_at_most_its_slots_however_many_streams_it_resumes(
    world: GatewayWorld,
) -> None:
    """B resumes its long session on as many streams as its key may open and reads them
    all (slowly enough to overlap); A's resume is still served within a second."""
    b_key, a_key = world.key("bee"), world.key("acme")
    big = f"big-{uuid.uuid4().hex[:6]}"
    with world.client(b_key, timeout=60) as b:
        fill_session(b, big, cycles=6, small=100)
    mine = id_on_partition_of(f"bee:{big}", "acme", world.settings.partitions)
    with world.client(a_key) as a:
        assert a.post(f"/v1/sessions/{mine}/commands", json={"type": "abort"}).status_code == 409
    host, port = _host_port(world)
    socks = [
        raw_request(host, port, sse_head(host, port, big, b_key, -1))
        for _ in range(LIMITS["gateway_sse_per_key"])  # type: ignore[arg-type]
    ]
    try:
        for s in socks:
            s.settimeout(5)
            assert s.recv(64).startswith(b"HTTP/1.1 200"), "B's streams are served too"
        assert first_event_s(world.url, a_key, mine, -1) < 1.0
    finally:
        for s in socks:
            s.close()


# -- 2. limits on every way in --------------------------------------------------------------
def test_a_connection_that_sends_nothing_or_a_head_byte_by_byte_is_cut_at_the_head_timeout(
    world: GatewayWorld,
) -> None:
    host, port = _host_port(world)
    silent = raw_request(host, port, b"")
    took, got = _closed_within(silent, 6)
    assert 1.5 < took < 4 and got.startswith(b"HTTP/1.1 408"), (took, got)

    slow = raw_request(host, port, b"G")
    started = time.monotonic()
    with pytest.raises((BrokenPipeError, ConnectionResetError, AssertionError)):
        for ch in b"ET /v1/whoami HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 100:
            slow.sendall(bytes([ch]))
            time.sleep(0.3)
            if time.monotonic() - started > 6:
                raise AssertionError("a byte-by-byte head was not cut off")
    assert time.monotonic() - started < 4


def test_a_body_that_trickles_is_cut_at_the_body_timeout(world: GatewayWorld) -> None:
    host, port = _host_port(world)
    key = world.key("acme")
    head = (
        f"POST /v1/sessions/s1/commands HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        "Content-Type: application/json\r\nContent-Length: 500\r\n\r\n"
    ).encode()
    sock = raw_request(host, port, head + b'{"type": ')
    took, got = _closed_within(sock, 6)
    assert 1.5 < took < 4 and got.startswith(b"HTTP/1.1 408"), (took, got)


def test_an_idle_kept_alive_connection_is_closed(world: GatewayWorld) -> None:
    host, port = _host_port(world)
    sock = raw_request(host, port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    took, got = _closed_within(sock, 8)
    assert got.startswith(b"HTTP/1.1 200") and took < 5, (took, got[:100])


def _answers_now(socks: list[socket.socket]) -> list[bytes | None]:
    """What each socket has been sent so far (None: nothing yet, the connection waits)."""
    time.sleep(0.5)  # well inside the 2 s head timeout: the silent ones are still open
    out: list[bytes | None] = []
    for sock in socks:
        sock.setblocking(False)
        try:
            out.append(sock.recv(4096))
        except BlockingIOError:
            out.append(None)
    return out


def test_connections_are_capped_per_address_and_in_all_with_retry_after(
    world: GatewayWorld,
) -> None:
    host, port = _host_port(world)
    per_address = LIMITS["gateway_max_connections_per_address"]
    total = LIMITS["gateway_max_connections"]
    assert isinstance(per_address, int) and isinstance(total, int)
    held: list[socket.socket] = []
    try:
        held += [raw_request(host, port, b"") for _ in range(per_address + 4)]
        got = _answers_now(held)
        waiting = [g for g in got if g is None]
        refused = [g for g in got if g is not None]
        assert 0 < len(waiting) <= per_address and refused, got
        for answer in refused:
            assert answer.startswith(b"HTTP/1.1 429"), answer
            assert b"retry-after: 1" in answer.lower() and b"from this address" in answer
        # from other loopback addresses, until the gateway holds `total` in all
        others = [
            raw_request(host, port, b"", source=f"127.0.0.{2 + i % 20}") for i in range(total)
        ]
        held += others
        got = _answers_now(others)
        busy = [g for g in got if g is not None]
        assert busy and all(g.startswith(b"HTTP/1.1 503") for g in busy), got
        assert b"retry-after: 1" in busy[0].lower() and b"too many connections" in busy[0]
        assert len(waiting) + got.count(None) <= total
    finally:
        for s in held:
            s.close()
    wait_until(
        lambda: httpx.get(f"{world.url}/healthz", timeout=5).status_code == 200,
        timeout=10,
        what="the gateway serving again once the connections are gone",
    )


def test_event_streams_are_capped_per_key_and_per_tenant(world: GatewayWorld) -> None:
    host, port = _host_port(world)
    tenant = f"t{uuid.uuid4().hex[:6]}"
    k1, k2 = world.key(tenant), world.key(tenant)
    per_key, per_tenant = LIMITS["gateway_sse_per_key"], LIMITS["gateway_sse_per_tenant"]
    socks: list[socket.socket] = []

    def open_stream(key: str) -> bytes:
        s = raw_request(host, port, sse_head(host, port, "s", key, None))
        socks.append(s)
        return _answer(s)

    try:
        for _ in range(per_key):  # type: ignore[arg-type]
            assert open_stream(k1).startswith(b"HTTP/1.1 200")
        over = open_stream(k1)
        assert over.startswith(b"HTTP/1.1 429") and b"retry-after:" in over.lower(), over
        assert b"with this key" in over
        for _ in range(per_tenant - per_key):  # type: ignore[operator]
            assert open_stream(k2).startswith(b"HTTP/1.1 200")
        over = open_stream(k2)
        assert over.startswith(b"HTTP/1.1 429") and b"of this tenant" in over, over
        # another tenant is not affected
        with world.client(world.key("acme")) as c, c.stream("GET", "/v1/sessions/s/events") as r:
            assert r.status_code == 200
    finally:
        for s in socks:
            s.close()
    # closed streams give their places back
    wait_until(lambda: _health(world)["sseClients"] == 0, timeout=10, what="streams closed")
    assert open_stream(k1).startswith(b"HTTP/1.1 200")
    socks[-1].close()


def test_made_up_keys_are_refused_before_they_become_queries(world: GatewayWorld) -> None:
    """600 distinct well-formed bad keys made 538 scans of `api_keys`. (From an address
    of its own: the other tests' clients are not the flood's.)"""
    before = _health(world)["keyQueries"]
    codes: dict[int, int] = {}
    retry = None
    flood = httpx.HTTPTransport(local_address="127.0.0.77")
    with httpx.Client(base_url=world.url, timeout=10, transport=flood) as c:
        for _ in range(600):
            key = f"ssk_{uuid.uuid4().hex[:12]}_" + "x" * 43
            r = c.get("/v1/whoami", headers={"Authorization": f"Bearer {key}"})
            codes[r.status_code] = codes.get(r.status_code, 0) + 1
            if r.status_code == 429:
                retry = r.headers.get("Retry-After")
        # the flood's address is spent, but a key the gateway knows is never charged
        good = world.key("acme")
        with world.client(good) as elsewhere:
            assert elsewhere.get("/v1/whoami").status_code == 200
        assert c.get("/v1/whoami", headers={"Authorization": f"Bearer {good}"}).status_code == 200
    queries = int(_health(world)["keyQueries"]) - int(before)  # type: ignore[call-overload]
    assert codes.get(429, 0) >= 550 and set(codes) <= {401, 429}, codes
    assert retry is not None and int(retry) >= 1
    assert queries <= 40, queries  # the burst, what the rate refilled meanwhile, the good key


# -- 3. browser hardening, keys out of logs -------------------------------------------------
def test_every_answer_has_the_security_headers_and_docs_are_off(world: GatewayWorld) -> None:
    key = world.key("acme")
    with httpx.Client(base_url=world.url, timeout=10) as c:
        answers = [
            c.get("/"),
            c.get("/static/app.js"),
            c.get("/v1/sessions"),  # 401
            c.get("/v1/sessions", headers={"Authorization": f"Bearer {key}"}),
            c.get("/nothing"),
            c.get("/openapi.json"),
        ]
        assert c.get("/docs").status_code == 404, "Swagger UI is off unless asked for"
    for r in answers:
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"], r.url
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["referrer-policy"] == "no-referrer"
    assert "cdn" not in answers[0].text.lower()


def test_no_key_reaches_the_access_log(world: GatewayWorld) -> None:
    key = world.key("acme")
    secret = key.split("_", 2)[2]
    with httpx.Client(base_url=world.url, timeout=10) as c:
        assert c.get(f"/?key={key}").status_code == 200
        c.get(f"/v1/whoami?key={key}")
    assert world.gateway is not None
    world.gateway.wait_log(f"/?key={key[:17]}***", 10)
    assert secret not in world.gateway.log_text()


def test_strict_input_through_http(world: GatewayWorld) -> None:
    with world.client(world.key("acme")) as c:
        url = f"/v1/sessions/{uuid.uuid4().hex[:8]}/commands"
        for body, code in (
            ({"type": "prompt", "payload": {"text": "t", "timeoutMs": True}}, "invalid_command"),
            ({"type": "prompt", "payload": {"text": "t", "timeoutMs": "100"}}, "invalid_command"),
        ):
            r = c.post(url, json=body)
            assert (r.status_code, r.json()["error"]["code"]) == (400, code), r.text
        r = c.post(
            url,
            content=b'{"type": "abort", "type": "prompt", "payload": {"text": "x"}}',
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 400 and "twice" in r.json()["error"]["message"]
        for path in ("/v1/sessions/%ff", "/v1/sessions/a%2Fb/events"):
            r = c.get(path)
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_path", path
        for bad in ("1_000", "+3", " 5"):
            r = c.get("/v1/sessions/s/events", params={"lastEventId": bad})
            assert r.status_code == 400, bad


# -- 4. a session's stream holds its own events only -----------------------------------------
def test_a_session_named_with_a_slash_before_the_rules_does_not_leak_into_its_prefix(
    world: GatewayWorld,
) -> None:
    """`X/y` (possible through Kafka and the SDK before ids refused '/') had its events
    in the stream of `X`: the fan-out routed by the key's first part, the catch-up by key
    prefix. Such an event (as an older log holds it) is now in neither."""
    from confluent_kafka import Producer

    s = world.settings
    local = f"x{uuid.uuid4().hex[:6]}"
    full = f"acme:{local}"
    key = world.key("acme")
    legacy = Event.model_validate(
        {
            "sessionId": f"{full}/y",
            "runId": "_session",
            "seq": 1,
            "type": "command.rejected",
            "payload": {"reason": "session_busy", "commandType": "prompt"},
            "generation": 0,
            "commandId": "legacy",
            "ts": 1,
            "tenantId": "acme",
        }
    )
    part = partition_for(full.encode(), s.partitions)
    with world.client(key) as c, c.stream("GET", f"/v1/sessions/{local}/events") as live:
        p = Producer({"bootstrap.servers": s.kafka_bootstrap})
        p.produce(
            s.events_topic,
            key=legacy.key.encode(),
            value=reader_codec(get_settings()).encode_event(legacy),
            partition=part,
        )
        assert p.flush(30) == 0
        with world.client(key) as other:
            r = other.post(f"/v1/sessions/{local}/commands", json={"type": "abort"})
            assert r.status_code == 409
        stream = SSE(live)
        _, _, data = next(stream)
        assert data["commandId"] != "legacy" and data["sessionId"] == local, data
    with (
        world.client(key) as c,
        c.stream("GET", f"/v1/sessions/{local}/events", headers={"Last-Event-ID": "-1"}) as resumed,
    ):
        _, _, data = next(SSE(resumed))
        assert data["commandId"] != "legacy", "the catch-up skipped it too"


def test_a_client_that_leaves_is_an_info_line(world: GatewayWorld) -> None:
    host, port = _host_port(world)
    key = world.key("acme")
    assert world.gateway is not None
    mark = len(world.gateway.log_text())
    # mid-stream, mid-body, and mid-wait for an outcome
    s = raw_request(host, port, sse_head(host, port, "gone", key, -1))
    s.recv(100)
    s.close()
    body = json.dumps({"type": "prompt", "payload": {"text": "x"}}).encode()
    s = raw_request(
        host,
        port,
        (
            f"POST /v1/sessions/gone/commands HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}"
            f"\r\nContent-Type: application/json\r\nContent-Length: {len(body) + 50}\r\n\r\n"
        ).encode()
        + body,
    )
    time.sleep(0.3)
    s.close()
    s = raw_request(
        host,
        port,
        (
            f"POST /v1/sessions/gone/commands HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}"
            f"\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        + body,
    )
    s.close()
    world.gateway.wait_log("left before its request body was complete", 10, after=mark)
    time.sleep(1.0)
    tail = world.gateway.log_text()[mark:]
    assert "Traceback" not in tail and " ERROR " not in tail, tail[-3000:]
