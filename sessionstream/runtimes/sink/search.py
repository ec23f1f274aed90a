"""Run and session search over the projection: filters, one SQL shape per search, keyset
pages.

Every value a caller gives travels as a query parameter; the SQL text is put together
only from the constant fragments below, chosen by which filters are present. Pages are
keyset pages, newest first: ``(created_at, id) < (the last row's)``, never an offset, so
page 1,000 costs what page 1 does and rows written meanwhile (newer, so before the
cursor) neither repeat nor shift a page. Migration 0011 holds the indexes each shape
reads: ``(tenant_id, created_at desc, id desc)``, with ``status`` or the actor between,
and a GIN index on the runs' ``labels``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import psycopg
from psycopg.types.json import Jsonb

from sessionstream.errors import SessionstreamError
from sessionstream.runtimes.sink.cursor import Position
from sessionstream.schemas.sessions import NAMESPACE_SEP

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LABELS",
    "MAX_LABEL_KEY_CHARS",
    "MAX_LABEL_VALUE_CHARS",
    "MAX_LIMIT",
    "MAX_TEXT_CHARS",
    "RUN_COLUMNS",
    "RUN_STATUSES",
    "SESSION_COLUMNS",
    "SESSION_STATUSES",
    "Filters",
    "Page",
    "Search",
    "SearchInvalid",
    "find",
    "parse_label",
    "parse_statuses",
    "parse_time_bound",
    "search_query",
]

RUN_STATUSES = (
    "running",
    "compacting",
    "cancelling",
    "completed",
    "cancelled",
    "failed",
    "timed_out",
)
#: a session's status is its active run's, or idle without one
SESSION_STATUSES = ("idle", "running", "compacting", "cancelling")
DEFAULT_LIMIT = 50
MAX_LIMIT = 500
#: bounds of the filters (a run's own labels are bounded where they are written)
MAX_TEXT_CHARS = 200
MAX_LABELS = 16
MAX_LABEL_KEY_CHARS = 128
MAX_LABEL_VALUE_CHARS = 512

RUN_COLUMNS = (
    "run_id",
    "session_id",
    "tenant_id",
    "status",
    "generation",
    "lease_owner",
    "lease_expires_at",
    "timeout_at",
    "cancel_requested_at",
    "terminal_status",
    "terminal_at",
    "prompt",
    "last_seq",
    "created_at",
    "updated_at",
    "started_by",
    "cancelled_by",
    "retryable",
    "retry_of",
    "labels",
    # the prompt's typed input (jsonb), shown with the run
    "input",
)
SESSION_COLUMNS = (
    "session_id",
    "tenant_id",
    "active_run_id",
    "created_at",
    "updated_at",
    "user_id",
    "status",  # the active run's (null: idle)
)
_RUN_AT = RUN_COLUMNS.index("created_at")
_SESSION_AT = SESSION_COLUMNS.index("created_at")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


class SearchInvalid(SessionstreamError):
    """A filter out of its bounds; `field` names the query parameter."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def _text(value: str, name: str, most: int = MAX_TEXT_CHARS) -> str:
    if not 1 <= len(value) <= most or "\x00" in value:
        raise SearchInvalid(name, f"must be 1-{most} characters, without NUL")
    return value


def parse_statuses(text: str, allowed: tuple[str, ...] = RUN_STATUSES) -> tuple[str, ...]:
    """``running,cancelling`` -> the statuses, sorted and once each (any of them matches)."""
    got = {s.strip() for s in text.split(",")}
    unknown = sorted(got - set(allowed))
    if unknown:
        shown = ", ".join(repr(u[:40]) for u in unknown[:3])
        raise SearchInvalid(
            "status",
            f"{shown} is no status; give one or more of {', '.join(allowed)}, comma-separated",
        )
    return tuple(sorted(got))


def parse_label(text: str) -> tuple[str, str]:
    """``key:value`` (split at the first ``:``; the value may hold more)."""
    key, sep, value = text.partition(":")
    if not sep or not key:
        raise SearchInvalid("label", f"{text[:60]!r} is not key:value")
    _text(key, "label", MAX_LABEL_KEY_CHARS)
    if len(value) > MAX_LABEL_VALUE_CHARS or "\x00" in value:
        raise SearchInvalid(
            "label", f"a value is at most {MAX_LABEL_VALUE_CHARS} characters, without NUL"
        )
    return key, value


