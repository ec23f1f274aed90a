"""The real model and tool adapters: their abort reaches the far side, measured.

* `OpenAIChatModel` against the local streaming server (`sessionstream.apps._model_server`, on
  a thread of its own, loopback): a whole reply; an abort mid-stream closes the connection
  (the server records when it saw the client go) within 100 ms; provider errors are
  `ModelError`s.
* `sql_tool.run_query` against the real PostgreSQL: rows; an abort cancels a running
  `pg_sleep(30)` in the server, gone from `pg_stat_activity` within 200 ms.
* A worker running the reference agent with both, cancelled mid-stream and mid-query.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from sessionstream.adapters.registry import reader_codec
from sessionstream.apps._model_server import ModelServer, Served, free_port, reply_text
from sessionstream.client import SessionClient
from sessionstream.errors import (
    DatabaseUnavailable,
    ModelError,
    ModelUnavailable,
    QueryFailed,
)
from sessionstream.runtimes.worker import AbortSignal, RunCancelled
from sessionstream.runtimes.worker.openai_model import OpenAIChatModel
from sessionstream.runtimes.worker.sql_tool import run_query
from sessionstream.schemas.commands import AbortPayload
from sessionstream.schemas.events import Event, RunFinished
from sessionstream.settings import Settings, get_settings
from tests.integration.conftest import WorldFactory
from tests.integration.helpers import await_until, wait_until
from tests.integration.procs import Proc, processor

pytestmark = pytest.mark.integration

ROUNDS = 5
KEY = "sk-test-do-not-log-0123456789"


class ThreadedServer:
    """A ModelServer on its own thread and loop, like a provider elsewhere."""

    def __init__(self, *, token_ms: float = 25.0, api_key: str | None = None) -> None:
        self.server = ModelServer(token_ms=token_ms, api_key=api_key)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> ModelServer:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        return self.server

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ThreadedServer(token_ms=20) as s:
        yield s


@pytest.fixture
async def model(server: ModelServer) -> AsyncIterator[OpenAIChatModel]:
    m = OpenAIChatModel(server.url, "test-model", timeout_s=5)
    yield m
    await m.aclose()


def _last(server: ModelServer, prompt: str) -> Served | None:
    return next((r for r in reversed(server.served) if r.prompt == prompt), None)


async def _finished(server: ModelServer, prompt: str, timeout: float = 5.0) -> Served | None:
    """The server's record of `prompt` once its handler has recorded how it ended (the
    client can read the last chunk before the handler gets to record it)."""
    deadline = time.monotonic() + timeout
    while True:
        served = _last(server, prompt)
        done = served is not None and (served.completed or served.disconnected)
        if done or time.monotonic() > deadline:
            return served
        await asyncio.sleep(0.01)


def _ms(values: list[float]) -> str:
    each = ", ".join(f"{v:.1f}" for v in values)
    return f"p50 {statistics.median(values):.1f} ms, max {max(values):.1f} ms [{each}]"


# -- the model adapter ----------


async def test_a_streamed_completion_is_the_whole_reply(
    server: ModelServer, model: OpenAIChatModel
) -> None:
    prompt = "plan a trip model_ms=200"
    t0 = time.time()
    assert await model.complete(prompt, signal=AbortSignal()) == reply_text(prompt)
    served = await _finished(server, prompt)
    assert served is not None and served.completed is not None and served.disconnected is None
    assert served.chunks_sent == len(reply_text(prompt).split())
    assert served.completed - t0 >= 0.2, "the reply was streamed, not sent at once"
    # the connection went back to the pool: a second request reuses it (no disconnect)
    assert await model.complete("again", signal=AbortSignal()) == reply_text("again")
    assert all(r.disconnected is None for r in server.served)


async def test_a_streamed_completion_hands_out_each_piece_as_it_arrives(
    server: ModelServer, model: OpenAIChatModel
) -> None:
    """`on_delta` (token deltas): each chunk's text, in order, as the server sends it —
    not the whole reply at the end."""
    prompt = "stream it word by word model_ms=300"
    pieces: list[tuple[float, str]] = []
    t0 = time.monotonic()
    reply = await model.complete(
        prompt, signal=AbortSignal(), on_delta=lambda text: pieces.append((time.monotonic(), text))
    )
    assert reply == reply_text(prompt) == "".join(text for _, text in pieces)
    assert len(pieces) == len(reply_text(prompt).split())
    # spread over the stream: the first piece came well before the last
    assert pieces[-1][0] - pieces[0][0] >= 0.15 and pieces[0][0] - t0 < pieces[-1][0] - t0


async def test_an_abort_mid_stream_closes_the_connection_within_100ms(
    server: ModelServer, model: OpenAIChatModel
) -> None:
    measured = []
    for i in range(ROUNDS):
        prompt = f"a long answer {i} model_ms=3000"  # a word every ~300 ms
        signal = AbortSignal()
        call = asyncio.ensure_future(model.complete(prompt, signal=signal))

        async def streaming(p: str = prompt) -> bool:
            served = _last(server, p)
            return served is not None and served.chunks_sent >= 1

        await await_until(streaming, timeout=10, interval=0.01, what="the stream under way")
        signal.abort("user pressed stop")
        assert signal.aborted_at is not None
        with pytest.raises(RunCancelled, match="user pressed stop"):
            await call
        served = _last(server, prompt)
        assert served is not None

        async def gone(s: Served = served) -> bool:
            return s.disconnected is not None

        await await_until(gone, timeout=5, interval=0.005, what="the server to see the client go")
        assert served.disconnected is not None and served.completed is None
        measured.append(1000 * (served.disconnected - signal.aborted_at))
    print(f"\nabort -> server saw the disconnect: {_ms(measured)} ({ROUNDS} rounds)")
    assert max(measured) <= 100, measured


async def test_provider_errors_are_model_errors(server: ModelServer) -> None:
    with ThreadedServer(api_key=KEY) as locked:
        wrong = OpenAIChatModel(locked.url, "m", api_key="sk-wrong-key")
        with pytest.raises(ModelError) as err:
            await wrong.complete("hello", signal=AbortSignal())
        await wrong.aclose()
        assert err.value.status == 401 and not err.value.retryable
        assert "Incorrect API key provided" in str(err.value)
        assert "sk-wrong-key" not in str(err.value)

        right = OpenAIChatModel(locked.url, "m", api_key=KEY)
        assert await right.complete("hello", signal=AbortSignal()) == reply_text("hello")
        assert KEY not in repr(right)
        await right.aclose()

    m = OpenAIChatModel(server.url, "m", timeout_s=0.5, retries=0)  # each error as it is
    with pytest.raises(ModelError) as err:
        await m.complete("model_fail=503", signal=AbortSignal())
    assert err.value.status == 503 and err.value.retryable
    with pytest.raises(ModelError, match="invalid JSON") as err:
        await m.complete("model_fail=bad_json", signal=AbortSignal())
    assert type(err.value) is ModelError and not err.value.retryable
    with pytest.raises(ModelUnavailable, match=r"silent for more than 0\.5s") as silent:
        await m.complete("model_fail=stall", signal=AbortSignal())
    assert silent.value.retryable
    await m.aclose()

    nobody = OpenAIChatModel(f"http://127.0.0.1:{free_port()}/v1", "m", retries=0)
    with pytest.raises(ModelUnavailable, match="unreachable"):
        await nobody.complete("hello", signal=AbortSignal())
    await nobody.aclose()


# -- the SQL tool ----------


async def test_the_sql_tool_returns_rows(database_url: str) -> None:
    rows = await run_query(
        database_url, "select %s::int + 1, %s::text", (41, "x"), signal=AbortSignal()
    )
    assert rows == [(42, "x")]
    assert await run_query(database_url, "set local work_mem = '8MB'", signal=AbortSignal()) == []
    with pytest.raises(QueryFailed) as err:
        await run_query(database_url, "select no_such_column", signal=AbortSignal())
    assert err.value.sqlstate == "42703"
    bad = make_conninfo(database_url, port=str(free_port()))
    with pytest.raises(DatabaseUnavailable):
        await run_query(bad, "select 1", signal=AbortSignal(), connect_timeout_s=2)


async def _active(watch: psycopg.AsyncConnection[tuple[object, ...]], app: str) -> bool:
    cur = await watch.execute(
        "select 1 from pg_stat_activity where application_name = %s and state = 'active'"
        " and pid <> pg_backend_pid()",
        (app,),
    )
    return bool(await cur.fetchall())


async def test_an_abort_cancels_the_query_in_the_server_within_200ms(database_url: str) -> None:
    measured = []
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as watch:
        for i in range(ROUNDS):
            app = f"it-sql-{uuid.uuid4().hex[:8]}"
            signal = AbortSignal()
            if i % 2:  # odd rounds: the caller's own connection, which stays usable
                own = await psycopg.AsyncConnection.connect(
                    database_url, autocommit=True, application_name=app
                )
                query = run_query(own, "select pg_sleep(30)", signal=signal)
            else:
                own = None
                query = run_query(
                    database_url, "select pg_sleep(30)", signal=signal, application_name=app
                )
            task = asyncio.ensure_future(query)

            async def running(a: str = app) -> bool:
                return await _active(watch, a)

            await await_until(running, timeout=10, interval=0.005, what="pg_sleep(30) running")
            signal.abort("user pressed stop")
            t0 = time.perf_counter()
            while await _active(watch, app):
                assert time.perf_counter() - t0 < 5, "the query kept running in the server"
            measured.append(1000 * (time.perf_counter() - t0))
            with pytest.raises(RunCancelled, match="user pressed stop"):
                await task
            if own is not None:
                assert await (await own.execute("select 1")).fetchone() == (1,)
                await own.close()
    print(f"\nabort -> pg_sleep(30) gone from pg_stat_activity: {_ms(measured)} ({ROUNDS} rounds)")
    assert max(measured) <= 200, measured


# -- a worker with both ----------


@pytest.fixture
def iso(request: pytest.FixtureRequest, worlds: WorldFactory) -> Settings:
    return worlds("ad-" + request.node.name[5:20].replace("_", "-"), migrated=True)


def _events(s: Settings, run_id: str) -> list[Event]:
    from sessionstream.adapters.kafka import read_topic

    codec = reader_codec(get_settings())
    out = [codec.decode_event(r.value or b"") for r in read_topic(s, s.events_topic)]
    return [e for e in out if e.run_id == run_id]


def _wait(s: Settings, run_id: str, pred: str, procs: list[Proc], timeout: float = 60) -> Event:
    def found() -> Event | None:
        for p in procs:
            p.assert_alive()
        return next((e for e in _events(s, run_id) if pred in _describe(e)), None)

    return wait_until(found, timeout=timeout, interval=0.1, what=f"{pred} of run {run_id}")


def _describe(e: Event) -> str:
    return f"{e.type} {e.payload.model_dump().get('name') or ''}"


def _worker(iso: Settings, procs: list[Proc], model_url: str) -> None:
    p = processor(iso)
    procs.append(p)
    # the first test of a fresh stack to use transactions: its coordinator is created and
    # loaded now, so a slow start shows here, apart from the outcome's own wait
    p.wait_log("assigned [", timeout=120)
    ws = iso.model_copy(update={"model_base_url": model_url, "model_name": "echo"})
    w = Proc(ws, "worker", "--worker-id", "w-adapters").start()
    procs.append(w)
    w.wait_log("ready:", timeout=60)
    w.wait_log(f"model: echo at {model_url}", timeout=5)


def _prompt(c: SessionClient, sid: str, text: str) -> str:
    out = c.wait(c.prompt(sid, text), timeout=60)
    assert out.status == "accepted" and out.run_id, out
    return out.run_id


def _abort(c: SessionClient, sid: str) -> float:
    """Send an abort for the session's run (untracked, like bench_worker); its ts (epoch s)."""
    abort = c.command(sid, "abort", AbortPayload(reason="user pressed stop"))
    c.submit(abort, track=False)
    c.flush()
    return abort.ts / 1000


