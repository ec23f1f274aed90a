"""Run search at millions of runs: each filter shape's page time, a deep page, the plans.

1. A private schema migrated to everything but 0011 (the search's indexes), filled in
   PostgreSQL itself (`insert ... select` over `generate_series`: nothing crosses the
   wire) with `--runs` runs of 10 tenants (tenant t0 holds half) in `--runs / 10`
   sessions over a year: statuses as a busy system has them (most completed; 1% of the
   sessions with an active run), actors skewed (`user-0` on ~10% of the runs, `user-999`
   on ~0.03%), labels on 20% (`env`, `team`) and a rare one on 10 runs.
2. Migration 0011 applied to that table, as an upgrade would (timed), then ANALYZE.
3. Every filter shape of `GET /v1/runs` and `GET /v1/sessions` for t0, through the very
   query functions the gateway calls (`sessionstream.runtimes.sink.search`): the first
   page 11 times on one connection (psycopg prepares a statement from its 6th execution,
   so later executions may run a generic plan, as the gateway's pooled connections do):
   the first and the median of the other 10. Each shape's plan, custom and generic, must
   name a search index and hold no Seq Scan on a table.
4. Deep pages: 1,000 pages of 50 walked with cursors (all runs; status=completed); each
   page's time, and page 1,000's plan.
5. The same-run baseline: each query once more inside a transaction that dropped 0011's
   indexes (rolled back after), and page 1,000 as `OFFSET 49950` with the indexes.

    .venv/bin/python -m bench.bench_run_search [--runs 2000000] [--quick] [--keep] [--no-save]

Not in `make test` (it is a benchmark); writes bench/results/run-search.{md,json}.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from sessionstream.adapters.postgres import migrate as migrate_module
from sessionstream.runtimes.sink.cursor import Position
from sessionstream.runtimes.sink.search import Filters, Search, find, search_query
from sessionstream.settings import Settings

#: run 0's id (`_fill_sql`): what the probes read and write during the migration
_RUN_0 = str(uuid.UUID(hashlib.md5(b"run0").hexdigest()))
RESULTS = Path(__file__).resolve().parent / "results"
SEARCH_MIGRATION = 11
TENANT = "t0"
PAGE = 50


def _fill_sql(runs: int) -> list[str]:
    """The synthetic projection, in PostgreSQL. Run j belongs to session j % S (S = runs /
    10), so a session's runs spread over the year; session k's first run is run k."""
    s = max(runs // 10, 1)
    year = 365 * 86400.0
    tenant = "(case when {k} % 2 = 0 then 't0' else 't' || (1 + {k} % 9) end)"
    actor = "'user-' || floor(1000 * power((abs(hashtext('a' || {j})) % 1000000) / 1e6, 3))"
    created = (
        "(timestamptz '2026-01-01 00:00:00+00'"
        f" + ({{j}}::float8 / {runs} * {year}) * interval '1 second')"
    )
    run_id = "md5('run' || {j})::uuid::text"
    active_first = runs - s  # the sessions' last runs: j >= runs - S
    run_tenant = tenant.format(k=f"(j % {s})")
    return [
        f"""insert into agent_sessions (session_id, tenant_id, active_run_id, created_at,
              updated_at, user_id)
            select {tenant.format(k="k")} || ':s' || k, {tenant.format(k="k")},
                   case when k % 100 = 0 then {run_id.format(j=f"({active_first} + k)")} end,
                   {created.format(j="k")}, {created.format(j="k")} + interval '1 minute',
                   {actor.format(j="k")}
            from generate_series(0, {s - 1}) as k""",
        f"""insert into agent_runs (run_id, session_id, tenant_id, status, generation,
              timeout_at, terminal_status, terminal_at, prompt, last_seq, created_at,
              updated_at, started_by)
            select {run_id.format(j="j")}, {run_tenant} || ':s' || (j % {s}), {run_tenant}, st, 1,
                   {created.format(j="j")} + interval '10 minutes',
                   case when st in ('running', 'cancelling', 'compacting') then null else st end,
                   case when st in ('running', 'cancelling', 'compacting') then null
                        else {created.format(j="j")} + interval '30 seconds' end,
                   'prompt ' || j, 5, {created.format(j="j")},
                   {created.format(j="j")} + interval '30 seconds', {actor.format(j="j")}
            from (select j,
                         case when j >= {active_first} and (j - {active_first}) % 100 = 0
                                   then (case when (j - {active_first}) % 300 = 0 then 'cancelling'
                                              else 'running' end)
                              when abs(hashtext('s' || j)) % 100 < 85 then 'completed'
                              when abs(hashtext('s' || j)) % 100 < 91 then 'failed'
                              when abs(hashtext('s' || j)) % 100 < 97 then 'cancelled'
                              else 'timed_out' end as st
                  from generate_series(0, {runs - 1}) as j) g""",
    ]


def _labels_sql(runs: int) -> str:
    """Labels on 20% of the runs (as the projection will write them from `run.started`),
    and a rare one on ~10; after 0011 made the column."""
    return f"""update agent_runs r set labels = case
                 when abs(hashtext('r' || g.j)) % {max(runs // 10, 1)} = 0
                     then '{{"ticket": "INC-7"}}'::jsonb
                 when g.h % 10 = 0
                     then jsonb_build_object('env', 'prod', 'team', 'team-' || g.j % 50)
                 else jsonb_build_object('env', 'staging', 'team', 'team-' || g.j % 50) end
               from (select j, abs(hashtext('h' || j)) as h from generate_series(0, {runs - 1}) j) g
               where r.run_id = md5('run' || g.j)::uuid::text
                 and (g.h % 10 in (0, 1) or abs(hashtext('r' || g.j)) % {max(runs // 10, 1)} = 0)"""


def _shapes(one_session: str) -> list[tuple[str, Search]]:
    def runs(**kw: Any) -> Search:
        return Search("runs", TENANT, Filters.of(**kw))

    def sessions(**kw: Any) -> Search:
        from sessionstream.runtimes.sink.search import SESSION_STATUSES

        return Search("sessions", TENANT, Filters.of(statuses=SESSION_STATUSES, **kw))

    return [
        ("runs: no filter", runs()),
        ("runs: status=failed", runs(status="failed")),
        ("runs: status=running (rare)", runs(status="running")),
        ("runs: status=failed,cancelled,timed_out", runs(status="failed,cancelled,timed_out")),
        ("runs: actor=user-0 (~10%)", runs(actor="user-0")),
        ("runs: actor=user-999 (~0.03%)", runs(actor="user-999")),
        ("runs: actor=user-0 & status=failed", runs(actor="user-0", status="failed")),
        ("runs: label=env:prod (~10%)", runs(labels=["env:prod"])),
        ("runs: label=env:prod & label=team:team-8", runs(labels=["env:prod", "team:team-8"])),
        ("runs: label=ticket:INC-7 (10 runs)", runs(labels=["ticket:INC-7"])),
        (
            "runs: since/until (one month)",
            runs(since="2026-06-01T00:00:00Z", until="2026-07-01T00:00:00Z"),
        ),
        ("runs: session (one)", runs(session_id=one_session)),
        ("runs: every tenant, no filter (CLI)", Search("runs", None, Filters())),
        ("sessions: no filter", sessions()),
        ("sessions: status=running", sessions(status="running")),
        ("sessions: status=idle", sessions(status="idle")),
        ("sessions: actor=user-3", sessions(actor="user-3")),
        ("sessions: label=ticket:INC-7", sessions(labels=["ticket:INC-7"])),
        ("sessions: label=env:prod", sessions(labels=["env:prod"])),
    ]


class _Prober(threading.Thread):
    """A read and a write of one run every 50 ms on their own connections while 0011 runs
    (what the gateway and the sink would do): the longest each waited on the migration's
    locks."""

    def __init__(self, conninfo: str, schema: str, run_id: str, write: bool) -> None:
        super().__init__(daemon=True)
        self.conninfo, self.schema, self.run_id, self.write = conninfo, schema, run_id, write
        self.stop = threading.Event()
        self.longest_s = 0.0

    def run(self) -> None:
        sql = (
            "update agent_runs set last_seq = last_seq where run_id = %s"
            if self.write
            else "select status from agent_runs where run_id = %s"
        )
        with psycopg.connect(
            self.conninfo, autocommit=True, options=f"-c search_path={self.schema}"
        ) as conn:
            while not self.stop.is_set():
                t = time.perf_counter()
                conn.execute(sql, (self.run_id,))
                self.longest_s = max(self.longest_s, time.perf_counter() - t)
                time.sleep(0.05)


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _plan(
    conn: psycopg.Connection[Any], sql: str, params: dict[str, Any], generic: bool
) -> dict[str, Any]:
    conn.execute(f"set plan_cache_mode = {'force_generic_plan' if generic else 'auto'}")
    row = conn.execute(f"explain (format json) {sql}", params).fetchone()
    conn.execute("set plan_cache_mode = auto")
    conn.rollback()
    assert row is not None
    return row[0][0]["Plan"]  # type: ignore[no-any-return]


def _summary(plan: dict[str, Any]) -> dict[str, Any]:
    nodes = list(_nodes(plan))
    return {
        "indexes": sorted({n["Index Name"] for n in nodes if "Index Name" in n}),
        # session_aliases: only migration 0006 writes it (the sessions of before namespaces),
        # read once per query as a hashed subplan
        "seq_scans": sorted(
            {
                n["Relation Name"]
                for n in nodes
                if n["Node Type"] == "Seq Scan" and n["Relation Name"] != "session_aliases"
            }
        ),
        "sorts": sum(1 for n in nodes if n["Node Type"] in ("Sort", "Incremental Sort")),
    }


def _ms(f: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = f()
    return (time.perf_counter() - t) * 1000, out


def _timed_pages(conn: psycopg.Connection[Any], search: Search, repeat: int) -> dict[str, Any]:
    times = []
    page = None
    for _ in range(repeat):
        ms, page = _ms(lambda: find(conn, search, None, PAGE))
        times.append(ms)
    assert page is not None
    return {
        "rows": len(page.rows),
        "first_ms": round(times[0], 2),
        "median_ms": round(statistics.median(times[1:]), 2),
    }


def _baseline_ms(
    conn: psycopg.Connection[Any], sql: str, params: dict[str, Any], drop: list[str]
) -> tuple[float, dict[str, Any]]:
    """The query once warm, once timed, in a transaction without 0011's indexes."""
    with conn.transaction(force_rollback=True):
        for name in drop:
            conn.execute(f'drop index "{name}"')
        conn.execute(sql, params).fetchall()  # warm the cache the way the indexed runs had
        ms, _ = _ms(lambda: conn.execute(sql, params).fetchall())
        row = conn.execute(f"explain (format json) {sql}", params).fetchone()
    assert row is not None
    return round(ms, 1), _summary(row[0][0]["Plan"])


def _walk(conn: psycopg.Connection[Any], search: Search, pages: int) -> dict[str, Any]:
    times: list[float] = []
    after: Position | None = None
    seen = 0
    last_ids: set[str] = set()
    for _ in range(pages):
        ms, page = _ms(lambda a=after: find(conn, search, a, PAGE))
        times.append(ms)
        ids = {str(r[0]) for r in page.rows}
        assert not ids & last_ids, "a row on two pages"
        last_ids = ids
        seen += len(page.rows)
        if page.next is None:
            break
        after = page.next
    return {
        "pages": len(times),
        "rows": seen,
        "total_s": round(sum(times) / 1000, 2),
        "p50_ms": round(statistics.median(times), 2),
        "p99_ms": round(sorted(times)[max(int(len(times) * 0.99) - 1, 0)], 2),
        "max_ms": round(max(times), 2),
        "last_page_ms": round(times[-1], 2),
        "after_last": after,
    }


def run(runs: int, keep: bool) -> dict[str, Any]:
    settings = Settings()
    schema = f"bench_search_{uuid.uuid4().hex[:8]}"
    out: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()},
        "runs": runs,
        "sessions": max(runs // 10, 1),
        "tenant": TENANT,
        "page": PAGE,
    }
    try:
        # Step 1: everything but the search's migration, then the rows
        migrate_module.migrate(settings.database_conninfo, schema=schema, skip={SEARCH_MIGRATION})
        with psycopg.connect(
            settings.database_conninfo, options=f"-c search_path={schema}"
        ) as conn:
            conn.execute("set synchronous_commit = off")
            t = time.perf_counter()
            for statement in _fill_sql(runs):
                conn.execute(statement)
            conn.commit()
            out["fill_s"] = round(time.perf_counter() - t, 1)
            print(f"filled {runs:,} runs in {out['fill_s']} s", file=sys.stderr)
        # Step 2: 0011 as an upgrade applies it, on the full table, a reader and a writer
        # of one run going on meanwhile
        probes = [
            _Prober(settings.database_conninfo, schema, _RUN_0, write) for write in (False, True)
        ]
        for p in probes:
            p.start()
        time.sleep(0.5)
        t = time.perf_counter()
        applied = migrate_module.migrate(settings.database_conninfo, schema=schema)
        out["migration_0011_s"] = round(time.perf_counter() - t, 1)
        time.sleep(0.5)
        for p in probes:
            p.stop.set()
            p.join()
        out["migration_longest_read_s"] = round(probes[0].longest_s, 2)
        out["migration_longest_write_s"] = round(probes[1].longest_s, 2)
        assert [m.version for m in applied] == [SEARCH_MIGRATION], applied
        print(f"0011 applied in {out['migration_0011_s']} s", file=sys.stderr)
        with psycopg.connect(
            settings.database_conninfo, options=f"-c search_path={schema}"
        ) as conn:
            t = time.perf_counter()
            conn.execute(_labels_sql(runs))
            conn.commit()
            out["labels_s"] = round(time.perf_counter() - t, 1)
            conn.autocommit = True
            conn.execute("vacuum analyze agent_runs")
            conn.autocommit = False
            conn.execute("analyze agent_runs")
            conn.execute("analyze agent_sessions")
            conn.commit()
            out["tenant_runs"] = conn.execute(
                "select count(*) from agent_runs where tenant_id = %s", (TENANT,)
            ).fetchone()[0]  # type: ignore[index]
            out["table_mb"] = {
                name: round(size / 2**20, 1)
                for name, size in conn.execute(
                    "select c.relname, pg_relation_size(c.oid) from pg_class c join pg_namespace n"
                    " on n.oid = c.relnamespace where n.nspname = %s and c.relkind in ('r', 'i')"
                    " and (c.relname like 'agent_runs%%' or c.relname like 'agent_sessions%%')",
                    (schema,),
                ).fetchall()
            }
            drop = [
                str(r[0])
                for r in conn.execute(
                    "select indexname from pg_indexes where schemaname = %s and"
                    " (indexname like '%%search%%' or indexname = 'agent_runs_labels_idx')",
                    (schema,),
                ).fetchall()
            ]
            conn.rollback()
            one_session = str(
                conn.execute(
                    "select session_id from agent_sessions where tenant_id = %s limit 1", (TENANT,)
                ).fetchone()[0]  # type: ignore[index]
            )
            conn.rollback()
            # Step 3: every shape
            shapes = []
            for name, search in _shapes(one_session):
                sql, params = search_query(search, None, PAGE + 1)
                got = _timed_pages(conn, search, 11)
                got["custom"] = _summary(_plan(conn, sql, params, generic=False))
                got["generic"] = _summary(_plan(conn, sql, params, generic=True))
                got["baseline_ms"], got["baseline"] = _baseline_ms(conn, sql, params, drop)
                shapes.append({"shape": name, **got})
                print(
                    f"{name}: {got['median_ms']} ms (baseline {got['baseline_ms']} ms)",
                    file=sys.stderr,
                )
            out["shapes"] = shapes
            # Step 4: deep pages
            deep = []
            for name, search in (
                ("runs: no filter", Search("runs", TENANT, Filters())),
                ("runs: status=completed", Search("runs", TENANT, Filters.of(status="completed"))),
            ):
                walked = _walk(conn, search, 1000)
                after = walked.pop("after_last")
                sql, params = search_query(search, after, PAGE + 1)
                walked["page_1001"] = _summary(_plan(conn, sql, params, generic=False))
                walked["page_1001_baseline_ms"], _b = _baseline_ms(conn, sql, params, drop)
                walked["page_1001_offset_ms"] = None
                if not search.filters.any:
                    # the same page as OFFSET (what keyset pages avoid), with the indexes
                    first, fparams = search_query(search, None, PAGE)
                    oparams = {**fparams, "offset": walked["rows"]}
                    osql = f"{first} offset %(offset)s"
                    conn.execute(osql, oparams).fetchall()
                    ms, _ = _ms(lambda s=osql, p=oparams: conn.execute(s, p).fetchall())
                    walked["page_1001_offset_ms"] = round(ms, 1)
                    conn.rollback()
                deep.append({"shape": name, **walked})
                print(f"deep {name}: {walked}", file=sys.stderr)
            out["deep"] = deep
    finally:
        if not keep:
            with psycopg.connect(settings.database_conninfo, autocommit=True) as conn:
                conn.execute(f'drop schema if exists "{schema}" cascade')
        else:
            print(f"kept schema {schema}", file=sys.stderr)
    out["host"]["loadavg_end"] = os.getloadavg()
    return out


def _plan_text(s: dict[str, Any]) -> str:
    bad = f" **Seq Scan on {', '.join(s['seq_scans'])}**" if s["seq_scans"] else ""
    sorts = f", {s['sorts']} sort" if s["sorts"] else ""
    return f"{', '.join(s['indexes']) or '—'}{sorts}{bad}"


def markdown(r: dict[str, Any]) -> str:
    load = r["host"]
    lines = [
        f"# Run search at {r['runs']:,} runs ({r['when']})",
        "",
        f"From `bench/bench_run_search.py --runs {r['runs']}`; all numbers in `run-search.json`. "
        f"{load['cpus']} CPUs shared with Kafka, PostgreSQL and whatever else runs; 1-minute "
        f"load average {load['loadavg_start'][0]:.2f} at the start, "
        f"{load['loadavg_end'][0]:.2f} at the end.",
        "",
        f"{r['runs']:,} runs in {r['sessions']:,} sessions of 10 tenants; tenant `{r['tenant']}` "
        f"(every query's) has {r['tenant_runs']:,}. Filled in {r['fill_s']} s. Migration 0011 "
        f"on the full table (its indexes built, the `labels` column added) took "
        f"**{r['migration_0011_s']} s**; meanwhile a read of one run every 50 ms waited at most "
        f"**{r['migration_longest_read_s']} s**, an update of one (the sink's) at most "
        f"**{r['migration_longest_write_s']} s**. Labels then written on 20% of the runs in "
        f"{r['labels_s']} s. Sizes (MB): "
        + ", ".join(f"{k} {v}" for k, v in sorted(r["table_mb"].items()))
        + ".",
        "",
        f"## First page ({r['page']} rows), each filter shape",
        "",
        "Median of 10 executions after the first, on one connection (prepared after the 5th,"
        " as on the gateway's pool); baseline: the same query once warm without 0011's indexes"
        " (dropped in a transaction that is rolled back). Plans: the indexes read, sorts, and"
        " any Seq Scan; *custom* is planned with the values, *generic* without (what a prepared"
        " statement may run).",
        "",
        "| shape | rows | median ms | first ms | baseline ms | plan (custom) | plan (generic)"
        " | baseline plan |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in r["shapes"]:
        lines.append(
            f"| {s['shape']} | {s['rows']} | **{s['median_ms']}** | {s['first_ms']} | "
            f"{s['baseline_ms']} | {_plan_text(s['custom'])} | {_plan_text(s['generic'])} | "
            f"{_plan_text(s['baseline'])} |"
        )
    lines += [
        "",
        "## Deep pages: 1,000 pages walked with cursors",
        "",
        "| shape | pages | rows | total s | p50 ms | p99 ms | max ms | page 1,000 ms |"
        " page 1,001 plan | page 1,001 without 0011 ms | page 1,001 as OFFSET ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d in r["deep"]:
        lines.append(
            f"| {d['shape']} | {d['pages']} | {d['rows']:,} | {d['total_s']} | {d['p50_ms']} | "
            f"{d['p99_ms']} | {d['max_ms']} | {d['last_page_ms']} | {_plan_text(d['page_1001'])} | "
            f"{d['page_1001_baseline_ms']} | {d['page_1001_offset_ms'] or '—'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2_000_000)
    ap.add_argument("--quick", action="store_true", help="200,000 runs")
    ap.add_argument("--keep", action="store_true", help="keep the schema (printed)")
    ap.add_argument("--no-save", action="store_true", help="print only")
    args = ap.parse_args()
    result = run(200_000 if args.quick else args.runs, args.keep)
    text = markdown(result)
    print(text)
    if not args.no_save:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "run-search.md").write_text(text)
        (RESULTS / "run-search.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    failed = [
        s["shape"]
        for s in result["shapes"]
        if s["custom"]["seq_scans"] and "every tenant" not in s["shape"]
    ]
    if failed:
        print(f"Seq Scan in: {failed}", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
