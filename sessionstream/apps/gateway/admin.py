"""The administrator's routes: `POST /v1/admin/sessions/{sessionId}/erase`.

Only a key created with ``keys create --admin`` may use them; any other key is refused 403
`admin_only` (logged with the key's id), as is a `session.erase` sent to the producers'
command route. The erasure is decided by the session's processor like any command
(docs/protocol.md, erasure): refused `session_busy` (409) while a run is active. The
gateway's Kafka principal must be allowed to write the control topic (`session.timers`)
for this route to work: a deployment that gives its gateway the producer principal only
gets 503 here, and erases with ``sessionstream sessions erase`` instead.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Annotated

from fastapi import FastAPI, Path
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from sessionstream.apps.gateway.bridge import CommandBridge
from sessionstream.apps.gateway.caller import Caller
from sessionstream.apps.gateway.commands import outcome_body
from sessionstream.apps.gateway.errors import ApiError
from sessionstream.apps.gateway.tenancy import Sessions
from sessionstream.errors import SessionstreamError
from sessionstream.schemas.commands import MAX_DENY_REASON_CHARS, MAX_ID_CHARS, Command
from sessionstream.settings import Settings

__all__ = ["add_admin_routes"]

log = logging.getLogger("sessionstream.apps.gateway")

_SessionId = Annotated[
    str, Path(alias="sessionId", min_length=1, max_length=MAX_ID_CHARS, pattern=r"^[^\x00/]+$")
]


class EraseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(default=None, max_length=MAX_DENY_REASON_CHARS)
    commandId: str | None = Field(default=None, min_length=1, max_length=MAX_ID_CHARS)


def add_admin_routes(
    app: FastAPI, settings: Settings, sessions: Sessions, bridge: CommandBridge
) -> None:
    @app.post(
        "/v1/admin/sessions/{sessionId}/erase",
        summary="Erase a session of the key's tenant everywhere (admin keys only)",
        responses={
            403: {"description": "the key is not an admin key"},
            404: {"description": "a session of before namespaces that is another tenant's"},
            409: {"description": "refused by the session: session_busy while a run is active"},
            503: {
                "description": "Kafka does not answer, or the gateway may not write the"
                " control topic"
            },
        },
    )
    async def erase_session(
        session_id: _SessionId, who: Caller, body: EraseRequest | None = None
    ) -> JSONResponse:
        if who.role != "admin":
            log.warning(
                "refused session.erase from key %s (%s): not an admin key",
                who.key_id,
                who.tenant_id,
            )
            raise ApiError(403, "admin_only", "erasing a session needs an admin key")
        req = body or EraseRequest()
        command = Command.model_validate(
            {
                "commandId": req.commandId or str(uuid.uuid4()),
                "sessionId": await sessions.full_id(who.tenant_id, session_id),
                "tenantId": who.tenant_id,
                "actor": who.actor,
                "type": "session.erase",
                "ts": int(time.time() * 1000),
                "payload": {} if req.reason is None else {"reason": req.reason},
            }
        )
        log.info("session.erase of %s by %s (key %s)", command.session_id, who.actor, who.key_id)
        result = await bridge.execute(command, settings.gateway_wait_s)
        if isinstance(result, SessionstreamError):
            raise ApiError(503, "kafka_unavailable", str(result).splitlines()[0])
        if result is not None and result.reason == "tenant_mismatch":
            raise ApiError(404, "not_found", "no such session for this key's tenant")
        status, out = outcome_body(command, result)
        return JSONResponse(out, status_code=status)
