"""Run workers, measured against the real broker: how fast a cancel reaches, and a takeover.

* cancel propagation: abort command (its `ts`) -> the tool observed the abort (the `ts` of
  its `tool.finished {detail: aborted}`, stamped by the worker when the tool returned);
* abort -> terminal: abort produced -> `run.finished {cancelled}` read back from the events
  topic by this script (so it includes the ack's round trip through the processor);
* takeover after kill -9: the kill -> `run.lease_granted` of generation 2 read back. It is
  bounded below by the lease (``--lease-ms``) and, when the dead worker owned the run's
  partition, by the worker group's session timeout (6 s).

Starts its own processor and workers (`sessionstream ...` subprocesses) on isolated topics.

    .venv/bin/python bench/bench_worker.py [--cancels 30] [--takeovers 3] [--lease-ms 2500]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from schemas.codec import Codec
from schemas.events import Event, LeaseGranted
from sessionstream.client import SessionClient
from sessionstream.settings import Settings
from sinks.migrate import migrate
from streams.partitioning import partition_for
from tests.integration.procs import Proc, isolated_settings, processor

RESULTS = Path(__file__).resolve().parent / "results" / "worker.json"


class Tail:
    """Every event of the topic, with the wall time this script first saw it."""

    def __init__(self, s: Settings) -> None:
        self.codec = Codec()
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
        "--group",
        s.worker_group,
        "--lease-ms",
        str(lease_ms),
    ).start()


def ready(p: Proc) -> None:
    deadline = time.monotonic() + 60
    while "worker assigned" not in p.log_text():
        p.assert_alive()
        if time.monotonic() > deadline:
            raise TimeoutError("worker not assigned")
        time.sleep(0.1)


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


def _owned(p: Proc) -> set[int]:
    """Partitions the worker's last assignment named (its log: `worker assigned [..]`)."""
    lines = [ln for ln in p.log_text().splitlines() if "worker assigned" in ln]
    return set(json.loads(lines[-1].split("worker assigned ", 1)[1])) if lines else set()


def bench_takeovers(base: Settings, n: int, lease_ms: int) -> list[dict[str, Any]]:
    """Each round: a victim alone takes a run, a standby joins, the victim is killed."""
    out: list[dict[str, Any]] = []
    for i in range(n):
        s = _iso(base, f"bench-takeover-{i}")
        procs = [processor(s)]
        tail = Tail(s)
        try:
            victim = worker(s, "victim", lease_ms)
            procs.append(victim)
            ready(victim)
            sid = f"bench-takeover-{i}"
            with SessionClient("bench", s) as c:
                run_id = c.wait(c.prompt(sid, "steps=1 tool_ms=30000 email=no")).run_id
                tail.wait(lambda e, r=run_id: e.run_id == r and e.type == "tool.started")
                standby = worker(s, "standby", lease_ms)
                procs.append(standby)
                ready(standby)
                on_standby = partition_for(sid.encode(), s.partitions) in _owned(standby)
                killed = time.time()
                victim.kill9()
                seen, g = tail.wait(
                    lambda e, r=run_id: (
                        e.run_id == r and e.type == "run.lease_granted" and e.generation == 2
                    )
                )
                assert g.payload_as(LeaseGranted).worker_id == "standby"
                ms = (seen - killed) * 1000
                out.append({"ms": round(ms, 1), "partition_on_standby": on_standby})
                print(f"  takeover {i}: {ms:.0f} ms (partition on standby: {on_standby})")
                c.abort(sid)
        finally:
            for p in procs:
                p.stop()
    return out


def _iso(base: Settings, tag: str) -> Settings:
    s = isolated_settings(base, tag)
    return s.model_copy(update={"worker_group": f"bench-workers-{uuid.uuid4().hex[:8]}"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cancels", type=int, default=30)
    ap.add_argument("--takeovers", type=int, default=3)
    ap.add_argument("--lease-ms", type=int, default=2500)
    args = ap.parse_args()
    base = Settings()
    migrate(base.database_url)

    propagation, terminal = bench_cancels(_iso(base, "bench-cancel"), args.cancels, args.lease_ms)
    takeovers = bench_takeovers(base, args.takeovers, args.lease_ms)
    result = {
        "cancel_propagation_abort_to_tool": summary(propagation),
        "abort_to_terminal_cancelled": summary(terminal),
        "takeover_after_kill9": summary([t["ms"] for t in takeovers]),
        "takeover_rounds": takeovers,
        "lease_ms": args.lease_ms,
        "group_session_timeout_ms": 6000,
    }
    for name, value in result.items():
        print(f"{name}: {value}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
