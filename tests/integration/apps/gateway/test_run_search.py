"""Run search over HTTP against a real gateway, processor, sink and PostgreSQL (one isolated
world for the module), written from the spec of run search and labels:

- `GET /v1/runs?status=&actor=&label=&since=&until=&session=&cursor=`, newest first, and the
  same filters on `GET /v1/sessions`; each filter finds exactly its rows;
- keyset pages: walking them returns every row once, in order, with no duplicates, while
  rows are inserted between pages;
- the key's tenant only: another tenant's key sees none of the rows, whatever the filters,
  and cannot resume their cursor;
- test it like an attacker: a forged, truncated or other-filters cursor is 400 with a clear
  code, never a 500 and never another tenant's rows; an attacker's filter values are a 400
  or a parameter;
- labels: the runs' `labels` column (written here directly in SQL; the sink fills it from
  `run.started`, test_queue_and_labels.py), `label=key:value` repeatable, every one must
  match;
- migration 0011 applies on a fresh schema and on an existing projection, and the sink's
  later writes of a run keep its labels.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb
from pydantic import SecretStr

from sessionstream.adapters.postgres import migrate as migrate_module
from sessionstream.core.decider import apply
from sessionstream.runtimes.sink.projection import Projection
from sessionstream.runtimes.sink.writer import RUN_COLS, RUN_TIMES, PendingEvent, ts, write_batch
from sessionstream.schemas.commands import Command
from sessionstream.settings import Settings
from tests.integration.conftest import WorldFactory
from tests.integration.gateway_world import GatewayWorld, gateway_world

pytestmark = pytest.mark.integration

ACTIVE = ("running", "compacting", "cancelling")
T0 = datetime(2026, 3, 1, tzinfo=UTC)
EVIL = "'; drop table agent_runs; --"


@pytest.fixture(scope="module")
def world(settings: Settings) -> Iterator[GatewayWorld]:
    w = gateway_world(
        settings,
        "search",
        gateway_cursor_secret=SecretStr("it-search-" + "s" * 32),
        # pages are walked quickly: the key's bucket is not what is tested here
        gateway_rate_per_s=1000.0,
        gateway_rate_burst=1000,
    )
    try:
        yield w.start()
    finally:
        w.stop()


@dataclass
class Run:
    run_id: str
    session: str  # the tenant's own id
    at: datetime
    status: str = "completed"
    actor: str = "alice"
    labels: dict[str, str] | None = None


@dataclass
class Tenant:
    """A tenant of its own per test (so the module's tests never see each other's rows),
    its key, and the runs written for it, directly into the projection's tables."""

    w: GatewayWorld
    name: str
    actor: str = "alice"
    runs: list[Run] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.key = self.w.key(self.name, self.actor)
        self.http = self.w.client(self.key)

    def add(self, *runs: Run) -> None:
        with self.w.conn() as conn:
            for r in runs:
                _insert(conn, self.name, r)
        self.runs += runs

    def get(self, path: str, **params: Any) -> Any:
        r = self.http.get(path, params=params)
        assert r.status_code == 200, (path, params, r.status_code, r.text)
        return r.json()

    def refused(self, path: str, **params: Any) -> dict[str, Any]:
        r = self.http.get(path, params=params)
        assert r.status_code == 400, (path, params, r.status_code, r.text)
        error: dict[str, Any] = r.json()["error"]
        return error

    def ids(self, **params: Any) -> list[str]:
        return [r["runId"] for r in self.get("/v1/runs", **params)["runs"]]


def _insert(conn: psycopg.Connection[Any], tenant: str, r: Run) -> None:
    sid = f"{tenant}:{r.session}"
    active = r.status in ACTIVE
    conn.execute(
        "insert into agent_sessions (session_id, tenant_id, active_run_id, created_at,"
        " updated_at, user_id) values (%s, %s, %s, %s, %s, %s) on conflict (session_id) do"
        " update set active_run_id = coalesce(excluded.active_run_id,"
        " agent_sessions.active_run_id), created_at = least(agent_sessions.created_at,"
        " excluded.created_at), updated_at = greatest(agent_sessions.updated_at,"
        " excluded.updated_at)",
        (sid, tenant, r.run_id if active else None, r.at, r.at, r.actor),
    )
    conn.execute(
        "insert into agent_runs (run_id, session_id, tenant_id, status, generation, timeout_at,"
        " terminal_status, terminal_at, prompt, last_seq, created_at, updated_at, started_by,"
        " labels) values (%s, %s, %s, %s, 1, %s, %s, %s, %s, 1, %s, %s, %s, %s)",
        (
            r.run_id,
            sid,
            tenant,
            r.status,
            r.at + timedelta(minutes=10),
            None if active else r.status,
            None if active else r.at + timedelta(seconds=30),
            f"prompt of {r.run_id}",
            r.at,
            r.at,
            r.actor,
            None if r.labels is None else Jsonb(r.labels),
        ),
    )


