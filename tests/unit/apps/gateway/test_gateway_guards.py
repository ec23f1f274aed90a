"""What the gateway refuses before anything reaches Kafka or PostgreSQL, and what it adds
to every answer — written from docs/http.md, checked without a server:
tenant-namespaced session ids, strict JSON (no doubled keys, JSON's own types), paths that
mean one thing, security headers, keys kept out of logs, per-address and per-key limits."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from sessionstream.adapters._logging import RedactKeys
from sessionstream.apps.gateway.auth import Authenticator, Principal
from sessionstream.apps.gateway.commands import build_command, read_json
from sessionstream.apps.gateway.errors import ApiError
from sessionstream.apps.gateway.guard import Guard
from sessionstream.apps.gateway.keys import ApiKey
from sessionstream.apps.gateway.limits import AddressBuckets, StreamCounts
from sessionstream.schemas.commands import Command
from sessionstream.schemas.sessions import local_session_id, scoped_session_id, session_id_problem
from sessionstream.settings import Settings

WHO = Principal("abcdef012345", "acme", "alice")


# -- session ids: namespaced by tenant, never a prefix path of another's -----------------------
def test_a_tenants_session_is_its_namespace_and_its_own_id() -> None:
    assert scoped_session_id("acme", "s1") == "acme:s1"
    assert scoped_session_id("acme", "a:b") == "acme:a:b"  # the first ':' is the tenant's
    assert local_session_id("acme", "acme:a:b") == "a:b"
    assert local_session_id("acme", "legacy") == "legacy"  # unscoped: its own
    assert local_session_id("acme", "globex:s1") == "globex:s1"
    with pytest.raises(ValueError, match="namespace"):
        scoped_session_id("a:b", "s1")  # tenant "a" would own it


@pytest.mark.parametrize(
    ("tenant", "session", "refused"),
    [
        ("acme", "acme:s1", None),
        ("acme", "s1", None),  # unscoped, as ids were before namespaces
        ("acme", "acme:x:y", None),
        ("globex", "acme:s1", "acme"),  # another tenant's namespace
        ("acme:x", "acme:x:s1", "acme"),  # the namespace is up to the first ':'
        ("acme", "acme:s/1", "'/'"),
        ("acme", "X/y", "'/'"),  # its events would sort under session X's key prefix
    ],
)
def test_producer_commands_name_sessions_of_their_tenant_only(
    tenant: str, session: str, refused: str | None
) -> None:
    problem = session_id_problem(tenant, session)
    data = {
        "commandId": "c1",
        "sessionId": session,
        "tenantId": tenant,
        "type": "prompt",
        "ts": 1,
        "payload": {"text": "hi"},
    }
    if refused is None:
        assert problem is None
        assert Command.model_validate(data).session_id == session
    else:
        assert problem is not None and refused in problem
        with pytest.raises(ValueError, match="sessionId"):
            Command.model_validate(data)


def test_a_run_of_a_session_named_before_the_rules_can_still_end() -> None:
    """Worker and timer commands copy the id from the log: a session that already had
    '/' or a foreign namespace keeps being served until its run ends."""
    for type_, extra in (
        ("run.complete", {"runId": "r", "workerId": "w", "generation": 1, "payload": {}}),
        ("timer.fired", {"runId": "r", "payload": {"kind": "run_deadline", "dueAt": 5}}),
    ):
        c = Command.model_validate(
            {"commandId": "c", "sessionId": "X/y", "tenantId": "acme", "type": type_, "ts": 1}
            | extra
        )
        assert c.session_id == "X/y"


# -- strict JSON ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "payload",
    [
        {"text": "t", "timeoutMs": True},  # read as 1 ms
        {"text": "t", "timeoutMs": "100"},  # read as 100
        {"text": "t", "timeoutMs": 100.0},
        {"text": 5},
        {"text": "t", "policy": 1},
    ],
)
def test_payload_numbers_and_booleans_are_of_their_json_type(payload: dict[str, Any]) -> None:
    with pytest.raises(ApiError) as e:
        build_command("acme:s1", {"type": "prompt", "payload": payload}, WHO)
    assert (e.value.status, e.value.code) == (400, "invalid_command")
    assert all(d["loc"].startswith("payload.") for d in e.value.details)


def test_a_well_typed_payload_is_taken() -> None:
    c = build_command("acme:s1", {"type": "prompt", "payload": {"text": "t", "timeoutMs": 5}}, WHO)
    assert c.payload_as(type(c.payload)).timeout_ms == 5  # type: ignore[attr-defined]


async def _read(raw: bytes) -> Any:
    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": raw, "more_body": False}

    scope = {"type": "http", "method": "POST", "headers": [(b"content-type", b"application/json")]}
    return await read_json(Request(scope, receive), 1 << 20)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"type": "abort", "type": "prompt"}',
        b'{"type": "prompt", "payload": {"text": "a", "text": "b"}}',
        b'[{"a": 1, "a": 1}]',
    ],
)
async def test_a_key_given_twice_is_malformed_json(raw: bytes) -> None:
    with pytest.raises(ApiError) as e:
        await _read(raw)
    assert (e.value.status, e.value.code) == (400, "malformed_json")
    assert "twice" in e.value.message


async def test_distinct_keys_in_distinct_objects_are_fine() -> None:
    got = await _read(b'{"type": "prompt", "payload": {"type": "x", "text": "y"}}')
    assert got == {"type": "prompt", "payload": {"type": "x", "text": "y"}}


# -- paths and headers ---------------------------------------------------------------------------
def _guarded() -> httpx.AsyncClient:
    async def echo(request: Request) -> PlainTextResponse:
        return PlainTextResponse(request.path_params["sid"])

    async def framed(request: Request) -> PlainTextResponse:
        return PlainTextResponse("x", headers={"Content-Security-Policy": "default-src *"})

    app = Starlette(routes=[Route("/v1/s/{sid}", echo), Route("/own", framed)])
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=Guard(app)), base_url="http://t")


@pytest.mark.parametrize("path", ["/v1/s/%ff", "/v1/s/a%2Fb", "/v1/s/a%2fb", "/v1/s/a%00"])
async def test_a_path_that_could_mean_two_things_is_refused(path: str) -> None:
    async with _guarded() as c:
        r = await c.get(path)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_path", r.text
    assert r.headers["x-frame-options"] == "DENY"


async def test_every_answer_carries_the_security_headers() -> None:
    async with _guarded() as c:
        ok = await c.get("/v1/s/%C3%A9")  # UTF-8 percent-encoding is fine
        missing = await c.get("/nothing")
        own = await c.get("/own")
    assert ok.status_code == 200 and ok.text == "é"
    for r in (ok, missing):
        csp = r.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp
        assert "unsafe-inline" not in csp
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["referrer-policy"] == "no-referrer"
        assert r.headers["x-frame-options"] == "DENY"
    assert own.headers["content-security-policy"] == "default-src *", "a route's own is kept"


# -- keys never in a log ---------------------------------------------------------------------------
def test_a_key_in_a_log_line_keeps_its_id_and_loses_its_secret() -> None:
    key = "ssk_0123456789ab_" + "S3cr3t-_" * 5
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "GET %s HTTP/1.1" %d',
        ("127.0.0.1:5", f"/?key={key}&x=1", 200), None,
    )  # fmt: skip
    assert RedactKeys().filter(record)
    line = record.getMessage()
    assert "S3cr3t" not in line and "ssk_0123456789ab_***&x=1" in line


# -- limits --------------------------------------------------------------------------------------
def test_streams_are_counted_per_key_and_per_tenant() -> None:
    counts = StreamCounts(per_key=2, per_tenant=3)
    a1 = counts.open("k1", "acme")
    counts.open("k1", "acme")
    with pytest.raises(ApiError) as e:
        counts.open("k1", "acme")
    assert e.value.status == 429 and int(e.value.headers["Retry-After"]) >= 1
    counts.open("k2", "acme")
    with pytest.raises(ApiError, match="tenant"):
        counts.open("k3", "acme")  # a new key of the same tenant
    counts.open("k9", "globex")  # another tenant is not affected
    a1()
    a1()  # closing twice gives back one
    counts.open("k3", "acme")
    assert counts.tenants["acme"] == 3 and counts.keys["k1"] == 1


def test_address_buckets_forget_the_least_recently_used_address() -> None:
    b = AddressBuckets(rate=0.001, burst=1, max_addresses=2)
    assert b.take("a") == 0 and b.take("b") == 0
    assert b.take("a") > 0  # a's burst is spent
    b.take("c")  # b (least recently used) goes, a stays
    assert b.take("a") > 0, "a is still remembered"
    assert b.take("b") == 0, "b was forgotten: a fresh bucket"
    assert b.take("c") == 0, "and b's coming back pushed out c, the least recently used"


class _KeyDb:
    """Every key unknown but `good`; counts what reaches the database."""

    def __init__(self, good: str) -> None:
        self.good = good
        self.asked = 0

    async def run(self, fn: object, key: str) -> ApiKey | None:
        self.asked += 1
        await asyncio.sleep(0)
        if key != self.good:
            return None
        from datetime import UTC, datetime

        return ApiKey("0123456789ab", "acme", "alice", None, datetime.now(UTC))


def _key(i: int) -> str:
    return f"ssk_{i:012x}_" + "x" * 43


async def test_made_up_keys_from_one_address_are_429_before_they_are_queries() -> None:
    """600 distinct well-formed bad keys made 538 queries through the pool the real key
    checks use. Now one address gets `gateway_unauthenticated_burst` of them, then 429."""
    s = Settings(gateway_unauthenticated_per_s=0.01, gateway_unauthenticated_burst=5)
    db = _KeyDb(good=_key(9999))
    auth = Authenticator(s, db)  # type: ignore[arg-type]
    codes = []
    for i in range(600):
        try:
            await auth.principal(f"Bearer {_key(i)}", None, "10.0.0.66")
        except ApiError as e:
            codes.append(e.status)
    assert codes.count(401) == 5 and codes.count(429) == 595
    assert db.asked == 5
    # a known good key is never charged: the flood does not lock its owner out of that
    # address for long, and another address is untouched
    assert (await auth.principal(f"Bearer {_key(9999)}", None, "10.0.0.7")).tenant_id == "acme"
    for _ in range(20):  # cached now: no token, no query
        await auth.principal(f"Bearer {_key(9999)}", None, "10.0.0.66")
    assert db.asked == 6


# -- the gateway's client keeps bounded memory per session ---------------------------------------
def test_the_client_forgets_a_sessions_run_once_it_ends_and_bounds_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It kept ~186 B for every session that ever started a run, forever."""
    from sessionstream import client as sdk
    from sessionstream.schemas.codec import Codec

    def event(session: str, type_: str, payload: dict[str, Any]) -> Any:
        from sessionstream.schemas.events import Event

        return Event.model_validate(
            {
                "sessionId": session,
                "runId": f"r-{session}",
                "seq": 1,
                "type": type_,
                "payload": payload,
                "generation": 1,
                "commandId": "c",
                "ts": 1,
                "tenantId": "acme",
            }
        )

    started = {"prompt": "p", "origin": "prompt", "sourceCommandId": "c", "timeoutAt": 9}
    finished = {"terminalStatus": "cancelled"}
    c = sdk.SessionClient("acme", Settings(), codec=Codec())
    assert c.session_id("s1") == "acme:s1"
    for i in range(100):
        c._saw(event(f"s{i}", "run.started", started))
        c._saw(event(f"s{i}", "run.finished", finished))
    assert len(c._runs) == 0 and c.known_run("s5") is None
    monkeypatch.setattr(sdk, "_RUNS_MAX", 10)
    for i in range(25):
        c._saw(event(f"s{i}", "run.started", started))
    assert len(c._runs) == 10 and c.known_run("s24") == "r-s24" and c.known_run("s0") is None


