"""The HTTP client of the load (the gateway's and Restate's ingress): JSON POST, JSON back.

`PEERS_HTTP_CLIENT`: `raw` (the default) is a minimal HTTP/1.1 keep-alive client on asyncio
streams: the load runs on the same 2 cores as the systems it drives, and aiohttp's client
spent more CPU a command than this one (measured before the meter counted the driver
alone: both figures then also held the servers the driver starts, decision 0003);
`aiohttp` and `httpx` for comparison (httpx's AsyncClient spent more CPU still).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any
from urllib.parse import urlencode, urlsplit

import aiohttp
import httpx

#: which client: "aiohttp" or "httpx"
CLIENT = os.environ.get("PEERS_HTTP_CLIENT", "raw")


class RawHttp:
    """POST a JSON body over kept-alive HTTP/1.1 connections, one request at a time on
    each; a connection the server closed is replaced. Reads `Content-Length` bodies and
    chunked ones."""

    def __init__(self, base_url: str, limit: int = 256) -> None:
        u = urlsplit(base_url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.authority = f"{self.host}:{self.port}".encode()
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.slots = asyncio.Semaphore(limit)

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        async with self.slots:
            for attempt in (0, 1):
                fresh = attempt == 1 or not self.idle
                conn = await asyncio.open_connection(self.host, self.port) if fresh else None
                r, w = conn or self.idle.pop()
                head = b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items())
                w.write(
                    b"POST "
                    + path.encode()
                    + b" HTTP/1.1\r\nHost: "
                    + self.authority
                    + b"\r\nContent-Type: application/json\r\nContent-Length: "
                    + str(len(body)).encode()
                    + b"\r\n"
                    + head
                    + b"\r\n"
                    + body
                )
                try:
                    status, data, keep = await self._response(r)
                except (asyncio.IncompleteReadError, ConnectionError) as e:
                    w.close()
                    if fresh:  # a new connection that fails is the server's doing
                        raise ConnectionError(f"{self.host}:{self.port}: {e!r}") from e
                    continue  # a kept-alive one the server closed (idle timeout): anew
                if keep:
                    self.idle.append((r, w))
                else:
                    w.close()
                return status, data
        raise AssertionError("unreachable")

    @staticmethod
    async def _response(r: asyncio.StreamReader) -> tuple[int, bytes, bool]:
        lines = (await r.readuntil(b"\r\n\r\n")).split(b"\r\n")
        status = int(lines[0].split()[1])
        fields = {}
        for line in lines[1:]:
            if b":" in line:
                k, v = line.split(b":", 1)
                fields[k.strip().lower()] = v.strip().lower()
        if fields.get(b"transfer-encoding") == b"chunked":
            parts = []
            while size := int((await r.readuntil(b"\r\n")).split(b";")[0], 16):
                parts.append((await r.readexactly(size + 2))[:-2])
            await r.readuntil(b"\r\n")
            data = b"".join(parts)
        else:
            data = await r.readexactly(int(fields.get(b"content-length", b"0")))
        return status, data, fields.get(b"connection") != b"close"

    async def close(self) -> None:
        for _, w in self.idle:
            w.close()
        self.idle.clear()


class JsonPoster:
    def __init__(self, base_url: str, headers: dict[str, str] | None = None) -> None:
        self.base, self.headers = base_url, headers or {}
        self._aio: aiohttp.ClientSession | None = None
        self._httpx: httpx.AsyncClient | None = None
        self._raw: RawHttp | None = None

    async def post(
        self,
        path: str,
        body: Any,
        headers: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
    ) -> tuple[int, Any, str]:
        """(HTTP status, the JSON body or None, the text when it is not JSON)."""
        h = {**self.headers, **(headers or {})}
        if CLIENT == "raw":
            if self._raw is None:
                self._raw = RawHttp(self.base)
            query = f"?{urlencode(params)}" if params else ""
            code, data = await self._raw.post(path + query, json.dumps(body).encode(), h)
            try:
                return code, json.loads(data), ""
            except ValueError:
                return code, None, data.decode(errors="replace")
        if CLIENT == "httpx":
            if self._httpx is None:
                self._httpx = httpx.AsyncClient(
                    base_url=self.base,
                    timeout=30,
                    limits=httpx.Limits(max_connections=256, max_keepalive_connections=256),
                )
            r = await self._httpx.post(path, json=body, headers=h, params=params)
            try:
                return r.status_code, r.json(), ""
            except ValueError:
                return r.status_code, None, r.text
        if self._aio is None:
            self._aio = aiohttp.ClientSession(
                self.base,
                timeout=aiohttp.ClientTimeout(total=30),
                connector=aiohttp.TCPConnector(limit=256),
            )
        async with self._aio.post(path, json=body, headers=h, params=params) as resp:
            text = await resp.text()
            try:
                return resp.status, await resp.json(content_type=None), ""
            except ValueError:
                return resp.status, None, text

    async def close(self) -> None:
        if self._raw is not None:
            await self._raw.close()
        if self._aio is not None:
            await self._aio.close()
        if self._httpx is not None:
            await self._httpx.aclose()
