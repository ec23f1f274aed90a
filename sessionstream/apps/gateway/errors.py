"""The gateway's one error shape: ``{"error": {"code": ..., "message": ..., "details"?}}``."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from sessionstream.errors import DatabaseUnavailable, SessionstreamError

__all__ = ["ApiError", "database_refusal", "error_body", "error_response"]


class ApiError(SessionstreamError):
    """An HTTP error with a stable `code` (documented in docs/http.md)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        details: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.headers = headers or {}


def error_body(e: ApiError) -> dict[str, Any]:
    body: dict[str, Any] = {"code": e.code, "message": e.message}
    if e.details is not None:
        body["details"] = e.details
    return {"error": body}


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(error_body(e), status_code=e.status, headers=e.headers)


def database_refusal(e: DatabaseUnavailable) -> ApiError:
    """What a request that needed PostgreSQL gets while it does not answer."""
    return ApiError(503, "database_unavailable", str(e).splitlines()[0])
