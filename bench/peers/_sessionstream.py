"""sessionstream as a peer: through the Python SDK, and through the HTTP gateway.

Both run a real `sessionstream processor` subprocess on topics of their own (4 partitions);
the HTTP system adds `sessionstream gateway` (and a PostgreSQL schema for its API key).
No sink and no worker: the outcome path is command -> processor -> outcomes/events, and
with no worker holding the run an abort cancels it at once (`run.finished {cancelled}` in
the abort's own outcome).

The SDK gets its concurrency the way the gateway uses it: one `SessionClient` owned by one
thread that sends what the load hands it (`submit_many`) and polls `collect()` for the
outcomes of everything in flight, resolving each caller's future on the event loop. One
producer and one outcomes tail however many cycles are in flight.
"""

from __future__ import annotations

import asyncio
import queue
import shutil
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from bench._harness import Processor, broker_pid
from bench.peers._http import JsonPoster
from bench.peers._load import Result
from sessionstream.adapters.kafka import read_topic
from sessionstream.adapters.postgres.migrate import migrate
from sessionstream.adapters.registry import reader_codec
from sessionstream.apps._model_server import free_port
from sessionstream.apps._procs import Service
from sessionstream.apps.gateway.keys import create_key
from sessionstream.client import CommandHandle, Outcome, SessionClient
from sessionstream.core.log_check import check_log
from sessionstream.errors import SessionstreamError
from sessionstream.schemas.commands import AbortPayload, Command, PromptPayload
from sessionstream.settings import Settings
from stack.worlds import delete_world
from tests.integration.worlds import isolated_settings

PARTITIONS = 4
TEXT = "Find the three cheapest direct flights from Berlin to Lisbon next weekend."


def _cancelled(types_and_payloads: Sequence[tuple[str, Any]]) -> bool:
    return any(t == "run.finished" and s == "cancelled" for t, s in types_and_payloads)


def _result(o: Outcome) -> Result:
    ends = [(e.type, getattr(e.payload, "terminal_status", None)) for e in o.events]
    return Result(o.status, o.reason, o.run_id, _cancelled(ends))


