"""Restate as a peer: `restate-server` (default config: its log and state on disk, fsynced)
in a temp base dir, bound to 127.0.0.1 (ingress :8080, admin :9070, fabric :5122), and the
Python service (`_restate_service`, hypercorn, one process) registered as a deployment.
The load calls `POST :8080/Session/{session}/{prompt|abort}` and gets the handler's answer.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from bench.peers import _install
from bench.peers._http import JsonPoster
from bench.peers._load import Result

REPO = Path(__file__).resolve().parents[2]
INGRESS, ADMIN, SERVICE_PORT = 8080, 9070, 9080


def _wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} not up in {timeout}s; log {log}") from None
            time.sleep(0.2)


class RestateSystem:
    name = "restate"

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="peers-restate-"))
        self.server: subprocess.Popen[bytes] | None = None
        self.service: subprocess.Popen[bytes] | None = None
        self.http: JsonPoster | None = None

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        # no telemetry: the server would otherwise try to reach out (version checks)
        env = dict(os.environ, RESTATE_DISABLE_TELEMETRY="true")
        with (self.dir / f"{name}.log").open("wb") as out:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)

    async def start(self) -> None:
        exe = _install.restate_server()
        self.service = self._spawn(
            "service", [sys.executable, "-m", "bench.peers._restate_service", str(SERVICE_PORT)]
        )
        self.server = self._spawn(
            "server",
            [
                str(exe),
                "--no-logo",
                "--base-dir",
                str(self.dir / "data"),
                "--bind-ip",
                "127.0.0.1",
                "--listen-mode",
                "tcp",
            ],
        )
        _wait_http(f"http://127.0.0.1:{ADMIN}/health", 60, self.server, self.dir / "server.log")
        _wait_http(
            f"http://127.0.0.1:{SERVICE_PORT}/discover", 30, self.service, self.dir / "service.log"
        )
        r = httpx.post(
            f"http://127.0.0.1:{ADMIN}/deployments",
            json={"uri": f"http://127.0.0.1:{SERVICE_PORT}"},
            timeout=30,
        )
        if r.status_code >= 300:
            # hypercorn serves HTTP/2 over TLS or h2c upgrade; plain HTTP/1.1 is the fallback
            r = httpx.post(
                f"http://127.0.0.1:{ADMIN}/deployments",
                timeout=30,
                json={"uri": f"http://127.0.0.1:{SERVICE_PORT}", "use_http_11": True},
            )
        r.raise_for_status()
        self.http = JsonPoster(f"http://127.0.0.1:{INGRESS}")
        # the ingress may answer before the deployment is known everywhere
        for _ in range(100):
            try:
                code, _, _ = await self.http.post("/Session/warmup/prompt", {})
                if code == 200:
                    await self.http.post("/Session/warmup/abort", {})
                    break
            except (OSError, aiohttp.ClientError, httpx.HTTPError):
                pass
            await asyncio.sleep(0.2)

    def processes(self) -> dict[str, int]:
        assert self.server is not None and self.service is not None
        return {"restate-server": self.server.pid, "restate python service": self.service.pid}

    async def send(self, session: str, kind: str, run_id: str | None, cid: str) -> Result:
        assert self.http is not None
        body = {"runId": run_id} if kind == "abort" else {"text": "x", "policy": "reject"}
        code, j, text = await self.http.post(
            f"/Session/{session}/{kind}", body, headers={"idempotency-key": cid}
        )
        if code != 200 or j is None:
            return Result("other", f"HTTP {code}: {text[:100]}")
        return Result(
            j["status"], j.get("reason"), j.get("runId"), j.get("terminalStatus") == "cancelled"
        )

    def check(self) -> dict[str, Any]:
        return {
            "ok": True,
            "note": "one state value per object: a second run cannot exist; "
            "checked from the outcomes",
        }

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.close()
        for p in (self.server, self.service):
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