def parse_time_bound(text: str, name: str) -> int:
    """Epoch milliseconds of an RFC 3339 / ISO 8601 time (no zone: UTC) or of epoch ms."""
    from sessionstream.runtimes.sink.replay import parse_time

    try:
        ms = parse_time(text[:64])
        _EPOCH + timedelta(milliseconds=ms)  # PostgreSQL's range is wider: Python's binds
    except (ValueError, OverflowError) as e:
        raise SearchInvalid(name, str(e) if isinstance(e, ValueError) else "out of range") from None
    return ms


@dataclass(frozen=True)
class Filters:
    """What a search keeps, normalized (so equal searches have equal digests)."""

    statuses: tuple[str, ...] = ()
    actor: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    since_ms: int | None = None
    until_ms: int | None = None
    #: runs only: the session's full id
    session_id: str | None = None

    @classmethod
    def of(
        cls,
        *,
        status: str | None = None,
        actor: str | None = None,
        labels: list[str] | tuple[str, ...] = (),
        since: str | None = None,
        until: str | None = None,
        session_id: str | None = None,
        statuses: tuple[str, ...] = RUN_STATUSES,
    ) -> Filters:
        """The filters of a request's raw values; `SearchInvalid` names the first bad one."""
        if len(labels) > MAX_LABELS:
            raise SearchInvalid("label", f"at most {MAX_LABELS} labels")
        since_ms = None if since is None else parse_time_bound(since, "since")
        until_ms = None if until is None else parse_time_bound(until, "until")
        if since_ms is not None and until_ms is not None and since_ms >= until_ms:
            raise SearchInvalid("until", "must be after since")
        return cls(
            statuses=() if status is None else parse_statuses(status, statuses),
            actor=None if actor is None else _text(actor, "actor"),
            labels=tuple(sorted({parse_label(x) for x in labels})),
            since_ms=since_ms,
            until_ms=until_ms,
            session_id=None if session_id is None else _text(session_id, "session"),
        )

    @property
    def any(self) -> bool:
        return self != Filters()


