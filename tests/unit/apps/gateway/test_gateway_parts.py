"""The gateway's parts that need no server: key shape and hash, the token bucket, how a
request body becomes a command, the SSE queue's bound, the commands thread's recovery."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from dataclasses import replace

import pytest

from sessionstream.apps.gateway._flight import SingleFlight
from sessionstream.apps.gateway.auth import Principal, _presented
from sessionstream.apps.gateway.commands import build_command, outcome_body
from sessionstream.apps.gateway.errors import ApiError
from sessionstream.apps.gateway.fanout import Item, Overflow, Stopped, Subscriber, _deliver, _stop
from sessionstream.apps.gateway.keys import hash_key, parse_key
from sessionstream.apps.gateway.limits import TokenBucket
from sessionstream.apps.gateway.sse import parse_last_event_id
from sessionstream.client import CommandHandle, Outcome
from sessionstream.errors import SessionstreamError
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.commands import MAX_INPUT_DEPTH, Command
from sessionstream.schemas.events import Event
from sessionstream.settings import Settings

WHO = Principal("abcdef012345", "acme", "alice")


def _nested(depth: int) -> list[object]:
    out: list[object] = []
    for _ in range(depth - 1):
        out = [out]
    return out


#: a typed input nested one level deeper than the protocol takes
DEEP = _nested(MAX_INPUT_DEPTH + 1)


def test_keys_have_a_visible_id_and_are_hashed_whole() -> None:
    key = "ssk_abcdef012345_" + "x" * 43
    assert parse_key(key) == "abcdef012345"
    assert hash_key(key) == hashlib.sha256(key.encode()).hexdigest()
    for bad in (
        "",
        "ssk_",
        "ssk_ABCDEF012345_" + "x" * 43,
        "abc_abcdef012345_" + "x" * 43,
        "ssk_abcdef012345_short",
        "ssk_abcdef012345_" + "x" * 43 + " ",
    ):
        assert parse_key(bad) is None, bad


def test_the_key_comes_from_bearer_or_x_api_key() -> None:
    assert _presented("Bearer k1", None) == "k1"
    assert _presented("bearer  k1 ", "k2") == "k1"
    assert _presented("Basic k1", "k2") is None  # a wrong scheme is not silently ignored
    assert _presented(None, "k2") == "k2"
    assert _presented(None, None) is None


def test_token_bucket_allows_the_burst_then_the_rate() -> None:
    b = TokenBucket(rate=10, burst=3)
    assert [b.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = b.take()
    assert 0 < wait <= 0.1
    b.at -= 0.25  # a quarter second later: 2.5 tokens back
    assert b.take() == 0.0 and b.take() == 0.0 and b.take() > 0


def test_a_body_becomes_a_command_of_the_keys_tenant_and_actor() -> None:
    c = build_command("s1", {"type": "prompt", "payload": {"text": "hi"}, "commandId": "c1"}, WHO)
    assert (c.session_id, c.tenant_id, c.actor, c.command_id) == ("s1", "acme", "alice", "c1")
    abort = build_command("s1", {"type": "abort", "runId": "r1"}, WHO)
    assert abort.run_id == "r1" and abort.payload.reason == "user"  # type: ignore[attr-defined]
    assert build_command("s1", {"type": "send", "payload": {"text": "x"}}, WHO).command_id


@pytest.mark.parametrize(
    "given", [{"sku": "A-1", "qty": 2, "tags": ["x", None]}, ["a", 1], "text", 3.5, False]
)
def test_a_prompt_body_carries_its_typed_input_as_the_json_value_it_is(given: object) -> None:
    c = build_command("s1", {"type": "prompt", "payload": {"text": "hi", "input": given}}, WHO)
    assert c.payload.model_dump()["input"] == given
    assert c.payload.model_dump()["input"].__class__ is given.__class__  # 3.5 no str, False no int


@pytest.mark.parametrize(
    ("body", "code"),
    [
        # a typed input JSON can carry and the protocol cannot: NaN (json.loads reads it),
        # nesting past 64 levels, a NUL, an input on a send
        ({"type": "prompt", "payload": {"text": "x", "input": float("nan")}}, "invalid_command"),
        ({"type": "prompt", "payload": {"text": "x", "input": DEEP}}, "invalid_command"),
        (
            {"type": "prompt", "payload": {"text": "x", "input": {"k": "a\u0000"}}},
            "invalid_command",
        ),
        ({"type": "send", "payload": {"text": "x", "input": {"k": 1}}}, "invalid_command"),
        ({"type": "prompt", "payload": {"text": "x"}, "tenantId": "globex"}, "forbidden_field"),
        ({"type": "prompt", "payload": {"text": "x"}, "actor": "root"}, "forbidden_field"),
        ({"type": "lease.acquire", "payload": {}}, "unknown_type"),
        ({"type": "run.complete", "payload": {}}, "unknown_type"),
        ({"payload": {"text": "x"}}, "unknown_type"),
        ({"type": "prompt", "payload": {"text": "x"}, "extra": 1}, "invalid_command"),
        ({"type": "prompt", "payload": {"text": 5}}, "invalid_command"),
        ({"type": "prompt", "payload": "text"}, "invalid_command"),
        ([], "invalid_command"),
        # found in review: these were a 500, a command sent anyway, or another meaning
        ({"type": ["prompt"]}, "unknown_type"),
        ({"type": {}}, "unknown_type"),
        ({"type": "abort", "runId": ""}, "invalid_command"),  # was: the active run
        ({"type": "abort", "runId": 0}, "invalid_command"),
        ({"type": "abort", "commandId": ""}, "invalid_command"),  # was: a fresh id
        ({"type": "abort", "commandId": "a", "command_id": "b"}, "invalid_command"),
        ({"type": "prompt", "payload": {"text": "a\u0000b"}}, "invalid_command"),
        ({"type": "prompt", "payload": {"text": "a\ud800b"}}, "invalid_command"),
        ({"type": "abort", "commandId": "c\u0000"}, "invalid_command"),
        ({"type": "abort", "runId": "\ud800"}, "invalid_command"),
    ],
)
def test_bad_bodies_are_refused_with_a_code(body: object, code: str) -> None:
    with pytest.raises(ApiError) as e:
        build_command("s1", body, WHO)
    assert e.value.status == 400 and e.value.code == code


def test_an_erase_on_the_command_route_is_refused_403_admin_only() -> None:
    """Erasure is an administrator's (docs/protocol.md#erasure-and-retention): never through
    the producers' command route, whatever the key."""
    for who in (WHO, replace(WHO, role="admin")):
        with pytest.raises(ApiError) as e:
            build_command("s1", {"type": "session.erase", "payload": {}}, who)
        assert (e.value.status, e.value.code) == (403, "admin_only")


