"""The processor's hot path against its ceiling, measured A B A B in one run.

1. Throughput, alternating: the raw exactly-once pass-through (`bench/_baselines.py`:
   consume a batch of up to 500, produce each record, `send_offsets_to_transaction`,
   commit; no decoding, no logic) and `sessionstream processor` on the same pre-produced
   backlog, `--rounds` times each (A B A B ...), each pair on a fresh set of topics. Every
   figure of ours is also given as a ratio of the ceiling measured next to it, with the
   load average and the processor's CPU (seconds of CPU per command, cores used).
2. Latency: command -> first event visible to a `read_committed` reader at paced rates,
   next to the raw pass-through's latency at the same rate (measured after ours)
   (`bench/bench_latency.py`), with the transaction phases.
3. Replay and rebuild over the last round's events topic: raw reading (`read_records`),
   decoded (`sessionstream.runtimes.sink.replay.read_range`), and the bulk rebuild into PostgreSQL
   (`sessionstream.runtimes.sink.rebuild`) against a sink's live projection of the same log.

    .venv/bin/python -m bench.bench_hot [--commands 40000] [--rounds 2] [--rates 1000,5000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
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
    wait_for,
)
from bench._sink_harness import SinkProc, count_rows, delete_groups, drop_schemas, fresh_schema
from bench.bench_latency import measure as measure_latency
from bench.bench_latency import with_ceiling
from sessionstream.adapters.kafka import client_config, read_messages
from sessionstream.client import SessionClient
from sessionstream.runtimes.sink.rebuild import rebuild
from sessionstream.runtimes.sink.replay import read_range, session_partition
from sessionstream.schemas.events import SESSION_LOG
from sessionstream.settings import Settings
from tests.integration.worlds import isolated_settings

RESULTS = Path(__file__).resolve().parent / "results"
now = time.perf_counter
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def backlog(s: Settings, n: int, sessions: int, seed: int) -> None:
    with SessionClient("bench", s) as client:
        wl = Workload(client, f"hot{seed}", sessions, seed)
        for _ in range(n):
            client.submit(wl.next(), track=False)
        client.flush()


def ours(s: Settings, n: int) -> dict[str, Any]:
    """`sessionstream processor` draining the backlog, timed from its first commit."""
    offsets = Offsets(s)
    target = offsets.end()
    proc = Processor(s, f"hot-{uuid.uuid4().hex[:6]}").start()
    try:
        t1, c1 = offsets.wait(lambda c: any(c.values()), proc)
        assert proc.popen is not None
        cpu1 = cpu_seconds(proc.popen.pid)
        t2, _ = offsets.wait_past(target, proc)
        cpu2 = cpu_seconds(proc.popen.pid)
    finally:
        offsets.close()
        proc.stop()
    measured = n - sum(c1.values())
    secs = t2 - t1
    return {
        "commands": n,
        "measured_commands": measured,
        "seconds": round(secs, 2),
        "commands_per_s": round(measured / secs),
        "cpu_us_per_command": round(1e6 * (cpu2 - cpu1) / measured, 1),
        "cores": round((cpu2 - cpu1) / secs, 2),
    }


def throughput(a: argparse.Namespace) -> tuple[list[dict[str, Any]], Settings]:
    rounds: list[dict[str, Any]] = []
    s = isolated_settings(Settings(), "hot", partitions=4, prefix="bench", schema=False)
    for i in range(a.rounds):
        if i:
            delete_topics_and_groups(s)
            s = isolated_settings(Settings(), "hot", partitions=4, prefix="bench", schema=False)
        out_topic = f"bench.ceiling.{uuid.uuid4().hex[:8]}"
        admin = AdminClient(client_config(s))
        admin.create_topics([NewTopic(out_topic, 4, 1)])[out_topic].result()
        try:
            backlog(s, a.commands, a.sessions, i)
            load0 = os.getloadavg()[0]
            ceiling = base.passthrough(s, out_topic, a.commands)  # A
            mine = ours(s, a.commands)  # B
            load1 = os.getloadavg()[0]
        finally:
            admin.delete_topics([out_topic], operation_timeout=30)
        r = {
            "round": i + 1,
            "ceiling_records_per_s": ceiling["records_per_s"],
            "ceiling_cores": ceiling["cores"],
            "ours": mine,
            "ratio": round(mine["commands_per_s"] / ceiling["records_per_s"], 3),
            "load_average": [round(load0, 2), round(load1, 2)],
        }
        print(json.dumps(r), flush=True)
        rounds.append(r)
    return rounds, s


def replay(s: Settings, url: str) -> dict[str, Any]:
    """Read the events back: raw; replay by offset of one session and of one run (what is
    asked is decoded, the rest skipped on its key); a whole partition decoded; then the bulk
    rebuild against a sink's live projection of the same log."""
    topic = s.events_topic
    parts = list(range(s.partitions))
    t0 = now()
    n_raw = sum(1 for _ in read_messages(s, {topic: parts}, timeout=None))
    raw_s = now() - t0
    # one session: the one with the most events in partition 0's first records
    keys = [m.key() or b"" for m in read_messages(s, {topic: [0]}, end={(topic, 0): 2000})]
    sid = max(set(k.split(b"/", 1)[0] for k in keys), key=lambda x: keys.count(x)).decode()
    part = session_partition(s, sid)
    in_part = sum(1 for _ in read_messages(s, {topic: [part]}, timeout=None))
    t0 = now()
    mine = [e for _o, e in read_range(s, None, 0, session_id=sid)]
    session_s = now() - t0
    run = next(e.run_id for e in mine if e.run_id != SESSION_LOG)
    t0 = now()
    run_events = sum(1 for _ in read_range(s, part, 0, run_id=run))
    run_s = now() - t0
    t0 = now()
    n_dec = sum(1 for _ in read_range(s, part, 0))
    dec_s = now() - t0
    prefix = f"bench_hot_{uuid.uuid4().hex[:6]}"
    schema = fresh_schema(url, prefix)
    sink = SinkProc(s, schema, "copy").start()
    try:
        wait_for(lambda: count_rows(url, schema) >= n_raw, 600, "the sink to catch up", 0.2)
    finally:
        sink.stop()
        delete_groups(s, [sink.group])
    live = s.model_copy(update={"database_schema": schema})
    t0 = now()
    report = rebuild(live)
    rebuild_s = now() - t0
    drop_schemas(url, prefix)
    return {
        "events": n_raw,
        "raw_events_per_s": round(n_raw / raw_s),
        "replay_session": {
            "events": len(mine),
            "partition_events": in_part,
            "seconds": round(session_s, 2),
            "scanned_events_per_s": round(in_part / session_s),
        },
        "replay_run": {
            "events": run_events,
            "seconds": round(run_s, 2),
            "scanned_events_per_s": round(in_part / run_s),
        },
        "partition_decoded_events_per_s": round(n_dec / dec_s),
        "rebuild": {
            "events": report.events,
            "seconds": round(rebuild_s, 2),
            "load_s": round(report.load_s, 2),
            "index_s": round(report.index_s, 2),
            "compare_s": round(report.compare_s, 2),
            "load_and_index_events_per_s": round(report.events / (report.load_s + report.index_s)),
            "events_per_s_with_comparison": round(report.events / rebuild_s),
            "equal": report.equal,
            "loaders": report.loaders,
            "started_by": report.started_by,
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--commands", type=int, default=40_000, help="backlog per round")
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2, help="A B pairs")
    ap.add_argument("--rates", default="1000,5000", help="paced latency steps ('' for none)")
    ap.add_argument("--seconds", type=float, default=15.0, help="per latency step")
    ap.add_argument("--no-replay", action="store_true")
    ap.add_argument("--save", help="also write the JSON result to bench/results/NAME.json")
    a = ap.parse_args(argv)
    out: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
        "config": vars(a),
    }
    rounds, s = throughput(a)
    try:
        ratios = [r["ratio"] for r in rounds]
        out["throughput"] = {
            "rounds": rounds,
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
        }
        if not a.no_replay:
            out["replay"] = replay(s, Settings().database_url)
            print(json.dumps(out["replay"]), flush=True)
    finally:
        delete_topics_and_groups(s)
    if a.rates:
        rates = [float(r) for r in a.rates.split(",")]
        out["latency"] = measure_latency(rates, a.seconds, 3.0, a.sessions)
        with_ceiling(out["latency"], a.seconds, 3.0)
        for r in out["latency"]:
            print(json.dumps(r), flush=True)
    out["loadavg_end"] = os.getloadavg()
    if a.save:
        (RESULTS / f"{a.save}.json").write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