def _rid() -> str:
    return str(uuid.uuid4())


def _newest_first(runs: list[Run]) -> list[str]:
    return [r.run_id for r in sorted(runs, key=lambda r: (r.at, r.run_id), reverse=True)]


def _tenant(w: GatewayWorld, tag: str, actor: str = "alice") -> Tenant:
    return Tenant(w, f"{tag}-{uuid.uuid4().hex[:6]}", actor)


def _walk(
    t: Tenant, path: str, items: str, limit: int, between: Any = None, **params: Any
) -> list[str]:
    """Every page of a search, following nextCursor; `between()` runs after each page."""
    got: list[str] = []
    cursor = None
    for _ in range(100):
        page = t.get(path, limit=limit, **params, **({"cursor": cursor} if cursor else {}))
        key = "runId" if items == "runs" else "sessionId"
        got += [x[key] for x in page[items]]
        assert len(page[items]) <= limit
        cursor = page["nextCursor"]
        if cursor is None:
            return got
        if between:
            between()
    raise AssertionError("no last page after 100")


def _seed(t: Tenant) -> list[Run]:
    runs = [
        Run(
            _rid(),
            "s1",
            T0 + timedelta(minutes=1),
            "completed",
            "alice",
            {"env": "prod", "team": "core"},
        ),
        Run(_rid(), "s1", T0 + timedelta(minutes=2), "failed", "alice", {"env": "prod"}),
        Run(_rid(), "s1", T0 + timedelta(minutes=3), "running", "alice", {"env": "dev"}),
        Run(_rid(), "s2", T0 + timedelta(minutes=4), "cancelled", "bob", {"team": "core"}),
        Run(_rid(), "s2", T0 + timedelta(minutes=5), "timed_out", "bob"),
        Run(
            _rid(),
            "s2",
            T0 + timedelta(minutes=6),
            "failed",
            "bob",
            {"env": "prod", "team": "core"},
        ),
        Run(_rid(), "s3", T0 + timedelta(days=1), "cancelling", "carol", {"env": "prod:eu"}),
        Run(_rid(), "s4", T0 + timedelta(days=2), "compacting", "alice"),
        Run(_rid(), "s5", T0 + timedelta(days=3), "completed", "carol"),
    ]
    t.add(*runs)
    return runs


