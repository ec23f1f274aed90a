"""``DELETE /v1/sessions/{sessionId}/queue/{commandId}`` and ``DELETE
/v1/sessions/{sessionId}/queue``: a session's waiting tasks removed (the `dequeue` and
`clear_queue` commands, docs/protocol.md#queue-control), answered like every command route
(the outcome, its events)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import FastAPI, Header, Path, Query
from fastapi.responses import JSONResponse

from sessionstream.apps.gateway.caller import Caller
from sessionstream.apps.gateway.commands import OutcomeResponse, build_command
from sessionstream.apps.gateway.tenancy import Sessions
from sessionstream.schemas.commands import MAX_ID_CHARS, Command

__all__ = ["add_queue_routes"]

#: sends a command and waits for its outcome: (HTTP status, body), as the command route does
Execute = Callable[[Command, float | None], Awaitable[tuple[int, dict[str, Any]]]]

_SessionId = Annotated[
    str, Path(alias="sessionId", min_length=1, max_length=MAX_ID_CHARS, pattern=r"^[^\x00/]+$")
]
#: the queued task's id: the command id that queued it (a path: an id may hold a '/')
_TaskId = Annotated[
    str,
    Path(
        alias="commandId",
        min_length=1,
        max_length=MAX_ID_CHARS,
        description="the id of the command that queued the task (run.queued.sourceCommandId)",
    ),
]
_Wait = Annotated[float | None, Query(gt=0, description="seconds to wait for the outcome at most")]
_IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=MAX_ID_CHARS,
        description="the command's id (default: a new uuid); send the same to retry safely",
    ),
]
_RESPONSES: dict[int | str, dict[str, Any]] = {
    202: {"description": "no outcome within the wait: resend with the same Idempotency-Key"},
    401: {"description": "no or invalid API key"},
    409: {"description": "rejected by the session: not_queued, queue_empty, ..."},
    503: {"description": "Kafka does not answer"},
}


def add_queue_routes(app: FastAPI, sessions: Sessions, execute: Execute) -> None:
    async def send(
        session_id: str, who: Any, body: dict[str, Any], key: str | None, wait: float | None
    ) -> JSONResponse:
        if key is not None:
            body["commandId"] = key
        command = build_command(await sessions.full_id(who.tenant_id, session_id), body, who)
        status, out = await execute(command, wait)
        return JSONResponse(out, status_code=status)

    @app.delete(
        "/v1/sessions/{sessionId}/queue/{commandId:path}",
        response_model=OutcomeResponse,
        summary="Remove one waiting task (dequeue): the outcome, run.dequeued or not_queued",
        responses=_RESPONSES,
    )
    async def dequeue(
        session_id: _SessionId,
        task: _TaskId,
        who: Caller,
        wait: _Wait = None,
        idempotency_key: _IdempotencyKey = None,
    ) -> JSONResponse:
        body = {"type": "dequeue", "payload": {"commandId": task}}
        return await send(session_id, who, body, idempotency_key, wait)

    @app.delete(
        "/v1/sessions/{sessionId}/queue",
        response_model=OutcomeResponse,
        summary="Remove every waiting task (clear_queue): one run.dequeued each, or queue_empty",
        responses=_RESPONSES,
    )
    async def clear_queue(
        session_id: _SessionId,
        who: Caller,
        wait: _Wait = None,
        idempotency_key: _IdempotencyKey = None,
    ) -> JSONResponse:
        body: dict[str, Any] = {"type": "clear_queue", "payload": {}}
        return await send(session_id, who, body, idempotency_key, wait)
