"""Who calls a route: the dependency every authenticated route takes (`Caller`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from sessionstream.apps.gateway.auth import Authenticator, Principal

__all__ = ["Caller", "client_address"]


def client_address(request: Request) -> str | None:
    return request.client.host if request.client else None


async def _caller(
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
    x_api_key: Annotated[str | None, Header()] = None,
) -> Principal:
    auth: Authenticator = request.app.state.gateway.auth
    return await auth.principal(authorization, x_api_key, client_address(request))


#: the authenticated (and rate-limited) caller of a request
Caller = Annotated[Principal, Depends(_caller)]
