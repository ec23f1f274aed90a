"""The search's SQL, from the spec: every value a caller gives is a parameter, never part of
the SQL text (an attacker's `status='; drop table ...` is refused, an attacker's actor or
label is a parameter); filters out of bounds are refused naming the filter; pages are keyset
pages, newest first, never OFFSET; the tenant is always a condition when there is one."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from sessionstream.runtimes.sink.cursor import Position
from sessionstream.runtimes.sink.search import (
    MAX_LABELS,
    RUN_STATUSES,
    SESSION_STATUSES,
    Filters,
    Search,
    SearchInvalid,
    find,
    search_query,
)

EVIL = "'; drop table agent_runs; --"
PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def _check_parameters_only(sql: str, params: dict[str, Any], *values: str) -> None:
    """Every placeholder has its parameter and every parameter its placeholder; no value
    appears in the SQL text, and no `%` other than placeholders (psycopg would read it)."""
    assert set(PLACEHOLDER.findall(sql)) == set(params), sql
    assert "%" not in PLACEHOLDER.sub("", sql), sql
    for v in values:
        assert v not in sql, (v, sql)


def _values(params: dict[str, Any]) -> list[Any]:
    out = []
    for v in params.values():
        out += v if isinstance(v, list) else [v.obj if isinstance(v, Jsonb) else v]
    return out


@pytest.mark.parametrize("kind", ["runs", "sessions"])
def test_every_filter_travels_as_a_parameter(kind: str) -> None:
    session = None if kind == "sessions" else f"acme:{EVIL}"
    f = Filters.of(
        actor=EVIL,
        labels=[f"{EVIL}:{EVIL}", "team:x%s)y"],
        since="2026-01-01T00:00:00Z",
        until="2026-02-01T00:00:00+01:00",
        session_id=session,
    )
    tenant = f"acme{EVIL}"
    sql, params = search_query(Search(kind, tenant, f), Position(5, EVIL), 51)  # type: ignore[arg-type]
    _check_parameters_only(sql, params, EVIL, "x%s)y", "2026")
    values = _values(params)
    assert tenant in values and EVIL in values and 51 in values
    assert {EVIL: EVIL, "team": "x%s)y"} in values  # the labels, one containment document


@pytest.mark.parametrize("status", [EVIL, "running'; --", "running,completed'", "RUNNING", " "])
def test_a_status_that_is_not_one_is_refused_naming_the_filter(status: str) -> None:
    with pytest.raises(SearchInvalid) as e:
        Filters.of(status=status)
    assert e.value.field == "status"


def test_statuses_are_comma_separated_any_of_them_matching() -> None:
    f = Filters.of(status="failed, timed_out,failed")
    assert f.statuses == ("failed", "timed_out")
    sql, params = search_query(Search("runs", "acme", f), None, 10)
    _check_parameters_only(sql, params)
    assert params["statuses"] == ["failed", "timed_out"]
    for s in RUN_STATUSES:
        assert Filters.of(status=s).statuses == (s,)


def test_a_session_status_is_its_active_runs_or_idle() -> None:
    for s in SESSION_STATUSES:
        Filters.of(status=s, statuses=SESSION_STATUSES)
    for terminal in ("completed", "cancelled", "failed", "timed_out"):
        with pytest.raises(SearchInvalid):
            Filters.of(status=terminal, statuses=SESSION_STATUSES)
    idle = search_query(
        Search("sessions", "a", Filters.of(status="idle", statuses=SESSION_STATUSES)), None, 5
    )
    assert "s.active_run_id is null" in idle[0] and "statuses" not in idle[1]
    both = search_query(
        Search("sessions", "a", Filters.of(status="idle,running", statuses=SESSION_STATUSES)),
        None,
        5,
    )
    _check_parameters_only(*both)
    assert both[1]["statuses"] == ["running"]


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"labels": ["no-colon"]}, "label"),
        ({"labels": [":value"]}, "label"),
        ({"labels": ["k" * 129 + ":v"]}, "label"),
        ({"labels": ["k:" + "v" * 513]}, "label"),
        ({"labels": ["k:\x00"]}, "label"),
        ({"labels": [f"k{i}:v" for i in range(MAX_LABELS + 1)]}, "label"),
        ({"actor": ""}, "actor"),
        ({"actor": "a" * 201}, "actor"),
        ({"actor": "a\x00b"}, "actor"),
        ({"since": "yesterday"}, "since"),
        ({"since": "99999999999999999999"}, "since"),
        ({"until": "2026-13-01"}, "until"),
        ({"since": "2000", "until": "1000"}, "until"),
        ({"since": "1000", "until": "1000"}, "until"),
        ({"session_id": ""}, "session"),
    ],
)
def test_filters_out_of_bounds_are_refused_naming_the_filter(
    kw: dict[str, Any], field: str
) -> None:
    with pytest.raises(SearchInvalid) as e:
        Filters.of(**kw)
    assert e.value.field == field


def test_times_are_rfc3339_or_epoch_ms_since_included_until_excluded() -> None:
    f = Filters.of(since="2026-12-05T10:00:00Z", until="1796522035881")
    assert f.since_ms == 1796464800000 and f.until_ms == 1796522035881
    assert Filters.of(since="2026-12-05T11:00:00+01:00").since_ms == f.since_ms
    assert Filters.of(since="2026-12-05T10:00:00").since_ms == f.since_ms  # no zone: UTC
    sql, _ = search_query(Search("runs", "a", f), None, 5)
    assert "created_at >= %(since)s" in sql and "created_at < %(until)s" in sql


def test_labels_must_all_match_and_a_key_asked_twice_matches_nothing() -> None:
    one = search_query(Search("runs", "a", Filters.of(labels=["env:prod", "team:core:x"])), None, 5)
    assert one[1]["labels"].obj == {"env": "prod", "team": "core:x"}  # split at the first ':'
    clash = search_query(Search("runs", "a", Filters.of(labels=["env:prod", "env:dev"])), None, 5)
    assert " false " in f" {clash[0]} " and "labels" not in clash[1]
    for kind in ("runs", "sessions"):
        sql, _ = search_query(Search(kind, "a", Filters.of(labels=["env:prod"])), None, 5)  # type: ignore[arg-type]
        assert "labels @> %(labels)s" in sql


@pytest.mark.parametrize("kind", ["runs", "sessions"])
def test_pages_are_keyset_pages_newest_first_never_offset(kind: str) -> None:
    key = "run_id" if kind == "runs" else "session_id"
    for f in (Filters(), Filters.of(status="running", actor="x", labels=["a:b"])):
        first, p1 = search_query(Search(kind, "acme", f), None, 51)  # type: ignore[arg-type]
        later, p2 = search_query(Search(kind, "acme", f), Position(7, "id-7"), 51)  # type: ignore[arg-type]
        assert "offset" not in first.lower() and "offset" not in later.lower()
        assert f"created_at desc, {kind[0]}.{key} desc limit %(limit)s" in later
        assert f"({kind[0]}.created_at, {kind[0]}.{key}) < (%(after_at)s, %(after_id)s)" in later
        assert "after_at" not in p1 and p2["after_id"] == "id-7"


@pytest.mark.parametrize("kind", ["runs", "sessions"])
def test_the_tenant_is_a_condition_of_every_shape(kind: str) -> None:
    shapes = [
        Filters(),
        Filters.of(status="running"),
        Filters.of(status="running,cancelling"),
        Filters.of(actor="a"),
        Filters.of(labels=["a:b"]),
        Filters.of(since="0", until="1"),
    ]
    for f in shapes:
        sql, params = search_query(Search(kind, "acme", f), None, 5)  # type: ignore[arg-type]
        t = kind[0]
        assert f"{t}.tenant_id = %(tenant)s" in sql and params["tenant"] == "acme"
        if f.statuses and kind == "runs":  # each status's own scan is the tenant's too
            inner = sql[sql.index("lateral") :]
            assert "r.tenant_id = %(tenant)s" in inner


def test_an_operators_search_of_every_tenant_has_no_tenant_condition() -> None:
    sql, params = search_query(Search("runs", None, Filters()), None, 5)
    assert "tenant" not in params and "where true" in sql


@given(
    actor=st.text(min_size=1, max_size=200).filter(lambda s: "\x00" not in s),
    label=st.text(min_size=1, max_size=60).filter(lambda s: "\x00" not in s and ":" not in s),
)
def test_any_actor_and_label_text_stays_out_of_the_sql(actor: str, label: str) -> None:
    f = Filters.of(actor=actor, labels=[f"{label}:{actor}"])
    for kind in ("runs", "sessions"):
        sql, params = search_query(Search(kind, "acme", f), None, 5)  # type: ignore[arg-type]
        assert set(PLACEHOLDER.findall(sql)) == set(params)
        assert params["actor"] == actor and params["labels"].obj == {label: actor}


def test_a_limit_out_of_bounds_is_refused_before_any_query() -> None:
    for limit in (0, 501):
        with pytest.raises(SearchInvalid) as e:
            find(None, Search("runs", "a"), None, limit)  # type: ignore[arg-type]
        assert e.value.field == "limit"
