"""``POST /v1/sessions/{sessionId}/commands``: a request body -> a command -> its outcome.

The body is read as a bounded stream (413 past `gateway_max_body_bytes`, before it is
read whole), must be ``application/json`` (415) and a JSON object (400) with only
`type`, `payload`, `commandId` and `runId`. `tenantId` and `actor` come from the API key;
a body that names them (or `sessionId`, `ts`, worker fields) is refused 400
`forbidden_field`. Only producer commands are accepted (`prompt`, `steer`, `follow_up`,
`send`, `abort`, `action.approve`, `action.deny`, `dequeue`, `clear_queue`). Nothing reaches
Kafka until the command is valid.

JSON is read strictly: a key given twice in one object is refused (which one counts is
not for a parser to guess), and payload numbers and booleans are of their JSON type
(``"timeoutMs": true`` or ``"100"`` is refused, not read as 1 or 100).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import ClientDisconnect, Request

from sessionstream.apps.gateway.auth import Principal
from sessionstream.apps.gateway.errors import ApiError
from sessionstream.apps.gateway.views import event_json
from sessionstream.client import Outcome, outcome_of
from sessionstream.errors import SessionstreamError
from sessionstream.schemas.commands import (
    ADMIN_COMMAND_TYPES,
    COMMAND_PAYLOADS,
    MAX_ID_CHARS,
    PRODUCER_COMMAND_TYPES,
    Command,
)
from sessionstream.schemas.sessions import local_session_id

__all__ = ["CommandRequest", "OutcomeResponse", "build_command", "outcome_body", "read_json"]

log = logging.getLogger("sessionstream.apps.gateway")

#: envelope fields the gateway sets itself; a body may not
FORBIDDEN_FIELDS = (
    "tenantId",
    "tenant_id",
    "actor",
    "sessionId",
    "session_id",
    "ts",
    "workerId",
    "worker_id",
    "generation",
)
_ALLOWED = {"type", "payload", "commandId", "command_id", "runId", "run_id"}


class CommandRequest(BaseModel):
    """The body of ``POST /v1/sessions/{sessionId}/commands`` (for the OpenAPI document;
    the handler checks the same by hand to give precise errors)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal[
        "prompt",
        "steer",
        "follow_up",
        "send",
        "abort",
        "action.approve",
        "action.deny",
        "question.answer",
        "dequeue",
        "clear_queue",
    ]
    payload: dict[str, Any] = Field(
        default_factory=dict,
        description="the type's payload, camelCase (docs/protocol.md#producer-commands)",
    )
    commandId: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ID_CHARS,
        description="idempotency key; default a new uuid. Resend the same to retry safely",
    )
    runId: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ID_CHARS,
        description="act on this run only (else rejected run_not_active)",
    )


class OutcomeResponse(BaseModel):
    """A command's outcome."""

    status: Literal["accepted", "rejected", "duplicate", "dead_letter", "pending"]
    commandId: str
    sessionId: str
    runId: str | None = None
    reason: str | None = None
    events: list[dict[str, Any]] = Field(default_factory=list)
    original: dict[str, Any] | None = Field(
        default=None, description="duplicate: the first outcome, when PostgreSQL has it"
    )