def test_each_run_filter_finds_exactly_its_runs_newest_first(world: GatewayWorld) -> None:
    t = _tenant(world, "filters")
    runs = _seed(t)

    def expect(keep: Any) -> list[str]:
        return _newest_first([r for r in runs if keep(r)])

    assert t.ids() == expect(lambda r: True)
    assert t.ids(status="failed") == expect(lambda r: r.status == "failed")
    assert t.ids(status="failed,timed_out,running") == expect(
        lambda r: r.status in ("failed", "timed_out", "running")
    )
    for status in ("running", "compacting", "cancelling", "completed", "cancelled", "timed_out"):
        assert t.ids(status=status) == expect(lambda r, s=status: r.status == s)
    assert t.ids(actor="bob") == expect(lambda r: r.actor == "bob")
    assert t.ids(actor="nobody") == []
    assert t.ids(label="env:prod") == expect(lambda r: (r.labels or {}).get("env") == "prod")
    assert t.ids(label="env:prod:eu") == expect(lambda r: (r.labels or {}).get("env") == "prod:eu")
    both = expect(
        lambda r: (r.labels or {}).get("env") == "prod" and (r.labels or {}).get("team") == "core"
    )
    assert t.ids(label=["env:prod", "team:core"]) == both and len(both) == 2
    assert t.ids(label=["env:prod", "env:dev"]) == []  # every label must match
    assert t.ids(label="env:nowhere") == []
    since, until = T0 + timedelta(minutes=3), T0 + timedelta(days=2)
    assert t.ids(since=since.isoformat()) == expect(lambda r: r.at >= since)
    assert t.ids(until=until.isoformat().replace("+00:00", "Z")) == expect(lambda r: r.at < until)
    ms = lambda d: str(int(d.timestamp() * 1000))  # noqa: E731
    assert t.ids(since=ms(since), until=ms(until)) == expect(lambda r: since <= r.at < until)
    assert t.ids(session="s2") == expect(lambda r: r.session == "s2")
    assert t.ids(session="s-none") == []
    assert t.ids(status="failed", actor="bob", label="team:core", session="s2") == expect(
        lambda r: r.status == "failed" and r.actor == "bob" and r.session == "s2"
    )
    # a run as GET /v1/runs/{id} shows it, with its labels, in the tenant's own ids
    page = t.get("/v1/runs", label="team:core", status="completed")
    (run,) = page["runs"]
    assert run["labels"] == {"env": "prod", "team": "core"} and run["sessionId"] == "s1"
    assert run["tenantId"] == t.name and run["startedBy"] == "alice" and page["nextCursor"] is None
    one = t.get(f"/v1/runs/{run['runId']}")
    assert {k: one[k] for k in run} == run