# -- Swagger UI: off by default, from the package when on ----------------------------------------
@pytest.mark.parametrize("docs", [False, True])
async def test_swagger_ui_is_off_by_default_and_served_from_the_package(docs: bool) -> None:
    from sessionstream.apps.gateway.app import create_app

    app = create_app(Settings(gateway_docs=docs))  # no lifespan: nothing connects
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        page = await c.get("/docs")
        if not docs:
            assert page.status_code == 404
            return
        assert page.status_code == 200
        assert "/docs/assets/swagger-ui-bundle.js" in page.text and "<script>" not in page.text
        assert "http" not in page.text.replace("http-equiv", ""), "nothing from elsewhere"
        csp = page.headers["content-security-policy"]
        assert "script-src 'self';" in csp and "frame-ancestors 'none'" in csp
        bundle = await c.get("/docs/assets/swagger-ui-bundle.js")
        assert bundle.status_code == 200 and len(bundle.content) > 100_000
        assert (await c.get("/static/docs.js")).status_code == 200


async def test_a_live_key_whose_cache_entry_expired_is_not_charged_as_unauthenticated() -> None:
    """Found by the peers benchmark: when a live key's cache entry expired under load, each
    request in flight took a token of the address's no-valid-key bucket before the one
    lookup; past its burst the key's owner got 429. A key last seen live is revalidated
    without a token; one last seen dead (or never seen) still pays."""
    s = Settings(
        gateway_unauthenticated_per_s=0.01,
        gateway_unauthenticated_burst=3,
        gateway_key_cache_s=0.05,
        gateway_rate_per_s=1000,
        gateway_rate_burst=1000,
    )
    db = _KeyDb(good=_key(9999))
    auth = Authenticator(s, db)  # type: ignore[arg-type]
    good = f"Bearer {_key(9999)}"
    assert (await auth.principal(good, None, "10.0.0.9")).tenant_id == "acme"
    await asyncio.sleep(0.06)  # the entry expires
    got = await asyncio.gather(
        *(auth.principal(good, None, "10.0.0.9") for _ in range(50)), return_exceptions=True
    )
    assert [g for g in got if isinstance(g, Exception)] == []
    assert db.asked == 2  # one revalidation for all fifty
    # a made-up key from that address still pays, and the bucket is still whole for it
    codes = []
    for i in range(5):
        try:
            await auth.principal(f"Bearer {_key(i)}", None, "10.0.0.9")
        except ApiError as e:
            codes.append(e.status)
    assert codes == [401, 401, 401, 429, 429]


