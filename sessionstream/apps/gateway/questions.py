"""A person answers a run's question (`ctx.ask_user`):
``POST /v1/runs/{runId}/questions/{questionId}/answer``.

As the approval routes do (`approvals.py`): the route finds the run's session in PostgreSQL
(another tenant's run, or one the sink has not written yet, is 404), builds a
`question.answer` naming the run, stamped with the API key's tenant and actor (recorded as
`answeredBy`; a body never names it), and answers with the command's outcome (200
accepted, 409 rejected with the reason, 202 pending).
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any

from fastapi import FastAPI, Path, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from sessionstream.apps.gateway.approvals import (
    _FORBIDDEN,
    _ID_TEXT,
    _NOT_FOUND,
    Execute,
    RunId,
    Wait,
    _session_of,
)
from sessionstream.apps.gateway.auth import Principal
from sessionstream.apps.gateway.caller import Caller
from sessionstream.apps.gateway.commands import OutcomeResponse, read_json
from sessionstream.apps.gateway.db import Database
from sessionstream.apps.gateway.errors import ApiError
from sessionstream.schemas.commands import MAX_ID_CHARS, Command
from sessionstream.schemas.questions import QuestionAnswerPayload
from sessionstream.settings import Settings

__all__ = ["AnswerRequest", "add_question_routes"]

QuestionId = Annotated[
    str, Path(alias="questionId", min_length=1, max_length=MAX_ID_CHARS, pattern=_ID_TEXT)
]


class AnswerRequest(BaseModel):
    """The body of an answer: the person's `answer` (any JSON value, required), the
    question's generation (optional: the open one's) and a `commandId` to resend safely."""

    model_config = ConfigDict(extra="forbid", strict=True)

    answer: JsonValue
    generation: int | None = Field(default=None, ge=1)
    commandId: str | None = Field(default=None, min_length=1, max_length=MAX_ID_CHARS)


def _answer(body: Any) -> AnswerRequest:
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_command", "the body must be a JSON object")
    forbidden = sorted(k for k in body if k in (*_FORBIDDEN, "answeredBy", "answered_by"))
    if forbidden:
        raise ApiError(
            400,
            "forbidden_field",
            f"{', '.join(forbidden)}: set by the gateway from the API key, not by the body",
        )
    if "answer" not in body:
        raise ApiError(400, "invalid_command", "answer: required (null is an answer)")
    try:
        return AnswerRequest.model_validate(body)
    except ValidationError as e:
        details = [
            {"loc": ".".join(str(x) for x in err["loc"]), "msg": err["msg"]}
            for err in e.errors(include_url=False, include_input=False)[:10]
        ]
        raise ApiError(
            400, "invalid_command", "the answer violates its schema", details=details
        ) from None


def add_question_routes(app: FastAPI, settings: Settings, db: Database, execute: Execute) -> None:
    responses: dict[int | str, dict[str, Any]] = {
        202: {"description": "no outcome within the wait: resend with the same commandId"},
        400: {"description": "malformed JSON, invalid or forbidden field"},
        401: {"description": "no or invalid API key"},
        404: {"description": "no such run for this key's tenant"},
        409: {
            "description": "rejected (reason: unknown_question, question_not_open, "
            "question_stale, question_expired, answer_too_large, run_not_active), or in flight"
        },
        503: {"description": "Kafka does not answer"},
    }

    @app.post(
        "/v1/runs/{runId}/questions/{questionId}/answer",
        response_model=OutcomeResponse,
        summary="A person (the API key's actor) answers a run's open question",
        responses=responses,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": AnswerRequest.model_json_schema()}},
            }
        },
    )
    async def answer(
        request: Request, run_id: RunId, question_id: QuestionId, who: Caller, wait: Wait = None
    ) -> JSONResponse:
        return await _send(request, run_id, question_id, who, wait)

    async def _send(
        request: Request, run_id: str, question_id: str, who: Principal, wait: float | None
    ) -> JSONResponse:
        body = _answer(await read_json(request, settings.gateway_max_body_bytes))
        session = await db.run(_session_of, run_id, who.tenant_id)
        if session is None:
            raise ApiError(404, "not_found", _NOT_FOUND)
        try:
            payload = QuestionAnswerPayload(
                question_id=question_id, answer=body.answer, generation=body.generation
            )
        except ValidationError as e:  # NaN-free, nesting bounded: the protocol's JSON
            raise ApiError(400, "invalid_command", f"answer: {e.errors()[0]['msg']}") from None
        command = Command(
            command_id=body.commandId or str(uuid.uuid4()),
            session_id=session,
            tenant_id=who.tenant_id,
            actor=who.actor,
            type="question.answer",
            ts=int(time.time() * 1000),
            run_id=run_id,
            payload=payload,
        )
        status, out = await execute(command, wait)
        return JSONResponse(out, status_code=status)
