"""The HTTP client of the load (the gateway's and Restate's ingress): JSON POST, JSON back.

`aiohttp` by default; `httpx` (`--http httpx`) for comparison: at 64 requests in flight
httpx's AsyncClient spent more CPU than the servers it drove on this 2-core machine.
"""

from __future__ import annotations

import os
from typing import Any

import aiohttp
import httpx

#: which client: "aiohttp" or "httpx"
CLIENT = os.environ.get("PEERS_HTTP_CLIENT", "aiohttp")


class JsonPoster:
    def __init__(self, base_url: str, headers: dict[str, str] | None = None) -> None:
        self.base, self.headers = base_url, headers or {}
        self._aio: aiohttp.ClientSession | None = None
        self._httpx: httpx.AsyncClient | None = None

    async def post(
        self,
        path: str,
        body: Any,
        headers: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
    ) -> tuple[int, Any, str]:
        """(HTTP status, the JSON body or None, the text when it is not JSON)."""
        h = {**self.headers, **(headers or {})}
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
        if self._aio is not None:
            await self._aio.close()
        if self._httpx is not None:
            await self._httpx.aclose()
