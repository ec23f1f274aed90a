"""Command -> event latency at paced rates, with where each transaction's time went.

One processor (Prometheus endpoint on), a paced producer per `--rates` step for `--seconds`
(after a warm-up), a `read_committed` tail timing each command's first event. Printed per
rate: p50 / p90 / p99 latency, the processor's transactions and their mean size, and the
mean milliseconds of each transaction phase (`sessionstream_transaction_phase_seconds`:
decide, wait (for the transaction before), begin, produce, send_offsets, outcomes (the
events acknowledged, the outcome records produced, all acknowledged), after (for the
transaction before to commit), commit, store) over that step, plus the load
average. Then, per rate, the ceiling measured the same way in the same run
(`bench/_baselines.py: passthrough_latency`: the raw transactional pass-through, no
decoding, at the same paced rate), and our p50 / p99 as multiples of it.

    .venv/bin/python -m bench.bench_latency [--rates 1000,5000] [--seconds 15] [--json]
        [--no-ceiling]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import urllib.request
from typing import Any

from bench._baselines import passthrough_latency
from bench._harness import (
    EventTail,
    PacedProducer,
    Processor,
    Workload,
    delete_topics_and_groups,
    percentiles,
)
from sessionstream.client import SessionClient
from sessionstream.settings import Settings
from tests.integration.worlds import isolated_settings

PHASES = (
    "decide",
    "wait",
    "begin",
    "produce",
    "send_offsets",
    "outcomes",
    "after",
    "commit",
    "store",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int) -> dict[str, float]:
    """Phase sums and counts, and committed transactions, from the processor's /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("sessionstream_transaction_phase_seconds_sum") or line.startswith(
            "sessionstream_transaction_phase_seconds_count"
        ):
            name, value = line.rsplit(" ", 1)
            phase = name.split('phase="')[1].split('"')[0]
            kind = "sum" if "_sum{" in name else "count"
            out[f"{phase}.{kind}"] = float(value)
        elif line.startswith("sessionstream_commands_total"):
            out["commands"] = out.get("commands", 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def with_ceiling(results: list[dict[str, Any]], seconds: float, warmup: float) -> None:
    """Add, per rate, the raw pass-through's latency at that rate (measured now) and ours
    as a multiple of it."""
    s = isolated_settings(Settings(), "latency-ceiling", prefix="bench", schema=False)
    try:
        for r in results:
            c = passthrough_latency(s, r["target_rate"], seconds, warmup)
            r["ceiling"] = c
            r["x_ceiling"] = {
                q: round(r[f"{q}_ms"] / max(c[f"{q}_ms"], 0.001), 2) for q in ("p50", "p99")
            }
    finally:
        delete_topics_and_groups(s)


def measure(
    rates: list[float], seconds: float, warmup: float, sessions: int
) -> list[dict[str, Any]]:
    """One processor; per rate, paced commands for `seconds` after `warmup`: latency and
    the transaction phases."""
    port = free_port()
    s = isolated_settings(Settings(), "latency", prefix="bench", schema=False).model_copy(
        update={"metrics_port": port}
    )
    proc = Processor(s, "latency-0").start()
    proc.wait_for("assigned", timeout=90)
    tail = EventTail(s)
    tail.start()
    results: list[dict[str, Any]] = []
    try:
        with SessionClient("bench", s) as client:
            for i, rate in enumerate(rates):
                prod = PacedProducer(client, Workload(client, f"l{i}", sessions, i), rate)
                prod.start()
                time.sleep(warmup)
                before, load0 = scrape(port), os.getloadavg()[0]
                time.sleep(seconds)
                after, load1 = scrape(port), os.getloadavg()[0]
                prod.stop()
                tail.settle(prod.sent)
                start = prod.first + warmup
                window = {c: t for c, t in prod.sent.items() if t >= start}
                lat = [tail.first_seen[c] - t for c, t in window.items() if c in tail.first_seen]
                txns = after["commit.count"] - before["commit.count"]
                results.append(
                    {
                        "target_rate": rate,
                        "achieved_rate": round(len(window) / seconds, 1),
                        "measured": len(lat),
                        **percentiles(lat),
                        "transactions_per_s": round(txns / seconds, 1),
                        "commands_per_transaction": round(
                            (after.get("commands", 0) - before.get("commands", 0)) / max(txns, 1),
                            1,
                        ),
                        "phase_ms": {
                            ph: round(
                                1000
                                * (after.get(f"{ph}.sum", 0.0) - before.get(f"{ph}.sum", 0.0))
                                / max(txns, 1),
                                2,
                            )
                            for ph in PHASES
                        },
                        "load_average": round((load0 + load1) / 2, 2),
                    }
                )
    finally:
        tail.halt.set()
        proc.kill9()
        delete_topics_and_groups(s)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rates", default="1000,5000")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-ceiling", action="store_true", help="skip the raw pass-through")
    args = ap.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    results = measure(rates, args.seconds, args.warmup, args.sessions)
    if not args.no_ceiling:
        with_ceiling(results, args.seconds, args.warmup)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