def test_outcomes_map_to_http_statuses() -> None:
    c = build_command("s1", {"type": "abort"}, WHO)
    assert outcome_body(c, None)[0] == 202
    assert outcome_body(c, Outcome("accepted", c.command_id, run_id="r"))[0] == 200
    assert outcome_body(c, Outcome("duplicate", c.command_id))[0] == 200
    assert outcome_body(c, Outcome("rejected", c.command_id, reason="no_active_run"))[0] == 409
    assert outcome_body(c, Outcome("dead_letter", c.command_id, reason="oversized"))[0] == 422


def test_last_event_id_is_an_offset() -> None:
    assert parse_last_event_id("41", None) == 41
    assert parse_last_event_id(None, "7") == 7
    assert parse_last_event_id("3", "9") == 3  # the header wins
    assert parse_last_event_id(None, None) is None
    assert parse_last_event_id("-1", None) == -1
    # exactly digits: Python's int() takes all of these
    for bad in ("x", "-2", "1.5", "1_000", "+3", " 5", "5 ", "\u0663", "1" * 20, "-0"):
        with pytest.raises(ApiError):
            parse_last_event_id(bad, None)


def _event(seq: int) -> Event:
    return Codec().decode_event(
        Codec().encode_event(
            Event.model_validate(
                {
                    "sessionId": "s1",
                    "runId": "_session",
                    "seq": seq,
                    "type": "command.rejected",
                    "payload": {"reason": "session_busy", "commandType": "prompt"},
                    "generation": 0,
                    "commandId": f"c{seq}",
                    "ts": 1,
                    "tenantId": "acme",
                }
            )
        )
    )


