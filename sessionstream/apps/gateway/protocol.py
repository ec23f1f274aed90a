"""The gateway's HTTP connections: uvicorn's httptools protocol with limits and timeouts.

uvicorn closes a kept-alive connection after an idle time, and that is all: a client that
opens connections and sends nothing, or a request head or body one byte at a time, holds
its socket as long as it likes, and nothing bounds how many it holds. Here:

- a request's head (request line and headers) must be complete within
  `gateway_header_timeout_s` of the connection opening or of its previous response, its
  body within `gateway_body_timeout_s` of the head; else ``408`` and the connection closes;
- at most `gateway_max_connections` connections in all (``503``) and
  `gateway_max_connections_per_address` from one address (``429``), both with
  ``Retry-After``, then closed — before anything of the request is read;
- the app may close a connection whose client stopped reading (`ABORT_EXTENSION`), which
  uvicorn's ASGI interface has no message for.

Counts use the socket's peer address: a forwarded-for header cannot lift them.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections import Counter
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["ABORT_EXTENSION", "ConnectionLimits", "guarded_protocol"]

log = logging.getLogger("sessionstream.apps.gateway")

#: scope["extensions"] key of a callable that drops the connection at once (no response end)
ABORT_EXTENSION = "sessionstream.abort"


@dataclass
class ConnectionLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 15.0
    max_connections: int = 2048
    max_per_address: int = 128

    def effective_max(self) -> int:
        """`max_connections`, lowered to leave room in the open-files limit for Kafka,
        PostgreSQL and files (each connection is one descriptor)."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.max_connections
        return max(16, min(self.max_connections, soft - 256))


def _canned(status: bytes, retry_after: int | None, message: str) -> bytes:
    body = (
        b'{"error":{"code":"'
        + status.split(b" ", 1)[1].lower().replace(b" ", b"_")
        + b'","message":"'
        + message.encode()
        + b'"}}'
    )
    head = [
        b"HTTP/1.1 " + status,
        b"content-type: application/json",
        b"content-length: " + str(len(body)).encode(),
        b"connection: close",
    ]
    if retry_after is not None:
        head.append(b"retry-after: " + str(retry_after).encode())
    return b"\r\n".join(head) + b"\r\n\r\n" + body


_TIMEOUT = _canned(b"408 Request Timeout", None, "the request did not arrive in time")
_BUSY = _canned(b"503 Service Unavailable", 1, "the gateway has too many connections")
_PER_ADDRESS = _canned(b"429 Too Many Requests", 1, "too many connections from this address")


def guarded_protocol(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """A protocol class for `uvicorn.Config(http=...)` that enforces `limits`; its counts
    are shared by every connection of the server."""
    cap = limits.effective_max()
    per_address: Counter[str] = Counter()
    total = [0]

    class GuardedProtocol(HttpToolsProtocol):
        _timer: asyncio.TimerHandle | None = None
        _address: str | None = None
        _counted = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._address = self.client[0] if self.client else None
            if total[0] >= cap:
                self._refuse(_BUSY, "connections in all")
                return
            if self._address is not None and per_address[self._address] >= limits.max_per_address:
                self._refuse(_PER_ADDRESS, f"connections from {self._address}")
                return
            self._counted = True
            total[0] += 1
            if self._address is not None:
                per_address[self._address] += 1
            self._arm(limits.header_timeout_s)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._counted:
                self._counted = False
                total[0] -= 1
                if self._address is not None:
                    per_address[self._address] -= 1
                    if per_address[self._address] <= 0:
                        del per_address[self._address]
            super().connection_lost(exc)

        def on_headers_complete(self) -> None:
            self._disarm()
            extensions: dict[str, Any] = self.scope.setdefault("extensions", {})
            extensions[ABORT_EXTENSION] = self._abort
            super().on_headers_complete()
            if self.cycle is not None and self.cycle.more_body:
                self._arm(limits.body_timeout_s)

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm(limits.header_timeout_s)  # the next request's head

        # -- helpers ------------------------------------------------------------------------
        def _refuse(self, canned: bytes, what: str) -> None:
            log.warning("gateway: refused a connection: too many %s", what)
            self.transport.write(canned)
            self.transport.close()

        def _arm(self, seconds: float) -> None:
            self._disarm()
            self._timer = self.loop.call_later(seconds, self._timed_out)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _timed_out(self) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            responding = self.cycle is not None and self.cycle.response_started
            log.info(
                "gateway: %s: the request did not arrive within its time; closed",
                self._address or "a client",
            )
            if responding:
                self._abort()
                return
            if self.cycle is not None:
                self.cycle.disconnected = True
                self.cycle.message_event.set()
            self.transport.write(_TIMEOUT)  # a few bytes: the socket takes them at once
            self.transport.close()

        def _abort(self) -> None:
            """Drop the connection now; what the app sends after is discarded, and uvicorn
            takes it as the client's leaving (no error for an unfinished response)."""
            if self.cycle is not None:
                self.cycle.disconnected = True
                self.cycle.message_event.set()
            # abort, not close: close() waits to flush what a client that does not read
            # will never take, and the socket would stay open
            self.transport.abort()

    return GuardedProtocol
