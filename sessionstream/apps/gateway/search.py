"""Run and session search over HTTP: a request's query parameters into a search of the
key's tenant, its cursor checked, a page into JSON.

The queries are `sessionstream.runtimes.sink.search`'s; this module decides what a request
may ask and how each refusal reads (docs/http.md, "Searching runs and sessions"). The
tenant is always the key's: no parameter names one, and a cursor only ever resumes the
search it was made for, so no filter or cursor reaches another tenant's rows.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from typing import Annotated, Any, Literal

import psycopg
from fastapi import Query

from sessionstream.apps.gateway import views
from sessionstream.apps.gateway.db import Database
from sessionstream.apps.gateway.errors import ApiError
from sessionstream.runtimes.sink.cursor import CursorCodec, CursorError, Position, derive_key
from sessionstream.runtimes.sink.search import (
    DEFAULT_LIMIT,
    MAX_LABELS,
    MAX_LIMIT,
    RUN_STATUSES,
    SESSION_STATUSES,
    Filters,
    Search,
    SearchInvalid,
    find,
)
from sessionstream.settings import Settings

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LABELS",
    "MAX_LIMIT",
    "RUN_PARAMETERS",
    "SESSION_PARAMETERS",
    "CursorQuery",
    "LabelQuery",
    "LimitQuery",
    "OrderQuery",
    "SinceQuery",
    "StatusQuery",
    "UntilQuery",
    "answer",
    "as_before",
    "check_parameters",
    "cursor_codec",
    "page_json",
    "position",
    "search_of",
]

log = logging.getLogger("sessionstream.apps.gateway")

RUN_PARAMETERS = frozenset(
    {"status", "actor", "label", "since", "until", "session", "limit", "cursor"}
)
SESSION_PARAMETERS = frozenset(
    {"status", "actor", "label", "since", "until", "order", "limit", "cursor"}
)
#: given at most once (`label` is the one that repeats: every label must match)
_SINGLE = frozenset({"status", "actor", "since", "until", "session", "order", "limit", "cursor"})


# the routes' query parameters
StatusQuery = Annotated[
    str | None, Query(description="one or more statuses, comma-separated: any of them matches")
]
LabelQuery = Annotated[
    list[str] | None,
    Query(description="key:value, repeatable: every label must match", max_length=MAX_LABELS),
]
SinceQuery = Annotated[
    str | None,
    Query(description="created at or after this time (RFC 3339, no zone: UTC; or epoch ms)"),
]
UntilQuery = Annotated[str | None, Query(description="created before this time (as since)")]
LimitQuery = Annotated[int, Query(ge=1, le=MAX_LIMIT, description="rows per page")]
CursorQuery = Annotated[
    str | None,
    Query(description="nextCursor of the previous page, with the same filters"),
]


OrderQuery = Annotated[
    Literal["updated", "created"] | None,
    Query(
        description="updated: the most recently updated, one page (the default without filters "
        "or cursor); created: newest created first, paged (the default with them)"
    ),
]


def cursor_codec(settings: Settings) -> CursorCodec:
    """The codec of `gateway_cursor_secret`, or of a key drawn now (said once, at start)."""
    secret = settings.gateway_cursor_secret
    if secret is None:
        log.warning(
            "gateway: SESSIONSTREAM_GATEWAY_CURSOR_SECRET is not set: search cursors are "
            "signed with a key of this process only (they end with it, and another "
            "gateway refuses them)"
        )
        return CursorCodec(secrets.token_bytes(32))
    return CursorCodec(derive_key(secret.get_secret_value()))


def check_parameters(items: Iterable[tuple[str, str]], known: frozenset[str]) -> None:
    """A misspelt filter is refused, not ignored (ignored, it would widen the search)."""
    seen: set[str] = set()
    for name, _value in items:
        if name not in known:
            raise ApiError(
                400,
                "invalid_request",
                f"unknown query parameter {name[:40]!r}; known: {', '.join(sorted(known))}",
            )
        if name in seen and name in _SINGLE:
            hint = " (several statuses: one parameter, comma-separated)" if name == "status" else ""
            raise ApiError(400, "invalid_request", f"{name} is given twice{hint}")
        seen.add(name)


def search_of(
    kind: str,
    tenant_id: str,
    status: str | None,
    actor: str | None,
    labels: list[str],
    since: str | None,
    until: str | None,
    session_id: str | None = None,
) -> Search:
    """The search a request asks for, of the key's tenant; 400 `invalid_request` naming
    the first filter out of bounds."""
    try:
        filters = Filters.of(
            status=status,
            actor=actor,
            labels=labels,
            since=since,
            until=until,
            session_id=session_id,
            statuses=RUN_STATUSES if kind == "runs" else SESSION_STATUSES,
        )
    except SearchInvalid as e:
        raise ApiError(400, "invalid_request", str(e)) from None
    return Search("runs" if kind == "runs" else "sessions", tenant_id, filters)


def position(codec: CursorCodec, search: Search, cursor: str | None) -> Position | None:
    """Where the page starts: None for the first; 400 `invalid_cursor` for a cursor this
    gateway did not make (altered, cut, another key's), 400 `cursor_mismatch` for one of
    another search (other filters, another tenant)."""
    if cursor is None:
        return None
    try:
        return codec.decode(cursor, search.digest())
    except CursorError as e:
        hint = (
            "; send the filters it was made with, or start again without a cursor"
            if e.code == "cursor_mismatch"
            else "; start again without a cursor"
        )
        raise ApiError(400, e.code, f"{e}{hint}") from None


def as_before(order: str | None, *filters: object) -> bool:
    """Whether `GET /v1/sessions` answers as it did before search existed: the most
    recently updated sessions, one page (no filter, no cursor, no `order=created`)."""
    filtered = any(f is not None for f in filters)
    if order == "updated" and filtered:
        raise ApiError(
            400,
            "invalid_request",
            "order=updated is one page of the most recently updated sessions, without filters "
            "or cursor: search with order=created",
        )
    return order == "updated" or (order is None and not filtered)


async def answer(
    db: Database, codec: CursorCodec, search: Search, cursor: str | None, limit: int
) -> dict[str, Any]:
    """The page of `search` that `cursor` points at (the first without one)."""
    return await db.run(page_json, codec, search, position(codec, search, cursor), limit)


def page_json(
    conn: psycopg.Connection[Any],
    codec: CursorCodec,
    search: Search,
    after: Position | None,
    limit: int,
) -> dict[str, Any]:
    """One page as the routes answer it: ``{"runs" | "sessions": [...], "nextCursor"}``."""
    page = find(conn, search, after, limit)
    if search.kind == "runs":
        items = [views.run_json(r) for r in page.rows]
    else:
        items = [views.session_json(r, search.tenant_id or "") for r in page.rows]
    return {
        search.kind: items,
        "nextCursor": None if page.next is None else codec.encode(page.next, search.digest()),
    }
