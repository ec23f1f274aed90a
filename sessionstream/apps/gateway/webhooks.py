"""The gateway's webhook routes: a key's tenant creates, lists and deletes its
subscriptions and reads their dead letters (docs/webhooks.md). Delivery is
`sessionstream webhooks run`'s, not the gateway's."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sessionstream.apps.gateway.caller import Caller
from sessionstream.apps.gateway.commands import read_json
from sessionstream.apps.gateway.db import Database
from sessionstream.apps.gateway.errors import ApiError
from sessionstream.errors import ConfigurationError, KafkaUnavailable
from sessionstream.runtimes.webhooks.admission import admit_url, events_ends
from sessionstream.runtimes.webhooks.deliverer import sealer_of
from sessionstream.runtimes.webhooks.filters import check_patterns
from sessionstream.runtimes.webhooks.guard import MAX_URL_CHARS, UrlRefused
from sessionstream.runtimes.webhooks.sealing import SealedSecrets
from sessionstream.runtimes.webhooks.store import (
    TooManySubscriptions,
    create_subscription,
    delete_subscription,
    get_subscription,
    list_dead_letters,
    list_subscriptions,
)
from sessionstream.settings import Settings

__all__ = ["WebhookRequest", "add_webhook_routes"]

_BODY_BYTES = 16 * 1024
WebhookId = Annotated[str, Path(alias="webhookId", min_length=1, max_length=64)]
_NOT_FOUND = "no such webhook for this key's tenant"


class WebhookRequest(BaseModel):
    """A new subscription."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    url: str = Field(min_length=1, max_length=MAX_URL_CHARS)
    """http(s) URL the events are POSTed to."""
    event_types: list[str] = Field(default=["*"], alias="eventTypes", min_length=1)
    """run.finished, a prefix such as run.*, or * (every type)."""
    description: str | None = Field(default=None, max_length=200)


def _view(sub: Any) -> dict[str, Any]:
    out: dict[str, Any] = sub.json()
    out.pop("tenantId")  # the key's own
    return out


def add_webhook_routes(app: FastAPI, settings: Settings, db: Database) -> None:
    """``/v1/webhooks`` on `app`, reading and writing through `db`."""
    try:
        sealer: SealedSecrets | None = sealer_of(settings)
    except ConfigurationError:
        sealer = None

    @app.post(
        "/v1/webhooks",
        status_code=201,
        summary="Subscribe a URL to the key's tenant's events (the secret is shown once)",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": WebhookRequest.model_json_schema()}},
            }
        },
        responses={
            400: {"description": "invalid request, unknown event type, or the URL is refused"},
            409: {"description": "the tenant has the most webhooks it may have"},
            503: {"description": "webhooks are not configured, or Kafka does not answer"},
        },
    )
    async def create_webhook(request: Request, who: Caller) -> JSONResponse:
        if sealer is None:
            raise ApiError(
                503,
                "webhooks_unavailable",
                "webhooks are not configured on this gateway (SESSIONSTREAM_WEBHOOKS_SECRET_KEY)",
            )
        raw = await read_json(request, _BODY_BYTES)
        try:
            body = WebhookRequest.model_validate(raw)
            patterns = check_patterns(body.event_types)
        except ValidationError as e:
            details = [
                {"loc": ".".join(str(x) for x in err["loc"]), "msg": err["msg"]}
                for err in e.errors()[:10]
            ]
            raise ApiError(400, "invalid_request", "invalid webhook", details=details) from None
        except ValueError as e:
            raise ApiError(400, "invalid_request", str(e)) from None
        try:
            await admit_url(settings, body.url)
        except UrlRefused as e:
            raise ApiError(400, "url_refused", e.reason) from None
        try:
            starts = await run_in_threadpool(events_ends, settings)
        except KafkaUnavailable as e:
            raise ApiError(503, "kafka_unavailable", str(e).splitlines()[0]) from e
        try:
            secret, sub = await db.run(
                create_subscription,
                sealer,
                who.tenant_id,
                body.url,
                patterns,
                starts,
                body.description,
            )
        except TooManySubscriptions as e:
            raise ApiError(409, "too_many_webhooks", str(e)) from None
        except (ValueError, UrlRefused) as e:
            raise ApiError(400, "invalid_request", str(e)) from None
        return JSONResponse({**_view(sub), "secret": secret}, status_code=201)

    @app.get("/v1/webhooks", summary="The key's tenant's webhooks (never their secrets)")
    async def list_webhooks(who: Caller) -> dict[str, Any]:
        subs = await db.run(list_subscriptions, who.tenant_id)
        return {"webhooks": [_view(s) for s in subs]}

    @app.get("/v1/webhooks/{webhookId}", summary="One webhook")
    async def get_webhook(webhook_id: WebhookId, who: Caller) -> dict[str, Any]:
        sub = await db.run(get_subscription, webhook_id, who.tenant_id)
        if sub is None:
            raise ApiError(404, "not_found", _NOT_FOUND)
        return _view(sub)

    @app.delete(
        "/v1/webhooks/{webhookId}",
        status_code=204,
        summary="Delete a webhook: nothing more is sent to it",
        response_class=Response,
    )
    async def delete_webhook(webhook_id: WebhookId, who: Caller) -> Response:
        if not await db.run(delete_subscription, webhook_id, who.tenant_id):
            raise ApiError(404, "not_found", _NOT_FOUND)
        return Response(status_code=204)

    @app.get(
        "/v1/webhooks/{webhookId}/dead-letters",
        summary="A webhook's dead letters in log order (where to redeliver from)",
    )
    async def get_dead_letters(
        webhook_id: WebhookId, who: Caller, limit: Annotated[int, Query(ge=1, le=1000)] = 100
    ) -> dict[str, Any]:
        if await db.run(get_subscription, webhook_id, who.tenant_id) is None:
            raise ApiError(404, "not_found", _NOT_FOUND)
        rows = await db.run(list_dead_letters, webhook_id, who.tenant_id, limit)
        return {"webhookId": webhook_id, "deadLetters": [r.json() for r in rows]}