# -- the commands route's fast path -----------------------------------------------------------
async def test_the_commands_fast_path_answers_as_the_app_does() -> None:
    """POST /v1/sessions/{id}/commands skips FastAPI's layers: its errors keep the app's
    shape and the security headers; everything else is still FastAPI's."""
    from sessionstream.apps.gateway.app import create_app

    app = create_app(Settings())  # no lifespan: nothing connects
    fast = app.user_middleware[0].cls  # the outermost: the fast path
    assert fast.__name__ == "CommandsFastPath"
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        r = await c.post("/v1/sessions/s1/commands", json={"type": "prompt"})
        assert r.status_code == 401, r.text
        assert r.json()["error"]["code"] == "unauthorized"
        assert r.headers["x-content-type-options"] == "nosniff"
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
        # a percent-encoded path goes down the usual stack (Guard judges it): the same route
        r = await c.post("/v1/sessions/a%20b/commands", json={"type": "prompt"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        assert r.headers["x-content-type-options"] == "nosniff"
        # an encoded '/' never reaches a route
        r = await c.post("/v1/sessions/a%2Fb/commands", json={})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_path"
        # not the route: FastAPI answers (its 404 / 405 shapes)
        r = await c.post("/v1/sessions/s1/commands/more", json={})
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        r = await c.get("/v1/sessions/s1/commands")
        assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
        # the route is still described
        spec = (await c.get("/openapi.json")).json()
        assert "post" in spec["paths"]["/v1/sessions/{sessionId}/commands"]
