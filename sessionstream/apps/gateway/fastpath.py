"""The busiest route, ``POST /v1/sessions/{sessionId}/commands``, ahead of FastAPI.

FastAPI's stack between the server and a route is a dozen layers of middleware, routing
and dependency solving (the security-header middleware, exception telemetry, body limit,
exception middleware, exit stacks, the router, the route, the endpoint runner, the
response object); py-spy on the gateway at 64 commands in flight put them at ~300 of the
~1,000 samples its event loop spent in Python, more than the handler itself. This
middleware is the outermost of the app's own (inside Starlette's server-error middleware,
so an unexpected exception is still a 500): it hands that one route straight to its
`answer` and writes the JSON response itself, with the headers `Guard` gives every
response. Every other request — and this route's with a percent-encoded path, which
`Guard` judges — goes down the usual stack; the route's OpenAPI description stays
FastAPI's. Refusals take the shape the app's exception handlers give them (`ApiError`,
`DatabaseUnavailable`).

`telemetry_config` spares every request another of FastAPI's costs: its OpenTelemetry
check, when nothing is set up to receive what it would record.
"""

from __future__ import annotations

import inspect
import json
import os
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from sessionstream.apps.gateway.errors import ApiError, database_refusal, error_body
from sessionstream.apps.gateway.guard import SECURITY_HEADERS
from sessionstream.errors import DatabaseUnavailable

__all__ = ["COMMANDS_PATH", "CommandsFastPath", "telemetry_config"]

#: the route as Starlette matches ``/v1/sessions/{sessionId}/commands``: one decoded segment
COMMANDS_PATH = re.compile(r"/v1/sessions/([^/]+)/commands")

Answer = Callable[[Request], Awaitable[tuple[int, dict[str, Any]]]]
_JSON = (b"content-type", b"application/json")


class CommandsFastPath:
    """ASGI middleware: a POST to `COMMANDS_PATH` is answered by `answer` directly."""

    def __init__(self, app: ASGIApp, answer: Answer) -> None:
        self.app = app
        self.answer = answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and b"%" not in (scope.get("raw_path") or b"%")
        ):
            m = COMMANDS_PATH.fullmatch(scope["path"])
            if m is not None:
                scope["path_params"] = {"sessionId": m.group(1)}
                headers: Iterable[tuple[str, str]] = ()
                try:
                    status, body = await self.answer(Request(scope, receive))
                except ApiError as e:
                    status, body, headers = e.status, error_body(e), e.headers.items()
                except DatabaseUnavailable as e:
                    refusal = database_refusal(e)
                    status, body = refusal.status, error_body(refusal)
                await send_json(send, status, body, headers)
                return
        await self.app(scope, receive, send)


async def send_json(
    send: Send, status: int, body: Any, headers: Iterable[tuple[str, str]] = ()
) -> None:
    """`body` as Starlette's JSONResponse renders it, with Guard's headers."""
    data = json.dumps(
        body, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode("utf-8")
    raw = [(b"content-length", str(len(data)).encode()), _JSON, *SECURITY_HEADERS]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})


def telemetry_config() -> dict[str, Any]:
    """Keyword arguments for `FastAPI(...)`: OpenTelemetry's signals on for those whose
    provider is set when the app is made (`opentelemetry-instrument`, or the embedding
    program, set them first), off for the others. Nothing (FastAPI's defaults) when
    `FASTAPI_OTEL_AUTO_CONFIGURE` asks FastAPI to set providers up itself, or when this
    FastAPI has no native telemetry (an older release).

    FastAPI asks on every request whether each provider has been set since, and the
    OpenTelemetry API answers from the environment while none is: ~8 % of the event
    loop's time at 100 commands/s. The API's default providers are proxies (their class
    names say so) until a real one is set."""
    if os.getenv("FASTAPI_OTEL_AUTO_CONFIGURE", "").lower() == "true":
        return {}
    if "telemetry" not in inspect.signature(FastAPI).parameters:
        return {}
    from opentelemetry import _logs, metrics, trace

    def configured(provider: object) -> bool:
        return not type(provider).__name__.lstrip("_").startswith("Proxy")

    return {
        "telemetry": {
            "tracing": configured(trace.get_tracer_provider()),
            "metrics": configured(metrics.get_meter_provider()),
            "logs": configured(_logs.get_logger_provider()),
        }
    }
