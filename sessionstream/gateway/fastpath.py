"""The busiest route, ``POST /v1/sessions/{sessionId}/commands``, ahead of FastAPI.

FastAPI's stack between the server and a route is eleven layers of middleware, routing and
dependency solving (exception telemetry, body limit, exception middleware, exit stacks,
the router, the route, the endpoint runner); py-spy on the gateway at 64 commands in
flight put them at ~300 of the ~1,000 samples its event loop spent in Python, more than
the handler itself. This middleware sits where the gateway's own `Guard` does (inside
Starlette's server-error middleware, so an unexpected exception is still a 500) and hands
that one route straight to its handler; every other request, and the route's OpenAPI
description, stay FastAPI's. The handler's errors take the shapes the app's exception
handlers give them (`ApiError`, `DatabaseUnavailable`).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from sessionstream.errors import DatabaseUnavailable
from sessionstream.gateway.errors import ApiError, error_response

__all__ = ["COMMANDS_PATH", "CommandsFastPath"]

#: the route as Starlette matches ``/v1/sessions/{sessionId}/commands``: one decoded segment
COMMANDS_PATH = re.compile(r"/v1/sessions/([^/]+)/commands")

Handler = Callable[[Request], Awaitable[Response]]


class CommandsFastPath:
    """ASGI middleware: a POST to `COMMANDS_PATH` goes to `handler` directly."""

    def __init__(self, app: ASGIApp, handler: Handler) -> None:
        self.app = app
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            m = COMMANDS_PATH.fullmatch(scope["path"])
            if m is not None:
                scope["path_params"] = {"sessionId": m.group(1)}
                request = Request(scope, receive, send)
                try:
                    response = await self.handler(request)
                except ApiError as e:
                    response = error_response(e)
                except DatabaseUnavailable as e:
                    response = error_response(
                        ApiError(503, "database_unavailable", str(e).splitlines()[0])
                    )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