async def read_json(request: Request, limit: int) -> Any:
    """The request body as JSON, read at most `limit` bytes far."""
    ctype = request.headers.get("content-type", "")
    if ctype.split(";")[0].strip().lower() != "application/json":
        raise ApiError(
            415, "unsupported_media_type", f"Content-Type must be application/json, not {ctype!r}"
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "body_too_large", f"the body is larger than {limit} bytes")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise ApiError(413, "body_too_large", f"the body is larger than {limit} bytes")
    except ClientDisconnect:
        # gone before its body was whole (or cut off by the body timeout): nobody to answer
        log.info("gateway: a client left before its request body was complete")
        raise ApiError(400, "client_disconnected", "the body did not arrive") from None
    try:
        # UTF-8 only (json.loads of bytes would also take UTF-16 and UTF-32); a number of
        # more digits than Python converts and nesting deeper than it parses are not JSON
        # this API takes either
        return json.loads(body.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except _DuplicateKey as e:
        raise ApiError(400, "malformed_json", str(e)) from None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ApiError(400, "malformed_json", f"the body is not UTF-8 JSON: {e}") from e


class _DuplicateKey(SessionstreamError):
    """A key given twice (raised out of json.loads as is: it is no ValueError)."""


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(f"the key {k[:60]!r} is given twice in one object")
            seen.add(k)
    return out


def _given(body: dict[str, Any], camel: str, snake: str) -> Any:
    """The field under either spelling, None when absent or null: an empty or false value
    is passed on to be refused (an empty `runId` used to mean "the active run", and an
    empty `commandId` a fresh one on every retry)."""
    if camel in body and snake in body:
        raise ApiError(400, "invalid_command", f"{camel} and {snake} are the same field: give one")
    value = body[camel] if camel in body else body.get(snake)
    if value is not None and not isinstance(value, str):
        raise ApiError(400, "invalid_command", f"{camel} must be a string")
    return value


def build_command(session_id: str, body: Any, who: Principal) -> Command:
    """The command a request body asks for, stamped with the key's tenant and actor."""
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_command", "the body must be a JSON object")
    forbidden = sorted(k for k in body if k in FORBIDDEN_FIELDS)
    if forbidden:
        raise ApiError(
            400,
            "forbidden_field",
            f"{', '.join(forbidden)}: set by the gateway from the API key, not by the body",
        )
    unknown = sorted(k for k in body if k not in _ALLOWED)
    if unknown:
        raise ApiError(400, "invalid_command", f"unknown fields: {', '.join(unknown)}")
    type_ = body.get("type")
    if isinstance(type_, str) and type_ in ADMIN_COMMAND_TYPES:
        log.warning("refused %s from key %s (%s): admin only", type_, who.key_id, who.tenant_id)
        raise ApiError(
            403,
            "admin_only",
            f"{type_} is an administrator's command: POST /v1/admin/sessions/{{sessionId}}/erase"
            " with an admin key",
        )
    if not isinstance(type_, str) or type_ not in PRODUCER_COMMAND_TYPES:
        raise ApiError(
            400,
            "unknown_type",
            f"type must be one of {', '.join(sorted(PRODUCER_COMMAND_TYPES))}, not {type_!r}",
        )
    payload = body.get("payload")
    command_id = _given(body, "commandId", "command_id")
    try:
        # strict: JSON's types as they are (a bool or a numeric string is no integer)
        typed = COMMAND_PAYLOADS[type_].model_validate(
            {} if payload is None else payload, strict=True
        )
    except ValidationError as e:
        raise _invalid(e, "payload.") from None
    try:
        return Command.model_validate(
            {
                "commandId": str(uuid.uuid4()) if command_id is None else command_id,
                "sessionId": session_id,
                "tenantId": who.tenant_id,
                "actor": who.actor,
                "type": type_,
                "ts": int(time.time() * 1000),
                "runId": _given(body, "runId", "run_id"),
                "payload": typed,
            }
        )
    except ValidationError as e:
        raise _invalid(e) from None


def _invalid(e: ValidationError, prefix: str = "") -> ApiError:
    details = [
        {"loc": prefix + ".".join(str(x) for x in err["loc"]), "msg": err["msg"]}
        for err in e.errors(include_url=False, include_input=False)[:10]
    ]
    return ApiError(400, "invalid_command", "the command violates its schema", details=details)


def outcome_body(
    command: Command, outcome: Outcome | None, original: list[Any] | None = None
) -> tuple[int, dict[str, Any]]:
    """HTTP status and body of an outcome (None: none within the wait)."""
    body: dict[str, Any] = {
        "commandId": command.command_id,
        "sessionId": local_session_id(command.tenant_id, command.session_id),
        "runId": None,
        "reason": None,
        "events": [],
    }
    if outcome is None:
        return 202, {**body, "status": "pending"}
    body.update(
        status=outcome.status,
        runId=outcome.run_id,
        reason=outcome.reason,
        events=[event_json(e) for e in outcome.events],
    )
    if outcome.status == "duplicate" and original:
        first = outcome_of(command.command_id, original)
        body["original"] = {
            "status": first.status,
            "runId": first.run_id,
            "reason": first.reason,
            "events": [event_json(e) for e in first.events],
        }
    status = {"accepted": 200, "duplicate": 200, "rejected": 409, "dead_letter": 422}[
        outcome.status
    ]
    return status, body
