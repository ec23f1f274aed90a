"""A person decides a pending action: ``POST /v1/runs/{runId}/actions/{key}/approve`` and
``.../deny``, and ``GET /v1/approvals`` (what waits for the key's tenant).

The route finds the run's session in PostgreSQL (a run of another tenant, or one the sink
has not written yet, is 404 as if unknown: nothing about it is revealed), builds an
`action.approve` / `action.deny` naming the run, stamped with the API key's tenant and
actor (the actor is recorded as `decidedBy`; a body never names it), and answers with the
command's outcome exactly as ``POST /v1/sessions/{sessionId}/commands`` does (the same
bridge and outcome wait: 200 accepted, 409 rejected with the reason, 202 pending).

An idempotency key holding ``/`` cannot be a path segment: decide it with the commands
route (``type: action.approve``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, Final

from fastapi import FastAPI, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sessionstream.apps.gateway.auth import Principal
from sessionstream.apps.gateway.caller import Caller
from sessionstream.apps.gateway.commands import OutcomeResponse, read_json
from sessionstream.apps.gateway.db import Database
from sessionstream.apps.gateway.errors import ApiError
from sessionstream.runtimes.sink.approvals import pending_approvals
from sessionstream.schemas.commands import (
    MAX_DENY_REASON_CHARS,
    MAX_ID_CHARS,
    ActionApprovePayload,
    ActionDenyPayload,
    Command,
)
from sessionstream.schemas.sessions import local_session_id
from sessionstream.settings import Settings

if TYPE_CHECKING:
    import psycopg

__all__ = ["DecisionRequest", "add_approval_routes"]

_NOT_FOUND: Final = "no such run for this key's tenant"
_ID_TEXT = r"^[^\x00/]+$"
RunId = Annotated[str, Path(alias="runId", min_length=1, max_length=MAX_ID_CHARS, pattern=_ID_TEXT)]
Key = Annotated[str, Path(min_length=1, max_length=MAX_ID_CHARS, pattern=_ID_TEXT)]
Wait = Annotated[float | None, Query(gt=0, description="seconds to wait for the outcome at most")]
#: fields the gateway sets from the API key; a body naming one is refused
_FORBIDDEN: Final = ("actor", "decidedBy", "decided_by", "tenantId", "tenant_id", "sessionId")


class DecisionRequest(BaseModel):
    """The body of an approve / deny: the digest the person was shown (null for an action
    asked without arguments), the request's generation (optional: the pending one's), the
    person's reason (deny only) and a `commandId` to resend safely."""

    model_config = ConfigDict(extra="forbid", strict=True)

    argsDigest: str | None = Field(max_length=MAX_ID_CHARS)
    generation: int | None = Field(default=None, ge=1)
    reason: str | None = Field(default=None, max_length=MAX_DENY_REASON_CHARS)
    commandId: str | None = Field(default=None, min_length=1, max_length=MAX_ID_CHARS)


def _session_of(conn: psycopg.Connection[Any], run_id: str, tenant_id: str) -> str | None:
    row = conn.execute(
        "select session_id, tenant_id from agent_runs where run_id = %s", (run_id,)
    ).fetchone()
    conn.rollback()
    return None if row is None or row[1] != tenant_id else str(row[0])


def _decision(body: Any, deny: bool) -> DecisionRequest:
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_command", "the body must be a JSON object")
    forbidden = sorted(k for k in body if k in _FORBIDDEN)
    if forbidden:
        raise ApiError(
            400,
            "forbidden_field",
            f"{', '.join(forbidden)}: set by the gateway from the API key, not by the body",
        )
    if not deny and "reason" in body:
        raise ApiError(400, "invalid_command", "reason: only a deny has one")
    try:
        return DecisionRequest.model_validate(body)
    except ValidationError as e:
        details = [
            {"loc": ".".join(str(x) for x in err["loc"]), "msg": err["msg"]}
            for err in e.errors(include_url=False, include_input=False)[:10]
        ]
        raise ApiError(
            400, "invalid_command", "the decision violates its schema", details=details
        ) from None


#: the app's command sending and outcome wait (what ``POST .../commands`` answers with)
Execute = Callable[[Command, float | None], Awaitable[tuple[int, dict[str, Any]]]]


def add_approval_routes(app: FastAPI, settings: Settings, db: Database, execute: Execute) -> None:
    responses: dict[int | str, dict[str, Any]] = {
        202: {"description": "no outcome within the wait: resend with the same commandId"},
        400: {"description": "malformed JSON, invalid or forbidden field"},
        401: {"description": "no or invalid API key"},
        404: {"description": "no such run for this key's tenant"},
        409: {
            "description": "rejected (reason: action_not_pending, digest_mismatch, "
            "approval_stale, approval_expired, unknown_action, run_not_active), or in flight"
        },
        503: {"description": "Kafka does not answer"},
    }

    async def decide(
        request: Request, run_id: str, key: str, who: Principal, wait: float | None, deny: bool
    ) -> JSONResponse:
        body = _decision(await read_json(request, settings.gateway_max_body_bytes), deny)
        session = await db.run(_session_of, run_id, who.tenant_id)
        if session is None:
            raise ApiError(404, "not_found", _NOT_FOUND)
        payload: ActionApprovePayload | ActionDenyPayload
        if deny:
            payload = ActionDenyPayload(
                idempotency_key=key,
                args_digest=body.argsDigest,
                generation=body.generation,
                reason=body.reason,
            )
        else:
            payload = ActionApprovePayload(
                idempotency_key=key, args_digest=body.argsDigest, generation=body.generation
            )
        command = Command(
            command_id=body.commandId or str(uuid.uuid4()),
            session_id=session,
            tenant_id=who.tenant_id,
            actor=who.actor,
            type="action.deny" if deny else "action.approve",
            ts=int(time.time() * 1000),
            run_id=run_id,
            payload=payload,
        )
        status, out = await execute(command, wait)
        return JSONResponse(out, status_code=status)

    @app.post(
        "/v1/runs/{runId}/actions/{key}/approve",
        response_model=OutcomeResponse,
        summary="A person (the API key's actor) approves a pending action",
        responses=responses,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": DecisionRequest.model_json_schema()}},
            }
        },
    )
    async def approve(
        request: Request, run_id: RunId, key: Key, who: Caller, wait: Wait = None
    ) -> JSONResponse:
        return await decide(request, run_id, key, who, wait, deny=False)

    @app.post(
        "/v1/runs/{runId}/actions/{key}/deny",
        response_model=OutcomeResponse,
        summary="A person (the API key's actor) denies a pending action",
        responses=responses,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": DecisionRequest.model_json_schema()}},
            }
        },
    )
    async def deny(
        request: Request, run_id: RunId, key: Key, who: Caller, wait: Wait = None
    ) -> JSONResponse:
        return await decide(request, run_id, key, who, wait, deny=True)

    @app.get("/v1/approvals", summary="The actions of the key's tenant waiting for a person")
    async def get_approvals(
        who: Caller, limit: Annotated[int, Query(ge=1, le=1000)] = 200
    ) -> dict[str, Any]:
        rows = await db.run(pending_approvals, who.tenant_id, limit)
        for r in rows:
            r["sessionId"] = local_session_id(who.tenant_id, r["sessionId"])
        return {"approvals": rows}