async def test_a_slow_subscriber_is_closed_not_grown() -> None:
    sub = Subscriber("s1", "acme", 0, asyncio.Queue(10), asyncio.get_running_loop())
    _deliver(sub, [Item(i, _event(i + 1)) for i in range(25)])
    items = [sub.queue.get_nowait() for _ in range(sub.queue.qsize())]
    assert len(items) == 10 and isinstance(items[-1], Overflow)
    assert [i.offset for i in items[:-1] if isinstance(i, Item)] == list(range(9))
    assert sub.closed
    _deliver(sub, [Item(99, _event(99))])
    assert sub.queue.empty(), "nothing more after the overflow"


async def test_single_flight_shares_one_call_per_key_and_its_error() -> None:
    flight: SingleFlight[str, int] = SingleFlight()
    calls: list[str] = []
    gate = asyncio.Event()

    async def fetch(key: str, fail: bool = False) -> int:
        calls.append(key)
        n = len(calls)
        await gate.wait()
        if fail:
            raise RuntimeError(key)
        return n

    waiting = [asyncio.ensure_future(flight.do("a", lambda: fetch("a"))) for _ in range(5)]
    other = asyncio.ensure_future(flight.do("b", lambda: fetch("b")))
    await asyncio.sleep(0)
    gate.set()
    assert await asyncio.gather(*waiting) == [1] * 5
    assert await other == 2
    assert calls == ["a", "b"], "one call per key in flight"

    gate.clear()
    failing = [asyncio.ensure_future(flight.do("a", lambda: fetch("a", True))) for _ in range(3)]
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*failing, return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)
    assert calls == ["a", "b", "a"]
    assert await flight.do("a", lambda: fetch("a")) == 4, "a new call once the last one ended"


async def test_a_failed_tail_ends_every_stream_once() -> None:
    loop = asyncio.get_running_loop()
    live = Subscriber("s1", "acme", 0, asyncio.Queue(10), loop)
    _deliver(live, [Item(0, _event(1))])
    _stop(live)
    assert isinstance(live.queue.get_nowait(), Item)
    assert isinstance(live.queue.get_nowait(), Stopped) and live.closed
    slow = Subscriber("s1", "acme", 0, asyncio.Queue(3), loop)
    _deliver(slow, [Item(i, _event(i + 1)) for i in range(5)])
    _stop(slow)  # its queue already ends with the overflow marker (and is full)
    items = [slow.queue.get_nowait() for _ in range(slow.queue.qsize())]
    assert isinstance(items[-1], Overflow) and not any(isinstance(i, Stopped) for i in items)


# -- the commands thread outlives a failed round ----------------------------------------------
class _RoundClient:
    """Stands in for the bridge's `SessionClient`: the first one's first `collect` fails
    with an error that is not the SDK's; every later round answers each command."""

    made: list[_RoundClient] = []

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.closed = False
        self.rounds = 0
        _RoundClient.made.append(self)

    def prepare(self) -> None:
        pass

    def submit_many(self, commands: list[Command]) -> list[CommandHandle]:
        return [CommandHandle(c) for c in commands]

    def collect(
        self, handles: list[CommandHandle], timeout: float
    ) -> list[tuple[CommandHandle, Outcome | SessionstreamError]]:
        self.rounds += 1
        if self is _RoundClient.made[0]:
            raise RuntimeError("boom")
        return [(h, Outcome("accepted", h.command.command_id, run_id="r")) for h in handles]

    def release(self, handle: CommandHandle) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_a_failed_round_fails_its_requests_and_a_new_client_serves_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sessionstream.apps.gateway import bridge as bridge_mod

    _RoundClient.made = []
    monkeypatch.setattr(bridge_mod, "SessionClient", _RoundClient)
    monkeypatch.setattr(bridge_mod, "RESTART_S", 0.01)
    b = bridge_mod.CommandBridge(Settings(), round_s=0.001)

    async def go() -> tuple[object, object, object]:
        b.start(asyncio.get_running_loop())
        first = await b.execute(build_command("s1", {"type": "abort"}, WHO), 5)
        second = await b.execute(build_command("s1", {"type": "abort"}, WHO), 5)
        b.close()
        third = await b.execute(build_command("s1", {"type": "abort"}, WHO), 5)
        return first, second, third

    first, second, third = asyncio.run(asyncio.wait_for(go(), 10))
    assert isinstance(first, SessionstreamError) and "boom" in str(first)
    assert isinstance(second, Outcome) and second.status == "accepted"
    # closed: refused at once, never left waiting for a round
    assert isinstance(third, SessionstreamError) and "stopped" in str(third)
    assert b.restarts == 1 and len(_RoundClient.made) == 2
    assert all(c.closed for c in _RoundClient.made)


