"""sessionstream side by side with its ceiling and with what a user would build instead.

1. Ceiling: a raw confluent-kafka transactional consume -> produce pass-through with no logic
   (poll a batch of up to 500, produce each record to an output topic on its partition,
   `send_offsets_to_transaction`, commit), over a backlog of commands pre-produced on 4
   partitions (the processor bench's N and mix). Then OUR processor on the same input, then
   the pass-through once more (the machine is shared: two ceilings bracket ours).
2. Baseline A, the seed's anti-pattern (one JSONB document per session, read-modify-write by
   8 concurrent writers, no lock): lost events and throughput. The same load through
   sessionstream (8 producer threads -> processor -> sink): commands acknowledged vs commands
   with rows in PostgreSQL.
3. Baseline B, the seed's SQL design without Kafka (row lock, our decider, events and
   projection in one transaction, see `_baselines.py`): saturated throughput with 8
   writers, then command -> committed latency at a paced rate; sessionstream's command -> row
   latency at the same rate measured here too; ratios.
4. Replay: events/s reading the events topic by offset
(`sessionstream.runtimes.sink.replay.read_range`) and
   rebuilding the PostgreSQL projection from it (`sessionstream.runtimes.sink.replay.rebuild`).

Topics, groups and PostgreSQL schemas are private to the run and removed at the end.

    .venv/bin/python -m bench.bench_baselines [--quick] [--json] [--no-save]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

from bench import _baselines as base
from bench._harness import (
    Offsets,
    Processor,
    Workload,
    delete_topics_and_groups,
    percentiles,
    wait_for,
)
from bench._sink_harness import RowPoller, SinkProc, connect, delete_groups, drop_schemas
from bench._sink_harness import fresh_schema as new_schema
from sessionstream.adapters.kafka import client_config, read_topic
from sessionstream.client import CommandHandle, SessionClient
from sessionstream.runtimes.sink.replay import read_range, rebuild
from sessionstream.schemas.commands import Command
from sessionstream.settings import Settings
from tests.integration.worlds import isolated_settings

RESULTS = Path(__file__).resolve().parent / "results"
now = time.perf_counter


def commands(client: SessionClient, prefix: str, sessions: int, n: int, seed: int) -> list[Command]:
    wl = Workload(client, prefix, sessions, seed)
    return [wl.next() for _ in range(n)]


def rate(n: int, secs: float) -> int:
    return round(n / max(secs, 1e-6))


# -- 1. ours on the ceiling's backlog ---------------------------------------------------------
def ours_backlog(s: Settings, n: int) -> tuple[Processor, dict[str, Any]]:
    """Our processor on the same backlog, timed as `bench_processor.py` does."""
    offsets = Offsets(s)
    target = offsets.end()
    proc = Processor(s, f"bench-{uuid.uuid4().hex[:6]}").start()
    t1, c1 = offsets.wait(lambda c: any(c.values()), proc)
    t2, _ = offsets.wait_past(target, proc)
    offsets.close()
    measured = n - sum(c1.values())
    return proc, {
        "commands": n,
        "measured_commands": measured,
        "seconds": round(t2 - t1, 2),
        "commands_per_s": rate(measured, t2 - t1),
        "startup_to_first_commit_s": round(t1 - proc.started_at, 2),
    }


# -- 2. sessionstream under the baselines' load -------------------------------------------------
def submit_concurrently(
    s: Settings, shares: list[list[Command]]
) -> tuple[float, list[CommandHandle]]:
    """One producer client per share, all at once; (start time, handles)."""
    handles: list[list[CommandHandle]] = [[] for _ in shares]
    start = threading.Barrier(len(shares) + 1)

    def producer(i: int) -> None:
        client = SessionClient("bench", s)
        start.wait()
        handles[i] = [client.submit(c, track=False) for c in shares[i]]
        client.flush()
        client.close()

    threads = [threading.Thread(target=producer, args=(i,)) for i in range(len(shares))]
    for t in threads:
        t.start()
    start.wait()
    t0 = now()
    for t in threads:
        t.join()
    return t0, [h for hs in handles for h in hs]


def rows_for(url: str, schema: str, ids: list[str]) -> int:
    with connect(url, schema) as conn:
        q = "select count(distinct command_id) from agent_run_events where command_id = any(%s)"
        row = conn.execute(q, (ids,)).fetchone()
    return int(row[0]) if row else 0


def ours_concurrent(s: Settings, schema: str, cmds: list[Command], writers: int) -> dict[str, Any]:
    t0, handles = submit_concurrently(s, base.split(cmds, writers))
    acked = [h.command.command_id for h in handles if h.acked]
    t_done = now()
    with contextlib.suppress(TimeoutError):  # reported as lost below
        t_done = wait_for(
            lambda: rows_for(s.database_url, schema, acked) >= len(acked),
            120,
            "a row for every acknowledged command",
            0.02,
        )
    found = rows_for(s.database_url, schema, acked)
    return {
        "writers": writers,
        "commands": len(cmds),
        "acknowledged": len(acked),
        "commands_with_rows": found,
        "lost": len(acked) - found,
        "seconds_to_last_row": round(t_done - t0, 2),
        "commands_per_s_to_rows": rate(len(acked), t_done - t0),
    }


def ours_paced(s: Settings, schema: str, cmds: list[Command], r: float) -> dict[str, Any]:
    """Commands at `r`/s; send -> first row of the command visible in PostgreSQL."""
    poller = RowPoller(s.database_url, schema, 0.005)
    poller.start()
    client = SessionClient("bench", s)
    sent: dict[str, float] = {}
    t0 = now()
    for i, cmd in enumerate(cmds):
        wait = t0 + i / r - now()
        if wait > 0:
            time.sleep(wait)
        sent[cmd.command_id] = now()
        client.submit(cmd, track=False)
    achieved = (len(cmds) - 1) / (now() - t0)
    client.flush()
    client.close()
    seen = poller.first_seen
    with contextlib.suppress(TimeoutError):  # reported as missing below
        wait_for(lambda: all(c in seen for c in sent), 60, "rows", 0.05)
    poller.stop()
    lat = [seen[c] - t for c, t in sent.items() if c in seen]
    return {
        "achieved_rate": round(achieved, 1),
        "measured": len(lat),
        "missing_rows": len(sent) - len(lat),
        "command_to_row": percentiles(lat),
    }


# -- the run ------------------------------------------------------------------------------------
def run(a: argparse.Namespace) -> dict[str, Any]:
    url = Settings().database_url
    prefix = f"bench_base_{uuid.uuid4().hex[:6]}"
    s = isolated_settings(Settings(), "base", partitions=4, prefix="bench", schema=False)
    out_topic = f"bench.ceiling.{uuid.uuid4().hex[:8]}"
    admin = AdminClient(client_config(s))
    admin.create_topics([NewTopic(out_topic, 4, 1)])[out_topic].result()
    client = SessionClient("bench", s)
    procs: list[Any] = []
    out: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()},
        "config": {k: v for k, v in vars(a).items() if k not in ("json", "save")},
    }
    try:
        # 1. ceiling vs ours on one pre-produced backlog
        for cmd in commands(client, "tput", a.sessions, a.commands, 1):
            client.submit(cmd, track=False)
        client.flush()
        c1 = base.passthrough(s, out_topic, a.commands)
        proc, ours = ours_backlog(s, a.commands)
        procs.append(proc)
        c2 = base.passthrough(s, out_topic, a.commands)
        ceiling = (c1["records_per_s"] + c2["records_per_s"]) / 2
        out["ceiling"] = {
            "runs": [c1, c2],
            "records_per_s": round(ceiling),
            "ours": ours,
            "ratio": round(ours["commands_per_s"] / ceiling, 3),
        }
        # the sink catches up on that log; it stays up for the phases below
        schema = new_schema(url, prefix)
        sink = SinkProc(s, schema, "copy").start()
        procs.append(sink)
        n_events = len(read_topic(s, s.events_topic))
        wait_for(lambda: rows_for_all(url, schema) >= n_events, 180, "the sink to catch up", 0.1)

        # 2. Baseline A and the same load through sessionstream
        load = commands(client, "a", a.a_sessions, a.a_commands, 2)
        doc = base.doc_schema(url, prefix, {c.session_id for c in load})
        secs, lat, errors = base.run_writers(url, doc, base.split(load, a.writers), base.doc_append)
        kept, size = base.doc_count(url, doc)
        out["baseline_a"] = {
            "writers": a.writers,
            "sessions": a.a_sessions,
            "commands": len(load),
            "committed": len(lat),
            "errors": errors,
            "events_kept": kept,
            "lost": len(lat) - kept,
            "lost_pct": round(100 * (len(lat) - kept) / len(lat), 2),
            "seconds": round(secs, 2),
            "commands_per_s": rate(len(lat), secs),
            "avg_doc_kb": round(size / a.a_sessions / 1024, 1),
            **percentiles(lat),
        }
        load = commands(client, "a-ours", a.a_sessions, a.a_commands, 2)
        out["ours_a"] = ours_concurrent(s, schema, load, a.writers)

        # 3. Baseline B: saturated, then paced; ours paced at the same rate
        load = commands(client, "b", a.sessions, a.b_commands, 3)
        sql = base.sql_schema(url, prefix)
        secs, lat, errors = base.run_writers(url, sql, base.split(load, a.writers), base.sql_decide)
        sat = {
            "writers": a.writers,
            "sessions": a.sessions,
            "commands": len(load),
            "committed": len(lat),
            "errors": errors,
            "seconds": round(secs, 2),
            "commands_per_s": rate(len(lat), secs),
            "command_to_committed": percentiles(lat),
            **base.sql_check(url, sql),
        }
        n_paced = int(a.rate * a.seconds)
        load = commands(client, "bp", a.sessions, n_paced, 4)
        _, lat, achieved, errors = base.sql_paced(url, sql, load, a.writers, a.rate)
        paced = {
            "target_rate": a.rate,
            "achieved_rate": round(achieved, 1),
            "seconds": a.seconds,
            "measured": len(lat),
            "errors": errors,
            "command_to_committed": percentiles(lat),
        }
        out["baseline_b"] = {"saturated": sat, "paced": paced}
        load = commands(client, "op", a.sessions, n_paced, 4)
        out["ours_paced"] = {"target_rate": a.rate, **ours_paced(s, schema, load, a.rate)}
        out["ratios"] = ratios(out)

        # 4. replay: everything above is in the events topic and the sink's schema
        proc.stop()
        n_events = len(read_topic(s, s.events_topic))
        wait_for(lambda: rows_for_all(url, schema) >= n_events, 120, "the sink to catch up", 0.1)
        sink.stop()
        out["replay"] = replay(s.model_copy(update={"database_schema": schema}))
    finally:
        for p in procs:
            p.stop()
        client.close()
        failed = [] if a.keep else delete_topics_and_groups(s)
        if not a.keep:
            admin.delete_topics([out_topic], operation_timeout=30)
            delete_groups(s, [p.group for p in procs if isinstance(p, SinkProc)])
            out["dropped_schemas"] = len(drop_schemas(url, prefix))
        out["cleanup_failures"] = failed
        out["host"]["loadavg_end"] = os.getloadavg()
    return out


def rows_for_all(url: str, schema: str) -> int:
    with connect(url, schema) as conn:
        row = conn.execute("select count(*) from agent_run_events").fetchone()
    return int(row[0]) if row else 0


def ratios(r: dict[str, Any]) -> dict[str, Any]:
    """sessionstream / Baseline B (throughput: > 1 means we are faster; latency: < 1)."""
    sat, paced, op = r["baseline_b"]["saturated"], r["baseline_b"]["paced"], r["ours_paced"]
    b_lat, o_lat = paced["command_to_committed"], op["command_to_row"]
    return {
        "throughput_processor_vs_b": round(
            r["ceiling"]["ours"]["commands_per_s"] / sat["commands_per_s"], 2
        ),
        "throughput_to_rows_vs_b": round(
            r["ours_a"]["commands_per_s_to_rows"] / sat["commands_per_s"], 2
        ),
        "latency_p50_vs_b": round(o_lat["p50_ms"] / b_lat["p50_ms"], 2),
        "latency_p99_vs_b": round(o_lat["p99_ms"] / b_lat["p99_ms"], 2),
    }


def replay(s: Settings) -> dict[str, Any]:
    t0, n = now(), 0
    for p in range(s.partitions):
        for _ in read_range(s, p, 0):
            n += 1
    read_s = now() - t0
    t0 = now()
    report = rebuild(s)
    rebuild_s = now() - t0
    return {
        "events": n,
        "read_range_seconds": round(read_s, 2),
        "read_range_events_per_s": rate(n, read_s),
        "rebuild_events": report.events,
        "rebuild_seconds": round(rebuild_s, 2),
        "rebuild_events_per_s": rate(report.events, rebuild_s),
        "rebuild_equal": report.equal,
        "rebuild_differences": report.differences,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller numbers (~1 min)")
    ap.add_argument("--commands", type=int, help="ceiling backlog (default 20000; quick 10000)")
    ap.add_argument("--sessions", type=int, default=500, help="sessions of ceiling and B")
    ap.add_argument("--writers", type=int, default=8, help="concurrent writers (A, B)")
    ap.add_argument("--a-sessions", type=int, default=50, help="Baseline A sessions")
    ap.add_argument("--a-commands", type=int, help="Baseline A load (default 4000; quick 2000)")
    ap.add_argument("--b-commands", type=int, help="Baseline B load (default 6000; quick 3000)")
    ap.add_argument("--rate", type=float, default=500.0, help="paced phase commands/s")
    ap.add_argument("--seconds", type=float, help="paced phase length (default 10; quick 6)")
    ap.add_argument("--keep", action="store_true", help="keep topics and schemas")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument(
        "--save",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write bench/results/baselines.json (default: yes)",
    )
    args = ap.parse_args(argv)
    for name, full, quick in (
        ("commands", 20_000, 10_000),
        ("a_commands", 4000, 2000),
        ("b_commands", 6000, 3000),
        ("seconds", 10.0, 6.0),
    ):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    result = run(args)
    if args.save:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "baselines.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
