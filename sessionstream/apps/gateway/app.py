"""The gateway's ASGI app: the HTTP API under ``/v1``, the console at ``/``.

One process holds one `CommandBridge` (a producer and a tail of outcomes), one
`EventFanout` (a tail for the event streams), a small PostgreSQL pool and an HTTP client
for the analytics app. API reference: docs/http.md; ``/openapi.json`` describes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from importlib import resources
from typing import Annotated, Any

import httpx
from fastapi import FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from sessionstream import __version__
from sessionstream.adapters._gc import settle_collector
from sessionstream.apps.gateway import search, views
from sessionstream.apps.gateway.admin import add_admin_routes
from sessionstream.apps.gateway.approvals import add_approval_routes
from sessionstream.apps.gateway.auth import Authenticator
from sessionstream.apps.gateway.bridge import CommandBridge, InFlight
from sessionstream.apps.gateway.caller import Caller, client_address
from sessionstream.apps.gateway.commands import (
    CommandRequest,
    OutcomeResponse,
    build_command,
    outcome_body,
    read_json,
)
from sessionstream.apps.gateway.db import Database
from sessionstream.apps.gateway.errors import ApiError, database_refusal, error_response
from sessionstream.apps.gateway.fanout import EventFanout
from sessionstream.apps.gateway.fastpath import CommandsFastPath, telemetry_config
from sessionstream.apps.gateway.guard import DOCS_CSP, Guard
from sessionstream.apps.gateway.limits import StreamCounts
from sessionstream.apps.gateway.questions import add_question_routes
from sessionstream.apps.gateway.queue import add_queue_routes
from sessionstream.apps.gateway.schedules import add_schedule_routes
from sessionstream.apps.gateway.search import (
    CursorQuery,
    LabelQuery,
    LimitQuery,
    OrderQuery,
    SinceQuery,
    StatusQuery,
    UntilQuery,
)
from sessionstream.apps.gateway.sse import (
    CatchUpSlots,
    StreamLimits,
    event_stream,
    parse_last_event_id,
)
from sessionstream.apps.gateway.tenancy import Sessions
from sessionstream.apps.gateway.webhooks import add_webhook_routes
from sessionstream.errors import DatabaseUnavailable, IncompatibleEvent, SessionstreamError
from sessionstream.runtimes.sink.replay import events_of_command, offsets_for_time, parse_time
from sessionstream.schemas.commands import MAX_ID_CHARS, Command
from sessionstream.settings import Settings

__all__ = ["create_app"]

log = logging.getLogger("sessionstream.apps.gateway")

#: ids as commands carry them: 1-200 characters, no NUL (PostgreSQL refuses one in a query)
#: and no '/' (the event key's separator; a path segment cannot hold one anyway)
_ID_TEXT = r"^[^\x00/]+$"
SessionId = Annotated[
    str, Path(alias="sessionId", min_length=1, max_length=MAX_ID_CHARS, pattern=_ID_TEXT)
]
RunId = Annotated[str, Path(alias="runId", min_length=1, max_length=MAX_ID_CHARS, pattern=_ID_TEXT)]
_NOT_FOUND = "no such session for this key's tenant"


class Gateway:
    """The process-wide parts, started and stopped with the app."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.db = Database(settings)
        self.auth = Authenticator(settings, self.db)
        self.sessions = Sessions(self.db)
        self.cursors = search.cursor_codec(settings)
        self.bridge = CommandBridge(settings)
        self.fanout = EventFanout(
            settings,
            queue_size=settings.gateway_sse_queue,
            queue_bytes=settings.gateway_sse_queue_bytes,
            catch_up_threads=settings.gateway_catch_up_threads,
        )
        self.slots = CatchUpSlots(settings.gateway_catch_up_per_tenant)
        self.streams = StreamCounts(settings.gateway_sse_per_key, settings.gateway_sse_per_tenant)
        self.stream_limits = StreamLimits(
            ping_s=settings.gateway_sse_ping_s,
            send_timeout_s=settings.gateway_sse_send_timeout_s,
            page_bytes=settings.gateway_catch_up_page_bytes,
            recheck_s=settings.gateway_key_cache_s,
        )
        self.http = httpx.AsyncClient(base_url=settings.analytics_url, timeout=5.0)

    async def start(self) -> None:
        self.db.open()
        self.bridge.start(asyncio.get_running_loop())
        await asyncio.to_thread(self.fanout.start)
        await self.sessions.start()

    async def stop(self) -> None:
        self.fanout.close()
        self.bridge.close()
        self.db.close()
        await self.http.aclose()


