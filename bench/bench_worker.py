"""Run workers, measured against the real broker: how fast a cancel reaches, and a takeover.

* cancel propagation: abort command (its `ts`) -> the tool observed the abort (the `ts` of
  its `tool.finished {detail: aborted}`, stamped by the worker when the tool returned);
* abort -> terminal: abort produced -> `run.finished {cancelled}` read back from the events
  topic by this script (so it includes the ack's round trip through the processor);
* takeover after kill -9, with 2 and with 4 workers sharing `--runs` runs: the kill of the
  worker holding the most -> each of its runs' next `run.lease_granted`, read back. Bounded
  below by the lease (``--lease-ms``); discovery needs no group rebalance, so where the
  run's partition sits does not matter;
* acquires per grant: `lease.acquire` commands on the commands topic per run, divided by
  the run's grants (its start, and its takeover): rendezvous ranking should make it 1, 2
  when views of who is alive differ.

Starts its own processor and workers (`sessionstream ...` subprocesses) on isolated topics.

    .venv/bin/python -m bench.bench_worker [--cancels 30] [--takeovers 3] [--runs 12]
        [--lease-ms 2500]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from sessionstream.adapters.kafka import read_topic
from sessionstream.adapters.postgres.migrate import migrate
from sessionstream.adapters.registry import reader_codec
from sessionstream.client import SessionClient
from sessionstream.schemas.events import Event, LeaseGranted
from sessionstream.settings import Settings
from tests.integration.procs import Proc, processor
from tests.integration.worlds import isolated_settings

RESULTS = Path(__file__).resolve().parent / "results" / "worker.json"


class Tail:
    """Every event of the topic, with the wall time this script first saw it."""

    def __init__(self, s: Settings) -> None:
        self.codec = reader_codec(s)
        self.c = Consumer(
            {
                "bootstrap.servers": s.kafka_bootstrap,
                "group.id": f"bench-tail-{uuid.uuid4()}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 5,
            }
        )
        self.c.assign(
            [TopicPartition(s.events_topic, p, OFFSET_BEGINNING) for p in range(s.partitions)]
        )
        self.seen: list[tuple[float, Event]] = []

    def wait(self, pred: Any, timeout: float = 60.0) -> tuple[float, Event]:
        deadline = time.monotonic() + timeout
        for item in self.seen:
            if pred(item[1]):
                return item
        while time.monotonic() < deadline:
            msg = self.c.poll(0.05)
            if msg is None or msg.error() is not None:
                continue
            item = (time.time(), self.codec.decode_event(msg.value() or b""))
            self.seen.append(item)
            if pred(item[1]):
                return item
        raise TimeoutError("event not seen")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def summary(xs: list[float]) -> dict[str, float]:
    return {
        "n": len(xs),
        "p50_ms": round(pct(xs, 0.5), 1),
        "p99_ms": round(pct(xs, 0.99), 1),
        "max_ms": round(max(xs), 1),
        "mean_ms": round(statistics.fmean(xs), 1),
    }


def worker(s: Settings, wid: str, lease_ms: int) -> Proc:
    return Proc(
        s,
        "worker",
        "--worker-id",
        wid,
        "--lease-ms",
        str(lease_ms),
    ).start()


def ready(p: Proc) -> None:
    p.wait_log("ready:", timeout=60)


def bench_cancels(s: Settings, n: int, lease_ms: int) -> tuple[list[float], list[float]]:
    procs = [processor(s), worker(s, "bench-w1", lease_ms)]
    tail = Tail(s)
    propagation: list[float] = []
    terminal: list[float] = []
    try:
        ready(procs[1])
        with SessionClient("bench", s) as c:
            for i in range(n):
                sid = f"bench-cancel-{i}"
                out = c.wait(c.prompt(sid, "steps=1 tool_ms=20000 email=no"), timeout=60)
                run_id = out.run_id
                tail.wait(lambda e, r=run_id: e.run_id == r and e.type == "tool.started")
                abort = c.command(sid, "abort", {"reason": "bench"})
                c.submit(abort, track=False)
                c.flush()
                sent = abort.ts / 1000
                tool_end = tail.wait(
                    lambda e, r=run_id: e.run_id == r and e.type == "tool.finished"
                )
                seen, fin = tail.wait(
                    lambda e, r=run_id: e.run_id == r and e.type == "run.finished"
                )
                assert fin.payload.model_dump()["terminal_status"] == "cancelled", fin
                propagation.append(tool_end[1].ts - abort.ts)
                terminal.append((seen - sent) * 1000)
    finally:
        for p in procs:
            p.stop()
    return propagation, terminal


def _acquires(s: Settings, run_ids: set[str]) -> dict[str, int]:
    """lease.acquire commands sent per run (read back from the worker-commands topic)."""
    codec = reader_codec(s)
    out = dict.fromkeys(run_ids, 0)
    for r in read_topic(s, s.worker_commands_topic):
        try:
            cmd = codec.decode_command(r.value or b"")
        except Exception:  # a record of another kind is none of ours
            continue
        if cmd.type == "lease.acquire" and cmd.run_id in out:
            out[cmd.run_id] += 1
    return out


def bench_takeovers(
    base: Settings, workers: int, rounds: int, runs: int, lease_ms: int
) -> dict[str, Any]:
    """`workers` workers share `runs` long runs; the one holding the most is killed -9.
    Every one of its runs: kill -> its next lease grant, as this script saw it."""
    s = _iso(base, f"bench-takeover-{workers}w")
    procs = [processor(s)]
    tail = Tail(s)
    takeovers: list[float] = []
    all_runs: set[str] = set()
    try:
        pool = {f"w{i}": worker(s, f"w{i}", lease_ms) for i in range(workers)}
        procs += pool.values()
        for p in pool.values():
            ready(p)
        for k in range(rounds):
            with SessionClient("bench", s) as c:
                handles = [
                    c.prompt(f"bench-to-{workers}-{k}-{i}", "steps=1 tool_ms=60000 email=no")
                    for i in range(runs)
                ]
                ids = [c.wait(h, timeout=60).run_id for h in handles]
            batch = {r for r in ids if r}
            all_runs |= batch
            holder: dict[str, str] = {}
            for r in batch:
                _t, g = tail.wait(lambda e, r=r: e.run_id == r and e.type == "run.lease_granted")
                holder[r] = g.payload_as(LeaseGranted).worker_id
            victim = max(pool, key=lambda w: sum(1 for h in holder.values() if h == w))
            theirs = [r for r, w in holder.items() if w == victim]
            killed = time.time()
            pool[victim].kill9()
            for r in theirs:
                seen, _g = tail.wait(
                    lambda e, r=r, v=victim: (
                        e.run_id == r
                        and e.type == "run.lease_granted"
                        and e.payload_as(LeaseGranted).worker_id != v
                    )
                )
                takeovers.append((seen - killed) * 1000)
            print(
                f"  {workers} workers, round {k}: {victim} held {len(theirs)} runs; takeover "
                f"max {max(takeovers[-len(theirs) :], default=0):.0f} ms"
            )
            pool[victim] = worker(s, victim, lease_ms)
            procs.append(pool[victim])
            ready(pool[victim])
            with SessionClient("bench", s) as c:  # free the workers for the next round
                for i, r in enumerate(ids):
                    c.submit(
                        c.command(f"bench-to-{workers}-{k}-{i}", "abort", {}, run_id=r),
                        track=False,
                    )
                c.flush()
        sent = _acquires(s, all_runs)
        grants = dict.fromkeys(all_runs, 0)
        for _t, e in tail.seen:
            if e.type == "run.lease_granted" and e.run_id in grants:
                grants[e.run_id] += 1
        # acquires per time the run needed a holder (its start, each takeover)
        counts = sorted(sent[r] / max(1, grants[r]) for r in all_runs)
    finally:
        for p in procs:
            p.stop()
    return {
        "workers": workers,
        "takeover": summary(takeovers),
        "within_lease_plus_1s": sum(1 for t in takeovers if t <= lease_ms + 1000),
        "acquires_per_grant": {
            "p50": pct(counts, 0.5),
            "p99": pct(counts, 0.99),
            "max": max(counts),
            "runs": len(counts),
        },
    }


def _iso(base: Settings, tag: str) -> Settings:
    return isolated_settings(base, tag)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cancels", type=int, default=30)
    ap.add_argument("--takeovers", type=int, default=3, help="kill rounds per worker count")
    ap.add_argument("--runs", type=int, default=12, help="runs shared by the workers per round")
    ap.add_argument("--lease-ms", type=int, default=2500)
    args = ap.parse_args()
    base = Settings()
    migrate(base.database_url)

    propagation, terminal = bench_cancels(_iso(base, "bench-cancel"), args.cancels, args.lease_ms)
    takeovers = [bench_takeovers(base, w, args.takeovers, args.runs, args.lease_ms) for w in (2, 4)]
    result = {
        "cancel_propagation_abort_to_tool": summary(propagation),
        "abort_to_terminal_cancelled": summary(terminal),
        "takeover_after_kill9": {f"{t['workers']}_workers": t for t in takeovers},
        "lease_ms": args.lease_ms,
        "discovery": "open-runs topic + presence, rendezvous ranking (no consumer group)",
    }
    for name, value in result.items():
        print(f"{name}: {value}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