# -- catch-ups: paged, a tenant's reads bounded, threads never held by a client -------------
class _PagedFanout:
    """`read_page` over offsets `[0, n)` of one session, `per_page` events a page; reads of
    tenant `blocked` wait for `release` (a slow broker, or a huge page)."""

    def __init__(self, n: int, per_page: int, blocked: str | None = None) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.n, self.per_page, self.blocked = n, per_page, blocked
        self.event = _event(1)  # one, reused: a Codec is slow to make
        self.release = threading.Event()
        self.running: dict[str, int] = {}
        self.most: dict[str, int] = {}
        self.lock = threading.Lock()
        self.catch_up_threads = ThreadPoolExecutor(8)

    def read_page(
        self, session_id: str, tenant_id: str, start: int, end: int, size: int
    ) -> tuple[list[Item], int]:
        with self.lock:
            self.running[tenant_id] = self.running.get(tenant_id, 0) + 1
            self.most[tenant_id] = max(self.most.get(tenant_id, 0), self.running[tenant_id])
        try:
            if tenant_id == self.blocked:
                self.release.wait(30)
            stop = min(end, start + self.per_page)
            return [Item(i, self.event, 10) for i in range(start, stop)], stop
        finally:
            with self.lock:
                self.running[tenant_id] -= 1


async def test_a_catch_up_is_read_page_by_page_in_order_to_its_end() -> None:
    from sessionstream.apps.gateway.sse import CatchUpSlots, _catch_up

    fanout = _PagedFanout(1000, per_page=64)
    got = [
        x.offset
        async for x in _catch_up(fanout, CatchUpSlots(2), "s1", "acme", 5, 1000, 1 << 20)  # type: ignore[arg-type]
    ]
    assert got == list(range(5, 1000))
    fanout.catch_up_threads.shutdown()


async def test_one_tenants_stalled_reads_leave_the_threads_to_the_others() -> None:
    """Tenant B resumes many streams whose reads do not end (a stalled page): it holds
    at most `per_tenant` threads, and tenant A's catch-up is read at once beside them.
    (Catch-ups used to share 8 threads, each held for as long as its client did not
    read: B's 8 streams delayed A's first resumed event 27.5 s.)"""
    from sessionstream.apps.gateway.sse import CatchUpSlots, _catch_up

    fanout = _PagedFanout(10, per_page=10, blocked="B")
    slots = CatchUpSlots(2)

    async def drain(tenant: str) -> list[int]:
        it = _catch_up(fanout, slots, "s1", tenant, 0, 10, 1 << 20)  # type: ignore[arg-type]
        return [x.offset async for x in it]

    b = [asyncio.create_task(drain("B")) for _ in range(20)]
    await asyncio.sleep(0.2)
    assert await asyncio.wait_for(drain("A"), 2) == list(range(10))
    assert fanout.most["B"] == 2, "B never held more than its two slots"
    fanout.release.set()
    assert all(r == list(range(10)) for r in await asyncio.gather(*b))
    assert slots._sems == {}, "a tenant with no reader left is forgotten"
    fanout.catch_up_threads.shutdown()


async def test_a_slot_comes_back_when_its_read_ends_not_when_its_asker_leaves() -> None:
    """A client that reconnects in a loop would otherwise pile reads onto the threads:
    each leaves, its slot is free, its read still runs."""
    from sessionstream.apps.gateway.sse import CatchUpSlots

    fanout = _PagedFanout(10, per_page=10, blocked="B")
    slots = CatchUpSlots(1)
    asker = asyncio.create_task(slots.read("B", fanout, "s1", 0, 10, 1 << 20))  # type: ignore[arg-type]
    await asyncio.sleep(0.1)
    asker.cancel()
    await asyncio.sleep(0.1)
    second = asyncio.create_task(slots.read("B", fanout, "s1", 0, 10, 1 << 20))  # type: ignore[arg-type]
    await asyncio.sleep(0.2)
    assert fanout.most["B"] == 1 and not second.done(), "waits for the first read to end"
    fanout.release.set()
    items, nxt = await asyncio.wait_for(second, 5)
    assert nxt == 10 and len(items) == 10
    fanout.catch_up_threads.shutdown()