def create_app(settings: Settings, *, settle_gc: bool = False) -> FastAPI:
    """The gateway's ASGI app. `settle_gc`: once started, settle the process's garbage
    collector (`sessionstream.adapters._gc`) — for a process that runs the gateway alone
    (`sessionstream gateway` does), not for an app mounted in someone else's."""
    gw = Gateway(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gw.start()
        if settle_gc:
            # started: what the process made so far lives as long as it does (a full
            # collection scanning it paused every request 100 ms at a time)
            settle_collector()
        try:
            yield
        finally:
            await gw.stop()

    app = FastAPI(
        title="sessionstream gateway",
        version=__version__,
        description="Sessions of AI agents over HTTP: commands and their outcomes, live "
        "events (Server-Sent Events), runs replayed from PostgreSQL, live stats. "
        "Authenticate with `Authorization: Bearer <API key>` (`sessionstream keys create`).",
        lifespan=lifespan,
        docs_url=None,  # served below, from the package, when gateway_docs is on
        redoc_url=None,
        **telemetry_config(),
    )
    app.state.gateway = gw
    _errors(app)

    @app.post(
        "/v1/sessions/{sessionId}/commands",
        response_model=OutcomeResponse,
        summary="Send a command and wait for its outcome",
        # the busiest route reads its parameters itself (FastAPI's dependency solving was
        # a third of the event loop's time at 500 POST/s); they are documented here
        openapi_extra={
            "parameters": [
                {
                    "name": "sessionId",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "minLength": 1, "maxLength": MAX_ID_CHARS},
                },
                {
                    "name": "wait",
                    "in": "query",
                    "required": False,
                    "description": "seconds to wait for the outcome at most",
                    "schema": {"type": "number", "exclusiveMinimum": 0},
                },
                {
                    "name": "Authorization",
                    "in": "header",
                    "required": True,
                    "description": "Bearer <API key>",
                    "schema": {"type": "string"},
                },
            ],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": CommandRequest.model_json_schema()}},
            },
        },
        responses={
            202: {"description": "no outcome within the wait: resend with the same commandId"},
            400: {"description": "malformed JSON, unknown type, invalid or forbidden field"},
            401: {"description": "no or invalid API key"},
            404: {"description": "a session of before namespaces that is another tenant's"},
            409: {"description": "rejected by the session (reason), or command in flight"},
            413: {"description": "body too large"},
            415: {"description": "not application/json"},
            422: {"description": "dead letter: the processor could not decide it"},
            429: {"description": "rate limited (Retry-After)"},
            502: {"description": "the session has an event this version cannot read"},
            503: {"description": "Kafka does not answer"},
        },
    )
    async def post_command(request: Request) -> Response:
        # reached only when the fast path (below) hands the request on: it answers the
        # route itself
        status, out = await command_answer(request)
        return JSONResponse(out, status_code=status)

    async def command_answer(request: Request) -> tuple[int, dict[str, Any]]:
        """The route's HTTP status and JSON body; ApiError for every refusal."""
        h = request.headers
        who = await gw.auth.principal(
            h.get("authorization"), h.get("x-api-key"), client_address(request)
        )
        local = request.path_params["sessionId"]
        if not 1 <= len(local) <= MAX_ID_CHARS or "\x00" in local:
            raise ApiError(
                400,
                "invalid_request",
                f"sessionId must be 1-{MAX_ID_CHARS} characters, without NUL",
            )
        wait = _positive(request.query_params.get("wait"), "wait")
        body = await read_json(request, settings.gateway_max_body_bytes)
        command = build_command(await gw.sessions.full_id(who.tenant_id, local), body, who)
        return await execute(command, wait)

    async def execute(command: Command, wait: float | None) -> tuple[int, dict[str, Any]]:
        """Send `command`, wait for its outcome: the HTTP status and body of every command
        route; ApiError for what the gateway cannot answer."""
        wait_s = min(wait or settings.gateway_wait_s, settings.gateway_wait_s)
        try:
            result = await gw.bridge.execute(command, wait_s)
        except InFlight as e:
            raise ApiError(409, "command_in_flight", str(e)) from e
        if isinstance(result, IncompatibleEvent):
            # the session's log holds an event a newer version wrote: the outcome is unknown
            raise ApiError(502, "incompatible_event", str(result).splitlines()[0])
        if isinstance(result, SessionstreamError):
            raise ApiError(503, "kafka_unavailable", str(result).splitlines()[0])
        if result is not None and result.reason == "tenant_mismatch":
            # only a session named before namespaces (an alias) can be another tenant's
            raise ApiError(404, "not_found", _NOT_FOUND)
        original = None
        if result is not None and result.status == "duplicate":
            with contextlib.suppress(DatabaseUnavailable):
                original = await gw.db.run(
                    events_of_command, command.session_id, command.command_id
                )
        return outcome_body(command, result, original)

    # the route above, ahead of FastAPI's layers and of Guard (its description stays in
    # the OpenAPI; it sends Guard's headers itself)
    app.add_middleware(Guard)
    app.add_middleware(CommandsFastPath, answer=command_answer)

    @app.get(
        "/v1/sessions",
        summary="The key's tenant's sessions: the latest updated, or a search a page at a time",
    )
    async def get_sessions(
        request: Request,
        who: Caller,
        status: StatusQuery = None,
        actor: Annotated[str | None, Query(description="the session's user")] = None,
        label: LabelQuery = None,
        since: SinceQuery = None,
        until: UntilQuery = None,
        order: OrderQuery = None,
        limit: LimitQuery = search.DEFAULT_LIMIT,
        cursor: CursorQuery = None,
    ) -> dict[str, Any]:
        search.check_parameters(request.query_params.multi_items(), search.SESSION_PARAMETERS)
        if search.as_before(order, status, actor, label, since, until, cursor):
            return {"sessions": await gw.db.run(views.list_sessions, who.tenant_id, limit)}
        wanted = search.search_of(
            "sessions", who.tenant_id, status, actor, label or [], since, until
        )
        return await search.answer(gw.db, gw.cursors, wanted, cursor, limit)

    @app.get("/v1/sessions/{sessionId}", summary="A session's state, as the sink last wrote it")
    async def get_session(session_id: SessionId, who: Caller) -> dict[str, Any]:
        full = await gw.sessions.full_id(who.tenant_id, session_id)
        view = await gw.db.run(views.session_view, full, who.tenant_id)
        if view is None:
            raise ApiError(404, "not_found", _NOT_FOUND)
        return view

    @app.get(
        "/v1/sessions/{sessionId}/events",
        summary="A session's events, live (Server-Sent Events), resumable with Last-Event-ID",
        response_class=Response,
        responses={200: {"content": {"text/event-stream": {}}}},
    )
    async def get_session_events(
        request: Request,
        session_id: SessionId,
        who: Caller,
        last_event_id: Annotated[str | None, Header()] = None,
        lastEventId: Annotated[
            str | None, Query(description="Last-Event-ID for clients that cannot set it")
        ] = None,
        since: Annotated[
            str | None,
            Query(
                description="start with the events appended at or after this time (ISO 8601 "
                "or epoch ms); a Last-Event-ID wins (a reconnect resumes where it was)"
            ),
        ] = None,
    ) -> Response:
        after = parse_last_event_id(last_event_id, lastEventId)
        full = await gw.sessions.full_id(who.tenant_id, session_id)
        if after is None and since is not None:
            after = await _offset_at(gw, full, _time(since, "since")) - 1
        h = request.headers
        return event_stream(
            gw.fanout,
            gw.slots,
            full,
            who.tenant_id,
            after,
            gw.stream_limits,
            still_valid=lambda: gw.auth.still_valid(h.get("authorization"), h.get("x-api-key")),
            on_close=gw.streams.open(who.key_id, who.tenant_id),
        )

    @app.get(
        "/v1/sessions/{sessionId}/history",
        summary="A session's events from the log (Kafka), by offset or by time, a page at a time",
    )
    async def get_session_history(
        session_id: SessionId,
        who: Caller,
        from_: Annotated[int | None, Query(alias="from", ge=0, description="first offset")] = None,
        to: Annotated[int | None, Query(ge=0, description="stop before this offset")] = None,
        since: Annotated[
            str | None, Query(description="first event appended at or after (ISO 8601 / ms)")
        ] = None,
        until: Annotated[
            str | None, Query(description="stop before the first appended at or after")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    ) -> dict[str, Any]:
        full = await gw.sessions.full_id(who.tenant_id, session_id)
        p = gw.fanout.partition_of(full)
        start = from_ if from_ is not None else 0
        if since is not None:
            start = max(start, await _offset_at(gw, full, _time(since, "since")))
        end = gw.fanout.position(p) if to is None else min(to, gw.fanout.position(p))
        if until is not None:
            end = min(end, await _offset_at(gw, full, _time(until, "until")))
        events: list[dict[str, Any]] = []
        pos = start
        while pos < end and len(events) < limit:
            items, pos = await gw.slots.read(
                who.tenant_id, gw.fanout, full, pos, end, settings.gateway_catch_up_page_bytes
            )
            for item in items:
                if len(events) == limit:
                    pos = item.offset
                    break
                events.append(views.event_json(item.event, item.offset))
        return {
            "sessionId": session_id,
            "partition": p,
            "events": events,
            # where the next page starts (null: the range is read to its end)
            "next": pos if pos < end else None,
        }

    @app.get("/v1/runs", summary="The key's tenant's runs, newest first, filtered, paged")
    async def get_runs(
        request: Request,
        who: Caller,
        status: StatusQuery = None,
        actor: Annotated[str | None, Query(description="who started the run")] = None,
        label: LabelQuery = None,
        since: SinceQuery = None,
        until: UntilQuery = None,
        session: Annotated[
            str | None,
            Query(min_length=1, max_length=MAX_ID_CHARS, pattern=_ID_TEXT, description="its runs"),
        ] = None,
        limit: LimitQuery = search.DEFAULT_LIMIT,
        cursor: CursorQuery = None,
    ) -> dict[str, Any]:
        search.check_parameters(request.query_params.multi_items(), search.RUN_PARAMETERS)
        full = None if session is None else await gw.sessions.full_id(who.tenant_id, session)
        wanted = search.search_of(
            "runs", who.tenant_id, status, actor, label or [], since, until, full
        )
        return await search.answer(gw.db, gw.cursors, wanted, cursor, limit)

    @app.get("/v1/runs/{runId}", summary="A run, from PostgreSQL")
    async def get_run(run_id: RunId, who: Caller) -> dict[str, Any]:
        run = await gw.db.run(views.run_view, run_id, who.tenant_id)
        if run is None:
            raise ApiError(404, "not_found", "no such run for this key's tenant")
        return run

    @app.get("/v1/runs/{runId}/events", summary="A run's events in seq order, from PostgreSQL")
    async def get_run_events(run_id: RunId, who: Caller) -> dict[str, Any]:
        events = await gw.db.run(views.run_events, run_id, who.tenant_id)
        if events is None:
            raise ApiError(404, "not_found", "no such run for this key's tenant")
        return {"runId": run_id, "events": events}

    @app.get("/v1/stats", summary="Live stats of the key's tenant (from sessionstream analytics)")
    async def get_stats(
        who: Caller, minutes: Annotated[int, Query(ge=1, le=24 * 60)] = 60
    ) -> dict[str, Any]:
        return await _stats(gw, who.tenant_id, minutes)

    add_webhook_routes(app, settings, gw.db)
    add_approval_routes(app, settings, gw.db, execute)
    add_question_routes(app, settings, gw.db, execute)
    add_queue_routes(app, gw.sessions, execute)
    add_admin_routes(app, settings, gw.sessions, gw.bridge)
    add_schedule_routes(app, gw.db, gw.sessions, execute)

    @app.get("/v1/whoami", summary="The tenant and actor of the key")
    async def whoami(who: Caller) -> dict[str, Any]:
        return {"keyId": who.key_id, "tenantId": who.tenant_id, "actor": who.actor}

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        # the two Kafka threads: without one the gateway still answers HTTP but commands
        # or streams would wait for nothing; a supervisor restarts it on this 503
        threads = {"commands": gw.bridge.alive, "events": gw.fanout.alive}
        ok = all(threads.values())
        body = {
            "ok": ok,
            "threads": threads,
            "sseClients": gw.fanout.subscribers,
            "keyQueries": gw.auth.queries,
            "commandsSent": gw.bridge.sent,
            "commandsRestarts": gw.bridge.restarts,
            "commands": gw.bridge.timings(),
        }
        return JSONResponse(body, status_code=200 if ok else 503)

    static = resources.files("sessionstream.apps.gateway") / "static"

    @app.get("/", include_in_schema=False)
    async def console() -> FileResponse:
        return FileResponse(str(static / "index.html"), headers={"Cache-Control": "no-cache"})

    if settings.gateway_docs:
        _docs(app)
    app.mount("/static", StaticFiles(directory=str(static)), name="static")
    return app


def _docs(app: FastAPI) -> None:
    """Swagger UI at ``/docs`` from the `swagger-ui-bundle` package (no CDN: the console
    keeps its key in this origin's storage), started by a script of ours (no inline one)."""
    try:
        from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-untyped]
    except ImportError as e:
        raise RuntimeError(
            "gateway_docs is on but swagger-ui-bundle is not installed "
            "(pip install 'sessionstream[docs]')"
        ) from e
    page = (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<title>sessionstream gateway API</title>"
        "<link rel='stylesheet' href='/docs/assets/swagger-ui.css'></head>"
        "<body><div id='swagger-ui'></div>"
        "<script src='/docs/assets/swagger-ui-bundle.js'></script>"
        "<script src='/static/docs.js'></script></body></html>"
    )

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(page, headers={"Content-Security-Policy": DOCS_CSP})

    app.mount("/docs/assets", StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")


def _time(raw: str, name: str) -> int:
    try:
        return parse_time(raw)
    except ValueError as e:
        raise ApiError(400, "invalid_request", f"{name}: {e}") from None


async def _offset_at(gw: Gateway, session_id: str, ts_ms: int) -> int:
    """The first offset of the session's events partition appended at or after `ts_ms`."""
    p = gw.fanout.partition_of(session_id)
    loop = asyncio.get_running_loop()
    try:
        got = await loop.run_in_executor(
            gw.fanout.catch_up_threads, offsets_for_time, gw.settings, ts_ms, [p]
        )
    except SessionstreamError as e:
        raise ApiError(503, "kafka_unavailable", str(e).splitlines()[0]) from e
    return got[p]


def _positive(raw: str | None, name: str) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ApiError(400, "invalid_request", f"{name} must be a positive number of seconds")
    return value


_STATS_PAGES = {
    "runs": "/stats/runs",
    "rejections": "/stats/rejections",
    "cancelLatency": "/stats/cancel-latency",
    "durations": "/stats/durations",
    "active": "/stats/active",
}


async def _stats(gw: Gateway, tenant: str, minutes: int) -> dict[str, Any]:
    params = {"minutes": str(minutes), "tenant": tenant}

    async def page(path: str) -> Any:
        r = await gw.http.get(path, params=params)
        r.raise_for_status()
        return r.json()

    try:
        got = await asyncio.gather(*(page(p) for p in _STATS_PAGES.values()))
    except (httpx.HTTPError, ValueError) as e:
        raise ApiError(
            503,
            "analytics_unavailable",
            f"sessionstream analytics does not answer at {gw.settings.analytics_url} ({e})",
        ) from e
    return {"tenantId": tenant, "minutes": minutes, **dict(zip(_STATS_PAGES, got, strict=True))}


def _errors(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> JSONResponse:
        return error_response(e)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        details = [
            {"loc": ".".join(str(x) for x in err["loc"]), "msg": err["msg"]}
            for err in e.errors()[:10]
        ]
        return error_response(ApiError(400, "invalid_request", "invalid request", details=details))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "http_error")
        return error_response(ApiError(e.status_code, code, str(e.detail)))

    @app.exception_handler(DatabaseUnavailable)
    async def db_down(request: Request, e: DatabaseUnavailable) -> JSONResponse:
        return error_response(database_refusal(e))
