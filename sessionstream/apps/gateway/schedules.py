"""The gateway's schedule routes: a session's schedules listed (with their next firing)
and created, replaced and deleted as `schedule.*` commands (docs/http.md#schedules).

Writes are commands like any other, sent through the command route's own path and answered
with their outcome; the list is folded from the `schedule.*` events the sink wrote to
PostgreSQL, so it shows what the log said a moment ago."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import psycopg
from fastapi import FastAPI, Path, Query, Request
from fastapi.responses import JSONResponse

from sessionstream.apps.gateway.auth import Principal
from sessionstream.apps.gateway.caller import Caller
from sessionstream.apps.gateway.commands import build_command, read_json
from sessionstream.apps.gateway.db import Database
from sessionstream.apps.gateway.errors import ApiError
from sessionstream.apps.gateway.tenancy import Sessions
from sessionstream.apps.gateway.views import schedule_json
from sessionstream.core.decider import evolve
from sessionstream.core.state import Schedule, SessionState
from sessionstream.runtimes.sink.replay import schedule_events
from sessionstream.schemas.commands import MAX_ID_CHARS, Command, ScheduleCreatePayload
from sessionstream.schemas.schedules import MAX_SCHEDULE_ID_CHARS, SCHEDULE_ID_PATTERN
from sessionstream.schemas.sessions import local_session_id

__all__ = ["add_schedule_routes", "schedules_of"]

#: the app's: send a command, wait for its outcome (HTTP status and body)
Execute = Callable[[Command, float | None], Awaitable[tuple[int, dict[str, Any]]]]

_ID_TEXT = r"^[^\x00/]+$"
SessionId = Annotated[
    str, Path(alias="sessionId", min_length=1, max_length=MAX_ID_CHARS, pattern=_ID_TEXT)
]
ScheduleId = Annotated[
    str,
    Path(
        alias="scheduleId",
        min_length=1,
        max_length=MAX_SCHEDULE_ID_CHARS,
        pattern=SCHEDULE_ID_PATTERN,
    ),
]
CommandIdQuery = Annotated[
    str | None,
    Query(
        alias="commandId",
        min_length=1,
        max_length=MAX_ID_CHARS,
        description="idempotency key (default: a new one); resend the same to retry safely",
    ),
]
_BODY_BYTES = 256 * 1024 + 4096


def schedules_of(
    conn: psycopg.Connection[Any], session_id: str, tenant_id: str
) -> list[Schedule] | None:
    """The session's schedules as its log says (None: the session is another tenant's)."""
    events = schedule_events(conn, session_id)
    conn.rollback()
    state = SessionState.initial(session_id)
    for e in events:
        if e.tenant_id != tenant_id:
            return None
        state = evolve(state, e)
    return list(state.schedules)


def _body(raw: Any, schedule_id: str | None = None) -> dict[str, Any]:
    """A definition body (camelCase, as `schedule.create`'s payload; `commandId` beside
    it) split into the command body the command route takes."""
    if not isinstance(raw, dict):
        raise ApiError(400, "invalid_request", "the body must be a JSON object")
    payload = dict(raw)
    command_id = payload.pop("commandId", None)
    if schedule_id is not None:
        given = payload.setdefault("scheduleId", schedule_id)
        if given != schedule_id:
            raise ApiError(400, "invalid_request", "scheduleId differs from the path's")
    body: dict[str, Any] = {"payload": payload}
    if command_id is not None:
        body["commandId"] = command_id
    return body


def add_schedule_routes(app: FastAPI, db: Database, sessions: Sessions, execute: Execute) -> None:
    """``/v1/sessions/{sessionId}/schedules`` on `app`: reads through `db`, writes as
    commands through `execute` (the command route's)."""

    async def send(who: Principal, local: str, body: dict[str, Any]) -> JSONResponse:
        command = build_command(await sessions.full_id(who.tenant_id, local), body, who)
        status, out = await execute(command, None)
        return JSONResponse(out, status_code=status)

    definition = {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": ScheduleCreatePayload.model_json_schema()}},
        }
    }
    answers: dict[int | str, dict[str, Any]] = {
        400: {"description": "malformed JSON or a field that violates its schema"},
        409: {"description": "rejected by the session (reason: invalid_schedule, ...)"},
        202: {"description": "no outcome within the wait: resend with the same commandId"},
    }

    @app.get(
        "/v1/sessions/{sessionId}/schedules",
        summary="A session's schedules and their next firing (from PostgreSQL)",
    )
    async def list_schedules(session_id: SessionId, who: Caller) -> dict[str, Any]:
        full = await sessions.full_id(who.tenant_id, session_id)
        found = await db.run(schedules_of, full, who.tenant_id)
        if found is None:
            raise ApiError(404, "not_found", "no such session for this key's tenant")
        return {
            "sessionId": local_session_id(who.tenant_id, full),
            "schedules": [schedule_json(sc) for sc in found],
        }

    @app.post(
        "/v1/sessions/{sessionId}/schedules",
        summary="Create a schedule (a schedule.create command); its outcome",
        openapi_extra=definition,
        responses=answers,
    )
    async def create_schedule(request: Request, session_id: SessionId, who: Caller) -> JSONResponse:
        body = _body(await read_json(request, _BODY_BYTES))
        return await send(who, session_id, {**body, "type": "schedule.create"})

    @app.put(
        "/v1/sessions/{sessionId}/schedules/{scheduleId}",
        summary="Replace a schedule's definition (a schedule.update command); its outcome",
        openapi_extra=definition,
        responses=answers,
    )
    async def update_schedule(
        request: Request, session_id: SessionId, schedule_id: ScheduleId, who: Caller
    ) -> JSONResponse:
        body = _body(await read_json(request, _BODY_BYTES), schedule_id)
        return await send(who, session_id, {**body, "type": "schedule.update"})

    @app.delete(
        "/v1/sessions/{sessionId}/schedules/{scheduleId}",
        summary="Delete a schedule (a schedule.delete command); its outcome",
        responses=answers,
    )
    async def delete_schedule(
        session_id: SessionId,
        schedule_id: ScheduleId,
        who: Caller,
        command_id: CommandIdQuery = None,
    ) -> JSONResponse:
        body: dict[str, Any] = {"type": "schedule.delete", "payload": {"scheduleId": schedule_id}}
        if command_id is not None:
            body["commandId"] = command_id
        return await send(who, session_id, body)