async def test_a_stream_that_falls_behind_by_bytes_is_closed() -> None:
    sub = Subscriber("s1", "acme", 0, asyncio.Queue(1000), asyncio.get_running_loop(), 1000)
    _deliver(sub, [Item(i, _event(1), 300) for i in range(5)])
    items = [sub.queue.get_nowait() for _ in range(sub.queue.qsize())]
    assert [type(x).__name__ for x in items] == ["Item"] * 3 + ["Overflow"]
    # one event larger than the bound still goes to a stream that holds nothing
    big = Subscriber("s1", "acme", 0, asyncio.Queue(1000), asyncio.get_running_loop(), 1000)
    _deliver(big, [Item(0, _event(1), 5000)])
    assert isinstance(big.taken(big.queue.get_nowait()), Item) and big.queued_bytes == 0


async def test_database_calls_do_not_wait_behind_the_default_executor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every thread of asyncio's default executor busy (as slow SSE catch-ups held them):
    a database call still runs at once, on the database's own threads."""
    from sessionstream.apps.gateway.db import Database

    db = Database(Settings())  # never opened: `_call` is stood in for
    monkeypatch.setattr(db, "_call", lambda fn, *args: fn(None, *args))
    release = threading.Event()
    loop = asyncio.get_running_loop()
    busy = [loop.run_in_executor(None, release.wait, 30) for _ in range(64)]
    try:
        assert await asyncio.wait_for(db.run(lambda conn, x: x + 1, 41), 5) == 42
    finally:
        release.set()
        await asyncio.gather(*busy)
        db.close()


@pytest.mark.parametrize(
    "raw",
    [
        "{}".encode("utf-16"),  # UTF-16 JSON: json.loads(bytes) took it
        b"[" * 100_000,  # deeper than Python parses: RecursionError, a 500
        b'{"type": "prompt", "payload": {"timeoutMs": ' + b"9" * 5000 + b"}}",  # int limit
        b"\xff{}",
        b"",
    ],
)
async def test_bodies_that_are_not_utf8_json_are_malformed_json(raw: bytes) -> None:
    from starlette.requests import Request

    from sessionstream.apps.gateway.commands import read_json

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": raw, "more_body": False}

    scope = {
        "type": "http",
        "method": "POST",
        "headers": [(b"content-type", b"application/json")],
    }
    with pytest.raises(ApiError) as e:
        await read_json(Request(scope, receive), 1 << 20)
    assert (e.value.status, e.value.code) == (400, "malformed_json")


async def test_the_key_cache_drops_the_least_recently_used_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A flood of other keys (bad ones are remembered as unknown) used to push out the
    keys in use first: the cache dropped the oldest lookup, however often it was hit."""
    from sessionstream.apps.gateway import auth

    monkeypatch.setattr(auth, "_CACHE_MAX", 3)
    asked: list[str] = []

    class Db:
        async def run(self, fn: object, key: str) -> None:
            asked.append(key)  # every key unknown: what matters is what is asked again

    a = auth.Authenticator(Settings(), Db())  # type: ignore[arg-type]
    keys = [f"ssk_{i:012x}_" + "x" * 43 for i in range(5)]
    for k in keys[:3]:
        await a._lookup(k)
    await a._lookup(keys[0])  # in use: a hit
    await a._lookup(keys[3])  # a new key: the least recently used (keys[1]) goes
    await a._lookup(keys[4])  # and then keys[2]
    assert asked == keys
    await a._lookup(keys[0])  # still cached
    assert asked == keys


def test_opentelemetry_is_on_only_for_the_signals_whose_provider_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fastapi import FastAPI
    from opentelemetry import trace

    from sessionstream.apps.gateway.fastpath import telemetry_config

    monkeypatch.delenv("FASTAPI_OTEL_AUTO_CONFIGURE", raising=False)
    # nothing set up: FastAPI need not ask the environment on every request
    off = {"tracing": False, "metrics": False, "logs": False}
    assert telemetry_config() == {"telemetry": off}
    FastAPI(**telemetry_config())  # a configuration this FastAPI takes

    class TracerProvider:  # stands for an SDK's provider, set before the app is made
        pass

    monkeypatch.setattr(trace, "get_tracer_provider", TracerProvider)
    assert telemetry_config() == {"telemetry": {**off, "tracing": True}}
    # FastAPI told to set providers up itself keeps its own defaults
    monkeypatch.setenv("FASTAPI_OTEL_AUTO_CONFIGURE", "true")
    assert telemetry_config() == {}
