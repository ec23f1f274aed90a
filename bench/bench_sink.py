"""PostgreSQL sink benchmark: COPY vs pipelined executemany, and command -> row latency.

1. Writer: `write_batch` (events + projection + offsets, one transaction per batch) over a
   real event log — the decider bench's command cycle run through `sessionstream.core.decider.apply`
   on 1000 sessions — into a fresh schema per run, per mode and batch size, 3 times, modes
   in alternating order: best and median. Also the events insert alone (step 1 of
   `write_batch`, the only part the modes differ in) at the sink's default batch.
2. End to end: the same commands through a processor onto isolated topics, then a
   `sessionstream sink --mode M` per mode (twice, A B B A), each on a fresh schema and group,
   reading the events topic from offset 0: rows/s from its first batch to the last row.
3. Latency: with the copy-mode sink (default batch and linger) caught up, producer commands
   at a steady 500/s for 20 s; per command, send -> first row visible in PostgreSQL, found
   by polling `agent_run_events` every 5 ms (so up to ~5 ms of each number is the poll);
   send -> first event visible to a `read_committed` Kafka consumer alongside, for the
   sink's share.
Parts 2 and 3 run first (the most sensitive to a busy machine), then part 1.

    .venv/bin/python -m bench.bench_sink [--quick] [--json] [--no-save]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from bench._harness import (
    CpuMeter,
    EventTail,
    Offsets,
    PacedProducer,
    Processor,
    Workload,
    broker_pid,
    cpu_seconds,
    delete_topics_and_groups,
    percentiles,
    wait_for,
)
from bench._sink_harness import (
    RowPoller,
    SinkProc,
    connect,
    delete_groups,
    drop_schemas,
    event_log,
    fresh_schema,
    sink_run,
    workload,
)
from sessionstream.adapters.kafka import read_topic
from sessionstream.client import SessionClient
from sessionstream.runtimes.sink.writer import PendingEvent, WriteMode, _insert_events, write_batch
from sessionstream.schemas.commands import Command
from sessionstream.settings import Settings
from tests.integration.worlds import isolated_settings

RESULTS = Path(__file__).resolve().parent / "results"
MODES: tuple[WriteMode, ...] = ("copy", "executemany")
DEFAULT_BATCH, DEFAULT_LINGER_MS = 1000, 20  # `sessionstream sink` defaults
now = time.perf_counter


# -- 1. the writer ------------------------------------------------------------------------------
def time_writes(
    url: str, prefix: str, log: list[PendingEvent], mode: WriteMode, batch: int, only: bool
) -> tuple[float, float]:
    """Seconds (wall, client CPU) to write `log` in batches into a fresh schema."""
    for attempt in range(3):
        schema = fresh_schema(url, prefix)
        try:
            with connect(url, schema) as conn:
                t0, c0 = now(), time.process_time()
                for i in range(0, len(log), batch):
                    if only:  # step 1 of write_batch alone, in its own transaction
                        with conn.transaction(), conn.cursor() as cur:
                            _insert_events(cur, log[i : i + batch], mode)
                    else:
                        write_batch(conn, log[i : i + batch], mode)
                wall, cpu = now() - t0, time.process_time() - c0
                row = conn.execute("select count(*) from agent_run_events").fetchone()
            assert row and row[0] == len(log), f"{mode}/{batch}: {row} rows, {len(log)} events"
            drop_schemas(url, schema)
            return wall, cpu
        except psycopg.OperationalError as e:  # the shared database restarted: run again
            print(f"{mode}/{batch}: {e}; again (attempt {attempt + 2})", file=sys.stderr)
            time.sleep(5)
    raise RuntimeError("PostgreSQL kept failing")


def writer_throughput(
    url: str, prefix: str, log: list[PendingEvent], sizes: list[int], reps: int
) -> dict[str, Any]:
    runs: dict[str, dict[str, list[tuple[float, float]]]] = {m: {} for m in MODES}
    only: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    for rep in range(reps):
        for i, size in enumerate(sizes):
            for mode in MODES if (rep + i) % 2 == 0 else MODES[::-1]:
                took = time_writes(url, prefix, log, mode, size, False)
                runs[mode].setdefault(str(size), []).append(took)
        for mode in MODES if rep % 2 == 0 else MODES[::-1]:
            only[mode].append(time_writes(url, prefix, log, mode, DEFAULT_BATCH, True))

    def summary(samples: list[tuple[float, float]]) -> dict[str, Any]:
        n = len(log)
        rates = [n / w for w, _ in samples]
        return {
            "rows_per_s": round(statistics.median(rates)),
            "best_rows_per_s": round(max(rates)),
            "runs_rows_per_s": [round(r) for r in rates],
            "client_cpu_us_per_row": round(statistics.median(c for _, c in samples) / n * 1e6, 1),
        }

    return {
        "events": len(log),
        "sessions": len({p.event.session_id for p in log}),
        "reps": reps,
        "write_batch": {m: {b: summary(v) for b, v in runs[m].items()} for m in MODES},
        f"events_insert_only_batch_{DEFAULT_BATCH}": {m: summary(only[m]) for m in MODES},
    }


# -- 2. end to end, 3. latency -----------------------------------------------------------------
def latency(b: Bench, schema: str, sink: SinkProc) -> dict[str, Any]:
    a, proc = b.args, b.proc
    assert proc is not None
    poller = RowPoller(b.s.database_url, schema, a.poll_ms / 1000)
    tail = EventTail(b.s)
    poller.start()
    tail.start()
    prod = PacedProducer(b.client, Workload(b.client, "lat", a.lat_sessions, 3), a.rate)
    prod.start()
    time.sleep(a.warmup)
    meter, s0, t0 = CpuMeter(proc.pid, b.broker), cpu_seconds(sink.pid), now()
    time.sleep(a.seconds)
    cpu = meter.read()
    cpu["sink_cores"] = round((cpu_seconds(sink.pid) - s0) / (now() - t0), 2)
    prod.stop()
    start = prod.first + a.warmup
    window = {c: t for c, t in prod.sent.items() if t >= start}
    with contextlib.suppress(TimeoutError):  # reported as missing below
        wait_for(lambda: all(c in poller.first_seen for c in window), 30, "every command's row")
    poller.stop()
    tail.stop()
    rows = [poller.first_seen[c] - t for c, t in window.items() if c in poller.first_seen]
    kafka = [tail.first_seen[c] - t for c, t in window.items() if c in tail.first_seen]
    return {
        "target_rate": a.rate,
        "achieved_rate": round((len(window) - 1) / (prod.last - start), 1),
        "seconds": a.seconds,
        "warmup_s": a.warmup,
        "sink": {"mode": "copy", "batch_size": DEFAULT_BATCH, "linger_ms": DEFAULT_LINGER_MS},
        "poll_interval_ms": a.poll_ms,
        "measured": len(rows),
        "missing_rows": len(window) - len(rows),
        "command_to_row": percentiles(rows),
        "command_to_kafka_event": percentiles(kafka),
        **cpu,
    }


class Bench:
    def __init__(self, args: argparse.Namespace, prefix: str) -> None:
        self.args, self.prefix = args, prefix
        self.s = isolated_settings(Settings(), "sink", partitions=4, prefix="bench", schema=False)
        self.client = SessionClient("bench", self.s)
        self.proc: Processor | None = None
        self.broker = broker_pid()
        self.schemas: list[str] = []
        self.sinks: list[SinkProc] = []

    def end_to_end(self, commands: list[Command]) -> tuple[dict[str, Any], SinkProc]:
        # restamped to now: leases dated at the decider bench's (past) clock would expire at
        # once and add timer commands; run ids derive from the command ids, not the time
        base = int(time.time() * 1000)
        proc = self.proc = Processor(self.s, f"bench-{uuid.uuid4().hex[:6]}").start()
        for i, cmd in enumerate(commands):
            self.client.submit(cmd.model_copy(update={"ts": base + i}), track=False)
        self.client.flush()
        offsets = Offsets(self.s)

        def processed() -> bool:
            proc.assert_alive()
            return offsets.lag()[0] == 0

        try:
            wait_for(processed, 300, "the processor to decide every command")
        finally:
            offsets.close()
        n_events = len(read_topic(self.s, self.s.events_topic))
        out: dict[str, Any] = {"commands": len(commands), "events": n_events}
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
        sink = None
        # A B B A, copy last: it stays up (caught up) for the latency phase
        for mode in ("copy", "executemany", "executemany", "copy")[4 - 2 * self.args.e2e_reps :]:
            if sink is not None:
                sink.stop()
            self.schemas.append(fresh_schema(self.s.database_url, self.prefix))
            sink, run = sink_run(self.s, self.schemas[-1], mode, n_events)
            runs[mode].append(run)
            self.sinks.append(sink)
        for mode, rs in runs.items():
            best = max(rs, key=lambda r: r["rows_per_s"])
            out[mode] = {**best, "runs_rows_per_s": [r["rows_per_s"] for r in rs]}
        assert sink is not None
        return out, sink

    def close(self, keep: bool) -> list[str]:
        for sink in self.sinks:
            sink.stop()
        if self.proc is not None:
            self.proc.stop()
        self.client.close()
        return [] if keep else delete_topics_and_groups(self.s)

    def groups(self) -> list[str]:
        """Ours, deleted at the very end (the processor's outlives it by a session timeout)."""
        s = self.s
        return [s.processor_group, f"{s.processor_group}-restore", *(k.group for k in self.sinks)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    url = Settings().database_url
    out: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()},
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "save")},
    }
    prefix = f"bench_sink_{uuid.uuid4().hex[:6]}"  # every schema of this run
    commands = workload(args.sessions, args.cycles)
    log = event_log(commands)
    b: Bench | None = None
    closed, out["cleanup_failures"] = False, []
    try:
        # the Kafka parts first: they are the most sensitive to a busy machine
        b, load = Bench(args, prefix), os.getloadavg()[0]
        out["end_to_end"], sink = b.end_to_end(commands)
        out["end_to_end"]["loadavg_1m_start"] = load
        load = os.getloadavg()[0]
        out["latency"] = latency(b, b.schemas[-1], sink)
        out["latency"]["loadavg_1m_start"] = load
        out["cleanup_failures"] = b.close(args.keep)  # nothing of ours runs in part 1
        closed, load, t0 = True, os.getloadavg()[0], now()
        out["writer"] = writer_throughput(url, prefix, log, args.batch_sizes, args.reps)
        out["writer"].update(seconds=round(now() - t0, 1), loadavg_1m_start=load)
    finally:
        if b is not None and not closed:
            out["cleanup_failures"] = b.close(args.keep)
        if not args.keep:
            drop_schemas(url, prefix)
            if b is not None:
                out["cleanup_failures"] += delete_groups(b.s, b.groups())
        out["host"]["loadavg_end"] = os.getloadavg()
    return out