def _ack(s: Settings, run_id: str, procs: list[Proc]) -> dict[str, object]:
    fin = _wait(s, run_id, "run.finished", procs, timeout=30)
    assert fin.payload_as(RunFinished).terminal_status == "cancelled"
    ack = next(e for e in _events(s, run_id) if e.type == "run.cancel_acknowledged")
    return dict(ack.payload.model_dump())


def test_a_worker_streams_from_the_model_api_and_a_cancel_closes_the_stream(
    iso: Settings, procs: list[Proc], server: ModelServer
) -> None:
    _worker(iso, procs, server.url)
    sid = f"ad-model-{uuid.uuid4().hex[:6]}"
    with SessionClient("tenant-ad", iso) as c:
        done = _prompt(c, sid, "steps=1 tool_ms=0 model_ms=300 email=no")
        fin = _wait(iso, done, "run.finished", procs)
        last_prompt = "step 0: steps=1 tool_ms=0 model_ms=300 email=no"
        assert fin.payload_as(RunFinished).result == f"done: {reply_text(last_prompt)}"
        served = _last(server, last_prompt)
        assert served is not None and served.completed is not None

        run_id = _prompt(c, sid, "steps=1 model_ms=20000 email=end")
        stream_prompt = "step 0: steps=1 model_ms=20000 email=end"

        def streaming() -> Served | None:
            s = _last(server, stream_prompt)
            return s if s is not None and s.chunks_sent >= 1 else None

        served = wait_until(streaming, timeout=30, interval=0.02, what="the stream under way")
        sent = _abort(c, sid)
        wait_until(
            lambda: served.disconnected, timeout=5, interval=0.005, what="the worker to hang up"
        )
    assert served.disconnected is not None and served.completed is None
    took = 1000 * (served.disconnected - sent)
    print(f"\nabort sent -> model server saw the worker hang up: {took:.0f} ms")
    # abort -> processor -> worker -> stream closed, across Kafka: far inside the grace period
    assert took < 2000
    ack = _ack(iso, run_id, procs)
    assert ack["model_request_aborted"] is True


