"""One delivery attempt over HTTP: a signed POST through the SSRF guard, judged as the
Standard Webhooks specification says (2xx delivered; 3xx, 4xx, 5xx, a timeout or a broken
connection failed; 410 Gone final).

httpcore (httpx's own transport) is used directly: its network backend is where the
guard resolves and checks every address it connects to. Redirects are not followed, no
proxy from the environment is used (the guard would check the proxy's address, not the
receiver's), and an answer's body is read only up to a few KiB (a receiver cannot make
the deliverer hold a large one). The whole attempt — connect, send, the answer's head and
that much of its body — has `timeout_s`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final

import httpcore

from sessionstream import __version__
from sessionstream.adapters._http import retry_after_s
from sessionstream.runtimes.webhooks.dispatch import Job, Outcome, Target
from sessionstream.runtimes.webhooks.guard import (
    AddressPolicy,
    GuardedBackend,
    Resolver,
    UrlRefused,
)
from sessionstream.runtimes.webhooks.signing import delivery_headers

__all__ = ["Sender", "retry_after_s"]

USER_AGENT: Final = f"sessionstream-webhooks/{__version__}"
#: bytes of an answer's body read (kept for a dead letter's error, the rest dropped)
_BODY_READ: Final = 16 * 1024
_ERROR_CHARS: Final = 300

_NETWORK_ERRORS = (
    httpcore.NetworkError,
    httpcore.TimeoutException,
    httpcore.ProtocolError,
    httpcore.UnsupportedProtocol,
    OSError,
)


class Sender:
    """Makes attempts; one connection pool for every endpoint (kept-alive connections are
    reused, each made through the guard)."""

    def __init__(
        self,
        policy: AddressPolicy,
        timeout_s: float,
        *,
        resolver: Resolver | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpcore.default_ssl_context(),
            # the dispatcher bounds requests per endpoint; the pool must not bound them
            # all together (its default is 10 connections for every host at once)
            max_connections=None,
            max_keepalive_connections=1000,
            keepalive_expiry=30.0,
            retries=0,
            network_backend=GuardedBackend(policy, resolver),
        )

    async def aclose(self) -> None:
        await self._pool.aclose()

    async def __call__(self, target: Target, job: Job) -> Outcome:
        now = self._clock()
        signed = delivery_headers(target.secret, job.event_id, int(now), job.body)
        headers = [
            ("content-type", "application/json"),
            ("user-agent", USER_AGENT),
            *signed.items(),
        ]
        t = self.timeout_s
        try:
            async with asyncio.timeout(t):
                async with self._pool.stream(
                    "POST",
                    target.url,
                    headers=headers,
                    content=job.body,
                    extensions={"timeout": {"connect": t, "read": t, "write": t, "pool": t}},
                ) as response:
                    status = response.status
                    retry_after = None
                    for name, value in response.headers:
                        if name.lower() == b"retry-after":
                            retry_after = retry_after_s(value.decode("latin-1"), self._clock())
                    body = b""
                    async for chunk in response.aiter_stream():
                        body += chunk
                        if len(body) >= _BODY_READ:
                            break  # the connection is closed instead of drained
        except UrlRefused as e:
            return Outcome(False, error=f"refused: {e.reason}", final=e.final)
        except TimeoutError:
            return Outcome(False, error=f"no answer within {t:g}s")
        except _NETWORK_ERRORS as e:
            return Outcome(False, error=f"{type(e).__name__}: {e}"[:_ERROR_CHARS])
        if 200 <= status < 300:
            return Outcome(True, status)
        # the receiver's words go into logs and the dead letter: one line, printable
        text = "".join(
            c if c.isprintable() else " " for c in body[:_ERROR_CHARS].decode("utf-8", "replace")
        ).strip()
        error = f"HTTP {status}" + (f": {text}" if text else "")
        if status == 410:
            return Outcome(False, status, f"{error} (Gone: the receiver wants no more)", final=True)
        return Outcome(False, status, error, retry_after=retry_after)
