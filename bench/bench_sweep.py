"""Latency against load, and throughput against partitions and processor instances.

1. Latency vs load: one processor on 4 partitions, paced producer commands (the processor
   bench's mix) at each rate of `--rates` for `--seconds` after a warm-up; send -> first event
   of the command visible to a `read_committed` consumer, p50/p90/p99 (HdrHistogram). Plot:
   `bench/results/latency_vs_load.png`.
2. Scale: for each partition count in `--partitions` and instance count in `--instances`,
   fresh topics, the processors started and assigned first, then `--commands` produced as fast
   as the client goes; commands/s from the first send to all committed (group offsets).

    .venv/bin/python -m bench.bench_sweep [--quick] [--json] [--no-save]
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

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench._harness import (
    CpuMeter,
    EventTail,
    Offsets,
    PacedProducer,
    Processor,
    Workload,
    broker_pid,
    delete_topics_and_groups,
    percentiles,
    wait_for,
)
from sessionstream.client import SessionClient
from sessionstream.settings import Settings
from tests.integration.worlds import isolated_settings

RESULTS = Path(__file__).resolve().parent / "results"
PNG = RESULTS / "latency_vs_load.png"
now = time.perf_counter


def latency_sweep(rates: list[float], seconds: float, warmup: float) -> list[dict[str, Any]]:
    s = isolated_settings(Settings(), "sweep", partitions=4, prefix="bench", schema=False)
    client = SessionClient("bench", s)
    proc = Processor(s, f"bench-{uuid.uuid4().hex[:6]}").start()
    tail = EventTail(s)
    out = []
    try:
        wait_for(lambda: " assigned [" in proc.log_text(), 60, "the processor's assignment")
        tail.start()
        for i, r in enumerate(rates):
            proc.assert_alive()
            prod = PacedProducer(client, Workload(client, f"r{i}", 500, 10 + i), r)
            prod.start()
            time.sleep(warmup)
            meter = CpuMeter(proc.pid, broker_pid())
            time.sleep(seconds)
            cpu = meter.read()
            prod.stop()
            missing = tail.settle(prod.sent, timeout=60)
            start = prod.first + warmup
            window = {c: t for c, t in prod.sent.items() if t >= start}
            seen = tail.first_seen
            lat = [seen[c] - t for c, t in window.items() if c in seen]
            out.append(
                {
                    "target_rate": r,
                    "achieved_rate": round((len(window) - 1) / (prod.last - start), 1),
                    "producer_late_max_ms": round(prod.late_max * 1000, 1),
                    "seconds": seconds,
                    "measured": len(lat),
                    "missing_outcomes": missing,
                    **percentiles(lat),
                    **cpu,
                }
            )
    finally:
        if tail.is_alive():
            tail.stop()
        proc.stop()
        client.close()
        delete_topics_and_groups(s)
    return out


def scale_run(partitions: int, instances: int, n: int) -> dict[str, Any]:
    s = isolated_settings(
        Settings(),
        f"scale{partitions}x{instances}",
        partitions=partitions,
        prefix="bench",
        schema=False,
    )
    client = SessionClient("bench", s)
    tag = uuid.uuid4().hex[:6]
    procs = [Processor(s, f"bench-{tag}-{i}").start() for i in range(instances)]
    offsets = Offsets(s)
    try:

        def assigned() -> bool:
            for p in procs:
                p.assert_alive()
            return all(" assigned [" in p.log_text() for p in procs)

        wait_for(assigned, 90, "every processor's assignment", 0.1)
        time.sleep(1.0)  # a late joiner's rebalance settles
        wl = Workload(client, "scale", 500, 5)
        cpu0 = sum(p.cpu() for p in procs)
        t0 = now()
        for _ in range(n):
            client.submit(wl.next(), track=False)
        client.flush()
        produce_s = now() - t0
        target = offsets.end()

        def done() -> bool:
            for p in procs:
                p.assert_alive()
            c = offsets.committed()
            return all(c[p] >= o for p, o in target.items())

        t1 = wait_for(done, 300, "every command committed", 0.02)
        secs = t1 - t0
        return {
            "partitions": partitions,
            "instances": instances,
            "commands": n,
            "produce_s": round(produce_s, 2),
            "seconds": round(secs, 2),
            "commands_per_s": round(n / secs),
            "processor_cores": round((sum(p.cpu() for p in procs) - cpu0) / secs, 2),
        }
    finally:
        offsets.close()
        for p in procs:
            p.stop()
        client.close()
        delete_topics_and_groups(s)


def plot(points: list[dict[str, Any]], path: Path) -> None:
    x = [p["achieved_rate"] for p in points]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for key, label, style in (
        ("p50_ms", "p50", "o-"),
        ("p90_ms", "p90", "s--"),
        ("p99_ms", "p99", "^-"),
    ):
        ax.plot(x, [p[key] for p in points], style, label=label)
    ax.set_xlabel("offered load (commands/s)")
    ax.set_ylabel("command -> event visible (ms, log scale)")
    ax.set_title("sessionstream processor: latency vs load (1 processor, 4 partitions, EOS)")
    ax.set_yscale("log")  # the knee spans two orders of magnitude
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def markdown(r: dict[str, Any]) -> str:
    lines = [
        "| load target (cmd/s) | achieved | p50 ms | p90 ms | p99 ms | processor cores |",
        "|---|---|---|---|---|---|",
    ]
    for p in r["latency_vs_load"]:
        lines.append(
            f"| {p['target_rate']:g} | {p['achieved_rate']} | {p['p50_ms']} | {p['p90_ms']} "
            f"| {p['p99_ms']} | {p['processor_cores']} |"
        )
    lines += ["", "| partitions | instances | cmd/s | processor cores |", "|---|---|---|---|"]
    for p in r["scale"]:
        lines.append(
            f"| {p['partitions']} | {p['instances']} | {p['commands_per_s']:,} "
            f"| {p['processor_cores']} |"
        )
    return "\n".join(lines) + "\n"


def ints(v: str) -> list[int]:
    return [int(x) for x in v.split(",")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter steps (~1.5 min)")
    ap.add_argument(
        "--rates",
        type=lambda v: [float(x) for x in v.split(",")],
        default=[250.0, 500.0, 1000.0, 2000.0],
    )
    ap.add_argument("--seconds", type=float, help="measured per rate (default 8; quick 5)")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--partitions", type=ints, default=[1, 4, 8])
    ap.add_argument("--instances", type=ints, default=[1, 2])
    ap.add_argument("--commands", type=int, help="per scale run (default 10000; quick 5000)")
    ap.add_argument("--no-scale", action="store_true", help="only the latency sweep")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument(
        "--save",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write bench/results/sweep.{json,md} and the PNG (default: yes)",
    )
    a = ap.parse_args(argv)
    a.seconds = a.seconds or (5.0 if a.quick else 8.0)
    a.commands = a.commands or (5000 if a.quick else 10_000)
    r: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()},
        "config": {k: v for k, v in vars(a).items() if k not in ("json", "save")},
    }
    t0 = now()
    r["latency_vs_load"] = latency_sweep(a.rates, a.seconds, a.warmup)
    r["scale"] = (
        []
        if a.no_scale
        else [scale_run(p, i, a.commands) for p in a.partitions for i in a.instances]
    )
    r["seconds"] = round(now() - t0, 1)
    r["host"]["loadavg_end"] = os.getloadavg()
    if a.save:
        RESULTS.mkdir(exist_ok=True)
        plot(r["latency_vs_load"], PNG)
        r["plot"] = PNG.name
        (RESULTS / "sweep.json").write_text(json.dumps(r, indent=2) + "\n")
        (RESULTS / "sweep.md").write_text(markdown(r))
    print(json.dumps(r) if a.json else markdown(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