def test_a_worker_cancelled_mid_query_stops_the_query_in_the_server(
    iso: Settings, procs: list[Proc], server: ModelServer, database_url: str
) -> None:
    _worker(iso, procs, server.url)
    sid = f"ad-sql-{uuid.uuid4().hex[:6]}"
    with (
        SessionClient("tenant-ad", iso) as c,
        psycopg.connect(database_url, autocommit=True) as watch,
    ):
        run_id = _prompt(c, sid, "steps=1 tool_ms=0 model_ms=0 sql_ms=30000 email=end")
        app = f"sql tool {run_id}"

        def active() -> bool:
            rows = watch.execute(
                "select 1 from pg_stat_activity where application_name = %s and state = 'active'",
                (app,),
            ).fetchall()
            return bool(rows)

        _wait(iso, run_id, "tool.started sql", procs)
        wait_until(active, timeout=10, interval=0.02, what="the reference agent's query running")
        sent = _abort(c, sid)
        wait_until(lambda: not active(), timeout=5, interval=0.005, what="the query to stop")
        took = 1000 * (time.time() - sent)
    print(f"\nabort sent -> the agent's query gone from pg_stat_activity: {took:.0f} ms")
    assert took < 2000
    ack = _ack(iso, run_id, procs)
    assert ack["tools_aborted"] == ["sql:sql-outbox"]
    finished = next(e for e in _events(iso, run_id) if _describe(e) == "tool.finished sql")
    assert str(finished.payload.model_dump().get("detail")).startswith("aborted")
    types = [e.type for e in _events(iso, run_id)]
    assert "action.request" not in types, "a cancelled run asked to send its email"