class _Bridge(threading.Thread):
    """The one thread that drives the `SessionClient`: submit_many + collect."""

    def __init__(self, client: SessionClient, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(daemon=True, name="sdk-bridge")
        self.client, self.loop = client, loop
        self.inbox: queue.SimpleQueue[tuple[Command, asyncio.Future[Any]]] = queue.SimpleQueue()
        self.halt = threading.Event()

    def run(self) -> None:
        waiting: dict[int, tuple[CommandHandle, asyncio.Future[Any]]] = {}
        while not self.halt.is_set():
            batch = []
            try:
                batch.append(self.inbox.get(timeout=0.0005 if waiting else 0.05))
                while True:
                    batch.append(self.inbox.get_nowait())
            except queue.Empty:
                pass
            if batch:
                handles = self.client.submit_many([c for c, _ in batch])
                for h, (_, fut) in zip(handles, batch, strict=True):
                    waiting[id(h)] = (h, fut)
            if not waiting:
                continue
            for h, got in self.client.collect([h for h, _ in waiting.values()], timeout=0.0005):
                _, fut = waiting.pop(id(h))
                self.loop.call_soon_threadsafe(_settle, fut, got)


def _settle(fut: asyncio.Future[Any], got: Outcome | SessionstreamError) -> None:
    if fut.done():
        return
    if isinstance(got, BaseException):
        fut.set_exception(got)
    else:
        fut.set_result(got)


class _World:
    """Isolated topics (+ schema), a processor, and what is checked at the end."""

    def __init__(self, tag: str, schema: bool) -> None:
        self.s = isolated_settings(
            Settings(), tag, prefix="bench", partitions=PARTITIONS, schema=schema
        )
        self.schema = schema
        self.keep_logs = False
        self.processor = Processor(self.s, f"peers-{tag}")
        self.broker = broker_pid()

    def start(self) -> None:
        self.processor.start()
        self.processor.wait_for("assigned", 90)

    def processes(self) -> dict[str, int]:
        out = {"processor": self.processor.pid}
        if self.broker:
            out["kafka broker"] = self.broker
        return out

    def check(self) -> dict[str, Any]:
        """The protocol checker over the whole events log of the run."""
        events = read_topic(self.s, self.s.events_topic, timeout=180)
        report = check_log(events, reader_codec(self.s))
        return {
            "ok": report.ok,
            "events": report.events,
            "runs": report.runs,
            "violations": report.violations[:10],
        }

    def stop(self) -> None:
        self.processor.stop()
        if not self.keep_logs:
            self.processor.log.unlink(missing_ok=True)
        else:
            print(f"peers: processor log kept: {self.processor.log}", flush=True)
        delete_world([self.s], schemas=self.schema)


class SdkSystem:
    name = "sessionstream-sdk"

    def __init__(self) -> None:
        self.world = _World("peers-sdk", schema=False)
        self.client: SessionClient | None = None
        self.bridge: _Bridge | None = None

    async def start(self) -> None:
        self.world.start()
        self.client = SessionClient("bench", self.world.s, actor="bench")
        self.client.prepare()
        self.bridge = _Bridge(self.client, asyncio.get_running_loop())
        self.bridge.start()

    def processes(self) -> dict[str, int]:
        return self.world.processes()

    async def send(self, session: str, kind: str, run_id: str | None, cid: str) -> Result:
        assert self.client is not None and self.bridge is not None
        payload: Any = (
            PromptPayload(text=TEXT, policy="reject")
            if kind == "prompt"
            else AbortPayload(reason="user")
        )
        cmd = self.client.command(session, kind, payload, command_id=cid, run_id=run_id)
        fut: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self.bridge.inbox.put((cmd, fut))
        return _result(await fut)

    def check(self) -> dict[str, Any]:
        return self.world.check()

    async def stop(self) -> None:
        if self.bridge is not None:
            self.bridge.halt.set()
            self.bridge.join(10)
        if self.client is not None:
            self.client.close()
        self.world.keep_logs = getattr(self, "keep_logs", False)
        self.world.stop()


class HttpSystem:
    name = "sessionstream-http"

    def __init__(self) -> None:
        self.world = _World("peers-http", schema=True)
        s = self.world.s.model_copy(
            update={
                "gateway_port": free_port(),
                "gateway_rate_per_s": 1e6,
                "gateway_rate_burst": 1_000_000,
                # every request comes from this one address
                "gateway_max_connections_per_address": 1024,
            }
        )
        self.world.s = s
        logs = Path(tempfile.mkdtemp(prefix="peers-gw-"))
        self.gateway = Service("gateway", s, ["gateway"], logs)
        self.gateway.cwd = self.world.processor.cwd
        self.http: JsonPoster | None = None

    async def start(self) -> None:
        s = self.world.s
        migrate(s.database_conninfo, schema=s.database_schema)
        with psycopg.connect(
            s.database_conninfo, options=f"-c search_path={s.database_schema}"
        ) as conn:
            key, _ = create_key(conn, "bench", "bench")
        self.world.processor.settings = s
        self.world.start()
        self.gateway.start()
        self.gateway.wait_for("Uvicorn running on", 60)
        self.http = JsonPoster(
            f"http://127.0.0.1:{s.gateway_port}", {"Authorization": f"Bearer {key}"}
        )

    def processes(self) -> dict[str, int]:
        return {**self.world.processes(), "gateway": self.gateway.pid}

    async def send(self, session: str, kind: str, run_id: str | None, cid: str) -> Result:
        assert self.http is not None
        body: dict[str, Any] = {"type": kind, "commandId": cid}
        if kind == "prompt":
            body["payload"] = {"text": TEXT, "policy": "reject"}
        else:
            body["payload"], body["runId"] = {"reason": "user"}, run_id
        code, j, text = await self.http.post(
            f"/v1/sessions/{session}/commands", body, params={"wait": 10}
        )
        if code not in (200, 409) or j is None:
            return Result("other", f"HTTP {code}: {(text or str(j))[:100]}")
        ends = [(e["type"], e["payload"].get("terminalStatus")) for e in j.get("events", [])]
        return Result(j["status"], j.get("reason"), j.get("runId"), _cancelled(ends))

    def check(self) -> dict[str, Any]:
        return self.world.check()

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.close()
        self.gateway.stop()
        self.world.keep_logs = getattr(self, "keep_logs", False)
        if not self.world.keep_logs:
            shutil.rmtree(self.gateway.log.parent, ignore_errors=True)
        else:
            print(f"peers: gateway log kept: {self.gateway.log}", flush=True)
        self.world.stop()