def markdown(r: dict[str, Any]) -> str:
    w, e, la, h = r["writer"], r["end_to_end"], r["latency"], r["host"]
    sizes, only = list(w["write_batch"]["copy"]), w[f"events_insert_only_batch_{DEFAULT_BATCH}"]
    fast, slow = sorted(MODES, key=lambda m: -e[m]["rows_per_s"])
    out = [
        f"# Sink benchmark ({r['when']})\n\n{h['cpus']} CPUs shared with Kafka, PostgreSQL and "
        "whatever else runs; 1-minute load average at the start of parts 1/2/3: "
        f"{w['loadavg_1m_start']:.2f} / {e['loadavg_1m_start']:.2f} / {la['loadavg_1m_start']:.2f}"
        ". From `bench/bench_sink.py`; all numbers in `sink.json`.\n",
        f"## 1. `write_batch` rows/s: {w['events']:,} events of {w['sessions']:,} sessions, best"
        f" of {w['reps']} (median), a fresh schema per run\n",
        "| mode | " + " | ".join(f"batch {s}" for s in sizes) + " | events insert only |",
        "|---" * (len(sizes) + 2) + "|",
    ]
    for m in MODES:
        x = [*(w["write_batch"][m][s] for s in sizes), only[m]]
        out.append(
            f"| {m} | "
            + " | ".join(f"{c['best_rows_per_s']:,} ({c['rows_per_s']:,})" for c in x)
            + " |"
        )
    out += [
        f"\n## 2. Kafka -> `sessionstream sink` -> rows: {e['events']:,} events, batch "
        f"{DEFAULT_BATCH}, linger {DEFAULT_LINGER_MS} ms\n",
        "| mode | rows/s (best run) | all runs | sink CPU cores |\n|---|---|---|---|",
        *(
            f"| {m} | **{x['rows_per_s']:,}** | {x['runs_rows_per_s']} | {x['sink_cores']} |"
            for m, x in ((m, e[m]) for m in MODES)
        ),
        f"\nFaster end to end: **{fast}**, {e[fast]['rows_per_s'] / e[slow]['rows_per_s']:.2f}x.",
        f"\n## 3. Command -> row at {la['achieved_rate']} commands/s ({la['seconds']:g} s, "
        f"{la['measured']:,} commands, {la['missing_rows']} missing)\n",
        f"copy, batch {DEFAULT_BATCH}, linger {DEFAULT_LINGER_MS} ms. Rows found by polling "
        f"PostgreSQL every {la['poll_interval_ms']:g} ms, which adds up to that much.\n",
        "| send -> | p50 | p90 | p99 | p99.9 | max |\n|---|---|---|---|---|---|",
    ]
    for name, key in (
        ("row in PostgreSQL", "command_to_row"),
        ("event in Kafka", "command_to_kafka_event"),
    ):
        q = (la[key][k] for k in ("p50_ms", "p90_ms", "p99_ms", "p99.9_ms", "max_ms"))
        out.append(f"| {name} | " + " | ".join(f"{v:.1f} ms" for v in q) + " |")
    out.append(
        f"\nCores busy: processor {la['processor_cores']}, sink {la['sink_cores']}, broker "
        f"{la['broker_cores']}, machine {la['machine_busy_cores']}.\n"
    )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a ~40 s run with smaller numbers")
    ap.add_argument("--sessions", type=int, help="event-log sessions (default 1000; quick 150)")
    ap.add_argument("--cycles", type=int, default=1, help="16-command cycles per session")
    ap.add_argument("--batch-sizes", type=lambda v: [int(x) for x in v.split(",")])
    ap.add_argument("--reps", type=int, help="writer repetitions (default 3; quick 1)")
    ap.add_argument("--e2e-reps", type=int, choices=(1, 2), help="sink runs per mode (2; 1)")
    ap.add_argument("--rate", type=float, default=500.0, help="latency phase commands/s")
    ap.add_argument("--seconds", type=float, help="latency measured (default 20; quick 5)")
    ap.add_argument("--warmup", type=float, default=2.0, help="latency warm-up seconds")
    ap.add_argument("--lat-sessions", type=int, default=500, help="latency phase sessions")
    ap.add_argument("--poll-ms", type=float, default=5.0, help="PostgreSQL poll interval")
    ap.add_argument("--keep", action="store_true", help="keep topics and schemas")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument(
        "--save",
        action=argparse.BooleanOptionalAction,
        help="write bench/results/sink.{json,md} (default: yes, except with --quick)",
    )
    args = ap.parse_args(argv)
    for name, full, quick in (
        ("sessions", 1000, 150),
        ("batch_sizes", [100, 500, 1000, 2000], [100, 1000]),
        ("reps", 3, 1),
        ("e2e_reps", 2, 1),
        ("seconds", 20.0, 5.0),
    ):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    result = run(args)
    if args.save if args.save is not None else not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "sink.json").write_text(json.dumps(result, indent=2) + "\n")
        (RESULTS / "sink.md").write_text(markdown(result))
    print(json.dumps(result) if args.json else markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