@dataclass(frozen=True)
class Search:
    """One search: of runs or sessions, of one tenant (None: every tenant, for operators)."""

    kind: Literal["runs", "sessions"]
    tenant_id: str | None
    filters: Filters = field(default_factory=Filters)

    def digest(self) -> str:
        """What a cursor of this search carries: the tenant and every filter, hashed."""
        f = self.filters
        canonical = json.dumps(
            [
                self.kind,
                self.tenant_id,
                f.statuses,
                f.actor,
                f.labels,
                f.since_ms,
                f.until_ms,
                f.session_id,
            ],
            separators=(",", ":"),
        )
        return hashlib.sha256(canonical.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Page:
    rows: list[tuple[Any, ...]]
    #: where the next page starts (None: this was the last)
    next: Position | None


def _at(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


def _us(t: datetime) -> int:
    return (t - _EPOCH) // _US


def _conditions(
    search: Search, after: Position | None, t: str, key: str
) -> tuple[list[str], dict[str, Any]]:
    """The WHERE terms shared by both kinds, on table alias `t` whose id column is `key`."""
    f = search.filters
    terms: list[str] = []
    params: dict[str, Any] = {}
    if search.tenant_id is not None:
        terms.append(f"{t}.tenant_id = %(tenant)s")
        params["tenant"] = search.tenant_id
    if f.since_ms is not None:
        terms.append(f"{t}.created_at >= %(since)s")
        params["since"] = _at(f.since_ms)
    if f.until_ms is not None:
        terms.append(f"{t}.created_at < %(until)s")
        params["until"] = _at(f.until_ms)
    if after is not None:
        terms.append(f"({t}.created_at, {t}.{key}) < (%(after_at)s, %(after_id)s)")
        params["after_at"] = _EPOCH + after.at_us * _US
        params["after_id"] = after.id
    return terms, params


def _labels(f: Filters) -> dict[str, str] | None:
    """The labels as one containment document; None when two values of one key are asked
    (every label must match: no run has both)."""
    out: dict[str, str] = {}
    for k, v in f.labels:
        if out.setdefault(k, v) != v:
            return None
    return out


def _runs_query(search: Search, after: Position | None, limit: int) -> tuple[str, dict[str, Any]]:
    f = search.filters
    terms, params = _conditions(search, after, "r", "run_id")
    if f.actor is not None:
        terms.append("r.started_by = %(actor)s")
        params["actor"] = f.actor
    if f.session_id is not None:
        terms.append("r.session_id = %(session)s")
        params["session"] = f.session_id
    if f.labels:
        labels = _labels(f)
        if labels is None:
            terms.append("false")
        else:
            terms.append("r.labels @> %(labels)s")
            params["labels"] = Jsonb(labels)
    params["limit"] = limit
    cols = ", ".join(f"r.{c}" for c in RUN_COLUMNS)
    order = "order by r.created_at desc, r.run_id desc"
    if not f.statuses:
        where = " and ".join(terms) or "true"
        return f"select {cols} from agent_runs r where {where} {order} limit %(limit)s", params
    # one ordered index scan per status, each at most a page, merged: a page of any mix of
    # statuses reads at most (statuses x page) index entries
    params["statuses"] = list(f.statuses)
    where = " and ".join(["r.status = st.status", *terms])
    return (
        f"select {cols} from unnest(%(statuses)s::text[]) as st(status)"
        f" cross join lateral (select {cols} from agent_runs r where {where} {order}"
        f" limit %(limit)s) r {order} limit %(limit)s",
        params,
    )


def _sessions_query(
    search: Search, after: Position | None, limit: int
) -> tuple[str, dict[str, Any]]:
    f = search.filters
    terms, params = _conditions(search, after, "s", "session_id")
    if search.tenant_id is not None:
        # the sessions the gateway reaches: in the tenant's namespace, or aliased (0006)
        terms.append(
            "(starts_with(s.session_id, %(prefix)s) or exists (select 1 from session_aliases a"
            " where a.tenant_id = s.tenant_id and a.session_id = s.session_id))"
        )
        params["prefix"] = f"{search.tenant_id}{NAMESPACE_SEP}"
    if f.actor is not None:
        terms.append("s.user_id = %(actor)s")
        params["actor"] = f.actor
    if f.statuses == ("idle",):
        terms.append("s.active_run_id is null")
    elif f.statuses:
        # written per case so that the common one (idle) needs no join to filter, and the
        # rare ones (an active run) walk only the sessions that have one (a partial index)
        active = "s.active_run_id is not null and r.status = any(%(statuses)s::text[])"
        terms.append(f"(s.active_run_id is null or ({active}))" if "idle" in f.statuses else active)
        params["statuses"] = [x for x in f.statuses if x != "idle"]
    if f.labels:
        labels = _labels(f)
        if labels is None:
            terms.append("false")
        else:
            terms.append(
                "exists (select 1 from agent_runs l where l.session_id = s.session_id"
                " and l.labels @> %(labels)s)"
            )
            params["labels"] = Jsonb(labels)
    params["limit"] = limit
    where = " and ".join(terms) or "true"
    return (
        "select s.session_id, s.tenant_id, s.active_run_id, s.created_at, s.updated_at,"
        " s.user_id, r.status from agent_sessions s"
        " left join agent_runs r on r.run_id = s.active_run_id"
        f" where {where} order by s.created_at desc, s.session_id desc limit %(limit)s",
        params,
    )


def search_query(search: Search, after: Position | None, limit: int) -> tuple[str, dict[str, Any]]:
    """The SQL and its parameters of one page (`limit` rows at most)."""
    if search.kind == "runs":
        return _runs_query(search, after, limit)
    return _sessions_query(search, after, limit)


def find(conn: psycopg.Connection[Any], search: Search, after: Position | None, limit: int) -> Page:
    """One page of `search` after `after` (None: the first), newest first. Rows are
    `RUN_COLUMNS` or `SESSION_COLUMNS`."""
    if not 1 <= limit <= MAX_LIMIT:
        raise SearchInvalid("limit", f"must be 1-{MAX_LIMIT}")
    # one row more than the page tells whether there is a next one without asking again
    sql, params = search_query(search, after, limit + 1)
    rows = conn.execute(sql, params).fetchall()
    conn.rollback()
    page, more = rows[:limit], len(rows) > limit
    if not more:
        return Page(page, None)
    last = page[-1]
    at = last[_RUN_AT] if search.kind == "runs" else last[_SESSION_AT]
    return Page(page, Position(_us(at), str(last[0])))
