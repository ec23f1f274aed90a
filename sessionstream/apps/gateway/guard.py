"""Every response's security headers, and paths that mean exactly one thing.

Headers (unless the response set its own): a Content-Security-Policy the console works
under (everything from the gateway itself, nothing inline, no framing), ``X-Frame-Options:
DENY`` for browsers without ``frame-ancestors``, ``X-Content-Type-Options: nosniff`` and
``Referrer-Policy: no-referrer`` (a URL never leaves in a Referer).

Paths: a percent-encoding that is not UTF-8 (``%ff``) is refused ``400 invalid_path``
instead of becoming U+FFFD (two URLs reached one session), and so is an encoded ``/``
(``%2F``) or NUL (``%00``): an id never holds either.
"""

from __future__ import annotations

import json
from urllib.parse import unquote_to_bytes

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["CONSOLE_CSP", "DOCS_CSP", "SECURITY_HEADERS", "Guard"]

CONSOLE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
#: Swagger UI sets style attributes and draws data: images; its scripts are still ours only
DOCS_CSP = CONSOLE_CSP.replace("style-src 'self'", "style-src 'self' 'unsafe-inline'")

SECURITY_HEADERS = (
    (b"content-security-policy", CONSOLE_CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)


def _path_problem(raw: bytes) -> str | None:
    if b"%" not in raw:
        return None
    lowered = raw.lower()
    if b"%2f" in lowered:
        return "an encoded '/' (%2F): no id contains '/'"
    if b"%00" in lowered:
        return "an encoded NUL (%00): no id contains it"
    try:
        unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return "a percent-encoding that is not UTF-8"
    return None


class Guard:
    """ASGI middleware: the headers above on every HTTP response, odd paths refused."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = _path_problem(scope.get("raw_path") or b"")
        if problem is not None:
            await _refuse(send, problem)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [(n, v) for n, v in SECURITY_HEADERS if n not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def _refuse(send: Send, problem: str) -> None:
    body = json.dumps(
        {"error": {"code": "invalid_path", "message": f"the path has {problem}"}}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 400,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *SECURITY_HEADERS,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