def test_pages_give_every_run_once_in_order_while_runs_are_inserted(world: GatewayWorld) -> None:
    t = _tenant(world, "pages")
    runs = [Run(_rid(), f"s{i % 4}", T0 + timedelta(minutes=i // 3)) for i in range(40)]
    # three runs per minute: runs of one time straddle page boundaries (the id orders them)
    t.add(*runs)
    inserted: list[Run] = []

    def insert_newer() -> None:
        new = [Run(_rid(), "s-new", datetime.now(UTC) + timedelta(seconds=i)) for i in range(2)]
        t.add(*new)
        inserted.extend(new)

    walked = _walk(t, "/v1/runs", "runs", 7, between=insert_newer)
    assert walked == _newest_first(runs)
    assert len(set(walked)) == len(walked) == 40
    assert len(inserted) == 2 * 5  # 6 pages, 5 gaps
    # the newer runs lead the next walk, once each
    again = _walk(t, "/v1/runs", "runs", 13)
    assert again == _newest_first(runs + inserted)
    # the same with a filter, and the largest page
    failed = [Run(_rid(), "s9", T0 - timedelta(hours=i), "failed") for i in range(11)]
    t.add(*failed)
    assert _walk(t, "/v1/runs", "runs", 4, between=insert_newer, status="failed,cancelled") == (
        _newest_first(failed)
    )
    assert t.get("/v1/runs", limit=500)["nextCursor"] is None


def test_sessions_search_filters_and_pages(world: GatewayWorld) -> None:
    t = _tenant(world, "sessions")
    runs = _seed(t)
    # s1 (running), s3 (cancelling), s4 (compacting) have an active run; s2, s5 are idle
    sessions = t.get("/v1/sessions", order="created")
    created = {s: min(r.at for r in runs if r.session == s) for s in {r.session for r in runs}}
    newest = sorted(created, key=lambda s: (created[s], f"{t.name}:{s}"), reverse=True)
    assert [s["sessionId"] for s in sessions["sessions"]] == newest
    assert sessions["nextCursor"] is None

    def sids(**params: Any) -> list[str]:
        return [s["sessionId"] for s in t.get("/v1/sessions", **params)["sessions"]]

    assert sids(status="idle") == [s for s in newest if s in ("s2", "s5")]
    assert sids(status="running") == ["s1"]
    assert sids(status="cancelling,compacting") == [s for s in newest if s in ("s3", "s4")]
    assert sids(status="idle,running") == [s for s in newest if s in ("s1", "s2", "s5")]
    assert sids(actor="bob") == ["s2"]  # the session's user: its first run's actor
    assert sids(label="env:prod") == [s for s in newest if s in ("s1", "s2")]
    assert sids(label=["env:prod", "team:core"]) == [s for s in newest if s in ("s1", "s2")]
    assert sids(label="env:dev", status="running") == ["s1"]
    day = T0 + timedelta(hours=12)
    assert sids(since=day.isoformat()) == [s for s in newest if created[s] >= day]
    assert sids(until=day.isoformat()) == [s for s in newest if created[s] < day]
    one = t.get("/v1/sessions", status="running")["sessions"][0]
    assert one["status"] == "running" and one["userId"] == "alice" and one["activeRunId"]
    assert t.refused("/v1/sessions", status="completed")["code"] == "invalid_request"
    assert t.refused("/v1/sessions", order="updated", status="idle")["code"] == "invalid_request"
    assert t.refused("/v1/sessions", session="s1")["code"] == "invalid_request"

    # pages, with sessions created between them
    more = [Run(_rid(), f"p{i}", T0 - timedelta(days=i + 1)) for i in range(8)]
    t.add(*more)
    every = newest + [r.session for r in more]

    def new_session() -> None:
        t.add(Run(_rid(), f"late-{uuid.uuid4().hex[:6]}", datetime.now(UTC)))

    assert _walk(t, "/v1/sessions", "sessions", 3, between=new_session, order="created") == every


def test_sessions_with_limit_alone_answer_as_before(world: GatewayWorld) -> None:
    """The console's call: the most recently updated first, `{"sessions": [...]}` only."""
    t = _tenant(world, "legacy")
    runs = _seed(t)
    with world.conn() as conn:  # s5 was updated last of all, s1 a moment before
        conn.execute(
            "update agent_sessions set updated_at = %s where session_id = %s",
            (T0 + timedelta(days=30), f"{t.name}:s1"),
        )
    body = t.get("/v1/sessions", limit=50)
    assert set(body) == {"sessions"}
    got = [s["sessionId"] for s in body["sessions"]]
    assert got[0] == "s1" and sorted(got) == sorted({r.session for r in runs})
    assert [s["sessionId"] for s in t.get("/v1/sessions", limit=2)["sessions"]] == got[:2]
    assert set(t.get("/v1/sessions")) == {"sessions"}
    assert t.get("/v1/sessions", order="updated", limit=50)["sessions"] == body["sessions"]


def test_another_tenants_key_sees_none_of_the_runs_whatever_the_filters(
    world: GatewayWorld,
) -> None:
    acme = _tenant(world, "acme")
    globex = _tenant(world, "globex", actor="alice")  # the same actor's name, another tenant
    theirs = {r.run_id for r in _seed(acme)}
    ours = [Run(_rid(), "s1", T0 + timedelta(minutes=30), "failed", "alice", {"env": "prod"})]
    globex.add(*ours)
    for params in (
        {},
        {"status": "failed,running,completed,cancelled,timed_out,cancelling,compacting"},
        {"actor": "alice"},
        {"actor": "bob"},
        {"label": "env:prod"},
        {"session": "s1"},
        {"session": f"{acme.name}:s1"},  # acme's full id is no id of globex's
        {"since": "0"},
        {"until": "4102444800000"},
    ):
        got = set(_walk(globex, "/v1/runs", "runs", 500, **params))
        assert not got & theirs, params
        assert got <= {r.run_id for r in ours}
        sessions = globex.get(
            "/v1/sessions",
            order="created",
            **{k: v for k, v in params.items() if k != "session" and k != "status"},
        )
        assert all(s["sessionId"] == "s1" for s in sessions["sessions"])
    # acme's cursor, handed to globex with the very same filters
    cursor = acme.get("/v1/runs", limit=2)["nextCursor"]
    assert cursor is not None
    assert globex.refused("/v1/runs", limit=2, cursor=cursor)["code"] == "cursor_mismatch"
    scursor = acme.get("/v1/sessions", order="created", limit=1)["nextCursor"]
    error = globex.refused("/v1/sessions", order="created", limit=1, cursor=scursor)
    assert error["code"] == "cursor_mismatch"
    # and another tenant's run by id stays 404, as before
    assert globex.http.get(f"/v1/runs/{next(iter(theirs))}").status_code == 404


def test_forged_truncated_and_other_filters_cursors_are_400(world: GatewayWorld) -> None:
    t = _tenant(world, "cursor")
    _seed(t)
    good = t.get("/v1/runs", limit=2, status="completed,failed")["nextCursor"]
    assert good is not None
    head, tag = good.split(".")

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    forged_payload = b64(b'[1,0,"x","' + b"0" * 32 + b'"]')
    cases = {
        "invalid_cursor": [
            good[:-1],
            good[: len(good) // 2],
            head,
            f"{forged_payload}.{tag}",
            f"{head}.{b64(b'0' * 16)}",
            good + "A",
            "not-a-cursor",
            "%00",
            EVIL,
            "x" * 5000,
        ],
        "cursor_mismatch": [],
    }
    for bad in cases["invalid_cursor"]:
        error = t.refused("/v1/runs", limit=2, status="completed,failed", cursor=bad)
        assert error["code"] == "invalid_cursor", (bad, error)
    # a genuine cursor with other filters
    for params in ({"status": "completed"}, {"status": "completed,failed", "actor": "alice"}, {}):
        error = t.refused("/v1/runs", limit=2, cursor=good, **params)
        assert error["code"] == "cursor_mismatch", params
    # the sessions' search checks its cursors alike, and a run search's is none of its own
    assert t.refused("/v1/sessions", order="created", cursor=good)["code"] == "cursor_mismatch"
    assert t.refused("/v1/sessions", order="created", cursor=good[:-2])["code"] == "invalid_cursor"
    # the good one still resumes
    assert len(t.ids(limit=2, status="completed,failed", cursor=good)) == 2


def test_an_attackers_filter_values_are_a_400_or_a_parameter(world: GatewayWorld) -> None:
    t = _tenant(world, "attack")
    runs = _seed(t)
    assert t.refused("/v1/runs", status=EVIL)["code"] == "invalid_request"
    assert t.refused("/v1/runs", status="running'")["code"] == "invalid_request"
    assert t.ids(actor=EVIL) == []
    assert t.ids(label=f"{EVIL}:{EVIL}") == []
    assert t.ids(label=f"env:{EVIL}") == []
    assert t.ids(session=EVIL) == []
    assert t.ids(actor="alice' or '1'='1") == []
    assert t.refused("/v1/runs", since=EVIL)["code"] == "invalid_request"
    assert t.refused("/v1/runs", until="2026-01-01T00:00:00Z; drop")["code"] == "invalid_request"
    assert t.refused("/v1/runs", since="99999999999999999999")["code"] == "invalid_request"
    assert t.refused("/v1/runs", actor="a\x00b")["code"] == "invalid_request"
    assert t.refused("/v1/runs", label="no-colon")["code"] == "invalid_request"
    assert t.refused("/v1/runs", label=[f"k{i}:v" for i in range(17)])["code"] == "invalid_request"
    assert t.refused("/v1/runs", limit=0)["code"] == "invalid_request"
    assert t.refused("/v1/runs", limit=501)["code"] == "invalid_request"
    assert t.refused("/v1/runs", tenant="globex")["code"] == "invalid_request"
    assert t.refused("/v1/runs", stauts="failed")["code"] == "invalid_request"
    r = t.http.get("/v1/runs?status=failed&status=completed")
    assert r.status_code == 400 and "comma-separated" in r.json()["error"]["message"]
    # everything is still there
    assert sorted(t.ids(limit=500)) == sorted(r.run_id for r in runs)
    assert world.client(None).get("/v1/runs").status_code == 401


def test_a_run_sent_through_the_gateway_is_found(world: GatewayWorld) -> None:
    t = _tenant(world, "live", actor="dora")
    session = f"live-{uuid.uuid4().hex[:6]}"
    r = t.http.post(
        f"/v1/sessions/{session}/commands",
        json={"type": "prompt", "payload": {"text": "find me"}},
    )
    assert r.status_code == 200, r.text
    run_id = r.json()["runId"]
    world.wait_sink(f"{t.name}:{session}", "run.started")
    assert t.ids(session=session) == [run_id]
    assert t.ids(actor="dora", status="running") == [run_id]
    (run,) = t.get("/v1/runs", session=session)["runs"]
    assert run["labels"] is None and run["prompt"] == "find me"  # its prompt had none
    assert [s["sessionId"] for s in t.get("/v1/sessions", status="running")["sessions"]] == [
        session
    ]


# -- the migration ------------------------------------------------------------------------


def _command(session: str, type_: str, ts: int, payload: dict[str, Any]) -> Command:
    return Command(
        command_id=str(uuid.uuid4()),
        session_id=session,
        tenant_id="mig",
        type=type_,
        ts=ts,
        actor="alice",
        payload=payload,
    )


def test_0011_applies_to_an_existing_projection_and_the_sink_keeps_labels(
    worlds: WorldFactory,
) -> None:
    s = worlds("search-mig", partitions=1)
    migrate_module.migrate(s.database_conninfo, schema=s.database_schema, skip={11})
    conninfo = s.database_conninfo
    options = f"-c search_path={s.database_schema}"
    offset = 0

    def sink(events: list[Any]) -> None:
        nonlocal offset
        with psycopg.connect(conninfo, options=options) as conn:
            batch = [PendingEvent(e, "events", 0, offset + i) for i, e in enumerate(events)]
            write_batch(conn, batch)
        offset += len(events)

    # a projection written by a sink before 0011: its rows, without the labels column
    # (this version's sink writes labels, so it needs 0011: it applies it at start)
    started, state = apply(None, _command("mig:s1", "prompt", 1_790_000_000_000, {"text": "a"}))
    proj = Projection({}, {})
    for e in started:
        proj.apply(e)
    old_cols = [c for c in RUN_COLS if c != "labels"]
    with psycopg.connect(conninfo, options=options) as conn:
        (sess,) = proj.sessions_to_write()
        conn.execute(
            "insert into agent_sessions (session_id, tenant_id, active_run_id, created_at,"
            " updated_at, user_id) values (%s, %s, %s, %s, %s, %s)",
            (
                sess.session_id,
                sess.tenant_id,
                sess.active_run_id,
                ts(sess.created_at),
                ts(sess.updated_at),
                sess.user_id,
            ),
        )
        for r in proj.runs_to_write():
            conn.execute(
                f"insert into agent_runs ({', '.join(old_cols)})"
                f" values ({', '.join(['%s'] * len(old_cols))})",
                tuple(ts(getattr(r, c)) if c in RUN_TIMES else getattr(r, c) for c in old_cols),
            )
    run_id = started[0].run_id
    # Step 1: 0011 on it: only 0011 runs, the rows stay
    applied = migrate_module.migrate(conninfo, schema=s.database_schema)
    assert [m.version for m in applied] == [11]
    with psycopg.connect(conninfo, options=options) as conn:
        row = conn.execute(
            "select status, labels from agent_runs where run_id = %s", (run_id,)
        ).fetchone()
        assert row == ("running", None)
        # Step 2: labels written to the run (as the projection will), then the sink's
        # later writes of that run (a cancel) keep them
        conn.execute(
            "update agent_runs set labels = %s where run_id = %s",
            (Jsonb({"env": "prod"}), run_id),
        )
        conn.commit()
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("update agent_runs set labels = '[1]' where run_id = %s", (run_id,))
        conn.rollback()
    ended, state = apply(state, _command("mig:s1", "abort", 1_790_000_001_000, {}))
    sink(ended)
    with psycopg.connect(conninfo, options=options) as conn:
        row = conn.execute(
            "select status, labels from agent_runs where run_id = %s", (run_id,)
        ).fetchone()
        assert row == ("cancelled", {"env": "prod"})
    # Step 3: up to date: nothing more to apply
    assert migrate_module.migrate(conninfo, schema=s.database_schema) == []


def test_0011_on_a_fresh_schema_makes_the_column_and_the_indexes(worlds: WorldFactory) -> None:
    s = worlds("search-fresh", partitions=1, migrated=True)
    with psycopg.connect(s.database_conninfo) as conn:
        indexes = {
            str(r[0])
            for r in conn.execute(
                "select indexname from pg_indexes where schemaname = %s", (s.database_schema,)
            ).fetchall()
        }
        column = conn.execute(
            "select data_type from information_schema.columns where table_schema = %s"
            " and table_name = 'agent_runs' and column_name = 'labels'",
            (s.database_schema,),
        ).fetchone()
    assert column == ("jsonb",)
    assert {
        "agent_runs_search_idx",
        "agent_runs_search_status_idx",
        "agent_runs_search_actor_idx",
        "agent_runs_labels_idx",
        "agent_sessions_search_idx",
        "agent_sessions_search_user_idx",
        "agent_sessions_search_active_idx",
    } <= indexes
