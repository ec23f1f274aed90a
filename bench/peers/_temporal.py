"""Temporal as a peer: the CLI's dev server (`temporal server start-dev --headless`, bound
to 127.0.0.1; SQLite in memory: nothing is fsynced, a restart loses everything) and one
worker process (`_temporal_worker`). One workflow per session, started before the load;
each command is `execute_update` (it waits for the update's result).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.peers import _install
from bench.peers._load import Result

REPO = Path(__file__).resolve().parents[2]
PORT = 7233
TASK_QUEUE = "sessions"


class TemporalSystem:
    name = "temporal"

    def __init__(self, sessions: list[str]) -> None:
        self.sessions = sessions
        self.dir = Path(tempfile.mkdtemp(prefix="peers-temporal-"))
        self.server: subprocess.Popen[bytes] | None = None
        self.worker: subprocess.Popen[bytes] | None = None
        self.client: Any = None

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        with (self.dir / f"{name}.log").open("wb") as out:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)

    async def start(self) -> None:
        from temporalio.client import Client

        exe = _install.temporal_cli()
        self.server = self._spawn(
            "server",
            [
                str(exe),
                "server",
                "start-dev",
                "--ip",
                "127.0.0.1",
                "--port",
                str(PORT),
                "--headless",
                "--log-level",
                "warn",
            ],
        )
        deadline = time.monotonic() + 90
        while True:
            if self.server.poll() is not None:
                raise RuntimeError((self.dir / "server.log").read_text()[-2000:])
            try:
                self.client = await Client.connect(f"127.0.0.1:{PORT}")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        self.worker = self._spawn(
            "worker",
            [
                sys.executable,
                "-m",
                "bench.peers._temporal_worker",
                f"127.0.0.1:{PORT}",
                TASK_QUEUE,
            ],
        )
        sem = asyncio.Semaphore(64)

        async def begin(sid: str) -> None:
            async with sem:
                await self.client.start_workflow("Session", id=sid, task_queue=TASK_QUEUE)

        await asyncio.gather(*(begin(s) for s in [*self.sessions, "warmup"]))
        h = self.client.get_workflow_handle("warmup")
        await h.execute_update("prompt", {})
        await h.execute_update("abort", {})

    def processes(self) -> dict[str, int]:
        assert self.server is not None and self.worker is not None
        return {"temporal dev server": self.server.pid, "temporal python worker": self.worker.pid}

    async def send(self, session: str, kind: str, run_id: str | None, cid: str) -> Result:
        h = self.client.get_workflow_handle(session)
        body = {"runId": run_id} if kind == "abort" else {"text": "x", "policy": "reject"}
        j = await h.execute_update(kind, body, id=cid)
        return Result(
            j["status"], j.get("reason"), j.get("runId"), j.get("terminalStatus") == "cancelled"
        )

    def check(self) -> dict[str, Any]:
        return {
            "ok": True,
            "note": "one state value per workflow: a second run cannot exist; "
            "checked from the outcomes",
        }

    async def stop(self) -> None:
        for p in (self.worker, self.server):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
        if getattr(self, "keep_logs", False):
            print(f"peers: logs kept in {self.dir}", flush=True)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)
