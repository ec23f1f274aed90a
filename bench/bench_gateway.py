"""The gateway under load: N concurrent SSE clients and R POST/s, on this machine.

An isolated world (topics, PostgreSQL schema) with a real processor, sink and gateway. The
load comes from this process (aiohttp): `--sse` clients each follow one session's events
over SSE, while commands are POSTed open-loop at `--rate` per second to those sessions
(per session: a prompt, then an abort: 1 and 2 events; no worker, so an abort cancels at
once). A `read_committed` Kafka consumer in this process tails the events topic as the
baseline: when a command's events became visible to any reader (the processor's own
command -> event latency, measured in the same run).

Printed and saved to bench/results/gateway.md:
- POST -> outcome (the HTTP response, which waits for the command's events): p50/p99;
- command -> event at the direct Kafka reader, and at the SSE clients (p50/p99), and the
  gateway's share: SSE arrival - direct arrival of the same event (p50/p99);
- by wall clock, per command: built in the gateway (its `ts`) -> its first event produced
  by the processor (the record's timestamp) -> visible to the direct reader (p50/p99),
  which leaves out the HTTP side of the POST;
- the gateway's RSS (start, peak, end) and CPU.

    .venv/bin/python -m bench.bench_gateway [--sse 200] [--rates 100,250,500] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
from confluent_kafka import Consumer, TopicPartition

from bench._harness import CpuMeter, broker_pid, machine_busy, percentiles
from sessionstream.adapters.kafka import reader_config, take
from sessionstream.adapters.postgres.migrate import migrate
from sessionstream.adapters.registry import reader_codec
from sessionstream.apps._model_server import free_port
from sessionstream.apps._procs import Service
from sessionstream.apps.gateway.keys import create_key
from sessionstream.core.partitioning import partition_for
from sessionstream.settings import Settings
from stack.worlds import delete_world
from tests.integration.worlds import isolated_settings

#: partitions of the benchmark's topics
PARTITIONS = 4

RESULTS = Path(__file__).resolve().parent / "results"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class DirectTail(threading.Thread):
    """Every event's arrival at a plain read_committed consumer, by event key."""

    def __init__(self, s: Settings) -> None:
        super().__init__(daemon=True)
        self.s = s
        self.seen: dict[str, float] = {}
        self.first_of_command: dict[str, float] = {}
        #: per command, its first event's wall-clock times (ms): the command's `ts` (set
        #: by the gateway when it built the command), the event record's timestamp (when
        #: the processor produced it) and its arrival here
        self.wall_of_command: dict[str, tuple[int, int, float]] = {}
        self.stop = threading.Event()
        self.ready = threading.Event()

    def run(self) -> None:
        c = Consumer(reader_config(self.s, fetch_wait_ms=5))
        topic = self.s.events_topic
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        c.assign([TopicPartition(topic, p, o) for p, o in ends.items()])
        codec = reader_codec(self.s)
        self.ready.set()
        while not self.stop.is_set():
            for msg in take(c, 500, 0.05):
                if msg.error() is not None:
                    continue
                now = time.perf_counter()
                key = (msg.key() or b"").decode()
                self.seen.setdefault(key, now)
                e = codec.decode_event(msg.value() or b"")
                cmd = f"{e.session_id}/{e.command_id}"
                self.first_of_command.setdefault(cmd, now)
                if cmd not in self.wall_of_command:
                    self.wall_of_command[cmd] = (
                        e.producer_ts,
                        msg.timestamp()[1],
                        time.time() * 1000,
                    )
        c.close()


class Load:
    def __init__(self, url: str, key: str, sessions: list[str]) -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {key}"}
        self.sessions = sessions
        self.sse_seen: dict[str, float] = {}
        self.sse_connected = 0
        self.sse_errors: Counter[str] = Counter()
        self.sent_at: dict[str, float] = {}
        self.post_ms: list[float] = []
        self.post_at: list[tuple[float, float]] = []
        self.statuses: Counter[str] = Counter()
        self.stop = asyncio.Event()
        self.internal: dict[str, Any] = {}

    async def sse(self, http: aiohttp.ClientSession, sid: str) -> None:
        try:
            async with http.get(
                f"{self.url}/v1/sessions/{sid}/events", headers=self.headers
            ) as resp:
                assert resp.status == 200, resp.status
                self.sse_connected += 1
                async for raw in resp.content:
                    line = raw.decode().rstrip("\r\n")
                    if line.startswith("data:"):
                        now = time.perf_counter()
                        data = json.loads(line[5:])
                        key = f"{data['sessionId']}/{data['runId']}/{data['seq']:010d}"
                        self.sse_seen.setdefault(key, now)
                    if self.stop.is_set():
                        return
        except asyncio.CancelledError:
            raise
        except Exception as e:  # counted, reported
            self.sse_errors[type(e).__name__] += 1

    async def post(self, http: aiohttp.ClientSession, sid: str, body: dict[str, Any]) -> None:
        cid = str(uuid.uuid4())
        body = {**body, "commandId": cid}
        t0 = time.perf_counter()
        self.sent_at[f"{sid}/{cid}"] = t0
        try:
            async with http.post(
                f"{self.url}/v1/sessions/{sid}/commands", json=body, headers=self.headers
            ) as resp:
                got = await resp.json()
                self.post_ms.append((time.perf_counter() - t0) * 1000)
                self.post_at.append((t0, self.post_ms[-1]))
                self.statuses[got.get("status") or got.get("error", {}).get("code", "?")] += 1
        except Exception as e:
            self.statuses[f"error:{type(e).__name__}"] += 1

    async def posts(self, http: aiohttp.ClientSession, rate: float, seconds: float) -> int:
        n = int(rate * seconds)
        start = time.perf_counter()
        tasks = []
        for i in range(n):
            at = start + i / rate
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sid = self.sessions[i % len(self.sessions)]
            rnd = i // len(self.sessions)
            body = (
                {"type": "prompt", "payload": {"text": f"task {rnd}"}}
                if rnd % 2 == 0
                else {"type": "abort", "payload": {"reason": "bench"}}
            )
            tasks.append(asyncio.create_task(self.post(http, sid, body)))
        await asyncio.gather(*tasks)
        return n


async def _readers(url: str, key: str, sessions: list[str], out: Any, stop: Any) -> None:
    load = Load(url, key, sessions)
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as http:
        readers = [asyncio.create_task(load.sse(http, sid)) for sid in sessions]
        while load.sse_connected < len(sessions) and not stop.is_set():
            await asyncio.sleep(0.1)
        out.put(("connected", load.sse_connected))
        while not stop.is_set():
            await asyncio.sleep(0.1)
        load.stop.set()
        for r in readers:
            r.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    out.put(("done", load.sse_seen, dict(load.sse_errors)))


def sse_process(url: str, key: str, sessions: list[str], out: Any, stop: Any) -> None:
    """The SSE clients, in a process of their own (perf_counter is CLOCK_MONOTONIC: its
    times compare with the parent's)."""
    asyncio.run(_readers(url, key, sessions, out, stop))


async def drive(
    url: str, key: str, sessions: list[str], rate: float, seconds: float, warm: float
) -> Load:
    load = Load(url, key, sessions)
    ctx = multiprocessing.get_context("spawn")
    out, stop = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=sse_process, args=(url, key, sessions, out, stop), daemon=True)
    child.start()
    kind, connected = await asyncio.to_thread(out.get, True, 90)
    assert kind == "connected"
    load.sse_connected = connected
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as http:
        if warm > 0:
            await load.posts(http, min(rate, 100), warm)
            load.post_ms.clear()
            load.post_at.clear()
            load.statuses.clear()
            load.sent_at.clear()
        await load.posts(http, rate, seconds)
        async with http.get(f"{url}/healthz") as resp:
            load.internal = (await resp.json()).get("commands", {})
    await asyncio.sleep(2)  # the last events reach the readers
    stop.set()
    kind, seen, errors = await asyncio.to_thread(out.get, True, 60)
    assert kind == "done"
    load.sse_seen, load.sse_errors = seen, Counter(errors)
    child.join(10)
    return load


def summarize(
    args: argparse.Namespace, rate: float, load: Load, tail: DirectTail, sessions: list[str]
) -> dict[str, Any]:
    """One phase's numbers (see the module's docstring)."""
    # command -> first event at the direct reader: the processor's latency as any reader
    # sees it (from the POST's send, so the gateway's time before producing is in it too)
    first = tail.first_of_command
    cmd_direct = [first[k] - t for k, t in load.sent_at.items() if k in first]
    # the same commands' wall-clock split (ms -> s): built in the gateway -> its first
    # event produced by the processor -> visible to the direct reader
    walls = [tail.wall_of_command[k] for k in load.sent_at if k in tail.wall_of_command]
    # per event: its arrival at an SSE client - its arrival at the direct reader
    gateway_share = [load.sse_seen[k] - tail.seen[k] for k in load.sse_seen if k in tail.seen]
    ours = set(sessions)
    missing = sum(1 for k in tail.seen if k.split("/")[0] in ours and k not in load.sse_seen)
    # POST latency by the second it was sent in: a transient and a steady state differ
    by_second: dict[int, list[float]] = {}
    t_start = min((t for t, _ in load.post_at), default=0.0)
    for t, ms in load.post_at:
        by_second.setdefault(int(t - t_start), []).append(ms)
    series = {
        sec: {"p50": round(sorted(v)[len(v) // 2]), "p99": round(sorted(v)[int(len(v) * 0.99)])}
        for sec, v in sorted(by_second.items())
    }
    # the same by commands partition: a stall of one partition and of the whole pipeline
    # look alike in the overall percentiles
    by_partition: dict[int, list[float]] = {}
    for k, t in load.sent_at.items():
        if k in first:
            p = partition_for(k.split("/")[0].encode(), PARTITIONS)
            by_partition.setdefault(p, []).append(first[k] - t)
    return {
        "sse_clients": args.sse,
        "sse_connected": load.sse_connected,
        "sse_errors": dict(load.sse_errors),
        "rate": rate,
        "seconds": args.seconds,
        "posts": len(load.post_ms),
        "achieved_rate": round(len(load.post_ms) / args.seconds, 1),
        "statuses": dict(load.statuses),
        "post_to_outcome_ms": percentiles([ms / 1000 for ms in load.post_ms]),
        "gateway_internal": load.internal,
        "post_ms_by_second": series,
        "command_to_event_direct_ms": percentiles(cmd_direct),
        "command_to_event_direct_ms_by_partition": {
            p: percentiles(v) for p, v in sorted(by_partition.items())
        },
        "command_built_to_event_visible_ms": percentiles([(a - b) / 1000 for b, _, a in walls]),
        "command_built_to_event_produced_ms": percentiles([(p - b) / 1000 for b, p, _ in walls]),
        "event_produced_to_visible_ms": percentiles([(a - p) / 1000 for _, p, a in walls]),
        "event_sse_minus_direct_ms": percentiles(gateway_share),
        "sse_events": len(load.sse_seen),
        "sse_events_missing": missing,
    }


def phase(
    args: argparse.Namespace,
    rate: float,
    url: str,
    key: str,
    procs: dict[str, Service],
    tail: DirectTail,
) -> dict[str, Any]:
    gw_pid = procs["gateway"].pid
    rss = {"start": rss_mb(gw_pid), "peak": 0.0}
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            rss["peak"] = max(rss["peak"], rss_mb(gw_pid))
            time.sleep(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    b0, t0 = machine_busy()
    time.sleep(2)
    b1, t1 = machine_busy()
    busy_before = round((b1 - b0) / (t1 - t0) * (os.cpu_count() or 1), 2)
    sampler.start()
    cpu0 = {n: p.cpu() for n, p in procs.items()}
    meter = CpuMeter(gw_pid, broker_pid())
    sessions = [f"bench-{uuid.uuid4().hex[:6]}-{i}" for i in range(args.sse)]
    start = time.perf_counter()
    load = asyncio.run(drive(url, key, sessions, rate, args.seconds, args.warm))
    wall = time.perf_counter() - start
    cpu = {n: round(p.cpu() - cpu0[n], 1) for n, p in procs.items()}
    machine = meter.read()
    sampling.set()
    rss["end"] = rss_mb(gw_pid)
    out = summarize(args, rate, load, tail, sessions)
    out.update(
        gateway_rss_mb={k: round(v, 1) for k, v in rss.items()},
        cpu_s=cpu,
        wall_s=round(wall, 1),
        # the machine's (2 cores) busy time just before the phase and while it ran; the
        # "processor" fields of CpuMeter measure the gateway here
        busy_cores_before_load=busy_before,
        machine={
            "gateway_cores": machine["processor_cores"],
            "broker_cores": machine["broker_cores"],
            "machine_busy_cores": machine["machine_busy_cores"],
        },
    )
    return out


def markdown(results: list[dict[str, Any]]) -> str:
    def ms(d: dict[str, Any], q: str) -> str:
        return f"{d[f'p{q}_ms']:.0f}"

    rows = [
        "| POST/s (achieved) | SSE clients | POST -> outcome p50 / p99 ms | command -> event, "
        "direct reader p50 / p99 ms | command built in the gateway -> event visible p50 / p99 ms "
        "| event: SSE - direct p50 / p99 ms | in gateway before "
        "produce p50 / p99 ms | SSE events (missing) | gateway RSS start / peak MB | gateway "
        "CPU s (cores) | machine busy cores before / during |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        post, direct = r["post_to_outcome_ms"], r["command_to_event_direct_ms"]
        built = r["command_built_to_event_visible_ms"]
        share, internal = r["event_sse_minus_direct_ms"], r["gateway_internal"]
        q = internal.get("queuedToProducedMs") or {"p50": "-", "p99": "-"}
        rows.append(
            f"| {r['rate']:g} ({r['achieved_rate']:g}) | {r['sse_connected']} | "
            f"{ms(post, '50')} / {ms(post, '99')} | {ms(direct, '50')} / {ms(direct, '99')} | "
            f"{ms(built, '50')} / {ms(built, '99')} | "
            f"{ms(share, '50')} / {ms(share, '99')} | {q['p50']} / {q['p99']} | "
            f"{r['sse_events']} ({r['sse_events_missing']}) | "
            f"{r['gateway_rss_mb']['start']} / {r['gateway_rss_mb']['peak']} | "
            f"{r['cpu_s']['gateway']} ({r['machine']['gateway_cores']}) | "
            f"{r['busy_cores_before_load']} / {r['machine']['machine_busy_cores']} |"
        )
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sse", type=int, default=200, help="concurrent SSE clients")
    ap.add_argument(
        "--rates", default="500", help="POST per second, a comma-separated list of phases"
    )
    ap.add_argument("--seconds", type=float, default=20, help="measured load per phase")
    ap.add_argument("--warm", type=float, default=3, help="warm-up seconds at <= 100/s")
    ap.add_argument("--no-save", action="store_true", help="do not write bench/results")
    args = ap.parse_args(argv)

    s = isolated_settings(Settings(), "gw", prefix="bench", partitions=PARTITIONS).model_copy(
        update={
            "gateway_port": free_port(),
            "gateway_rate_per_s": 1e6,
            "gateway_rate_burst": 1_000_000,
        }
    )
    migrate(s.database_conninfo, schema=s.database_schema)
    with psycopg.connect(
        s.database_conninfo, options=f"-c search_path={s.database_schema}"
    ) as conn:
        key, _ = create_key(conn, "bench", "bench")
    logs = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    procs = {
        "processor": Service("processor", s, ["processor", "--instance", "bench"], logs),
        "sink": Service("sink", s, ["sink"], logs),
        "gateway": Service("gateway", s, ["gateway"], logs),
    }
    tail = DirectTail(s)
    results = []
    try:
        for p in procs.values():
            p.start()
        procs["processor"].wait_for("assigned", 90)
        procs["gateway"].wait_for("Uvicorn running on", 60)
        tail.start()
        tail.ready.wait(30)
        url = f"http://127.0.0.1:{s.gateway_port}"
        for rate in (float(r) for r in args.rates.split(",")):
            results.append(phase(args, rate, url, key, procs, tail))
            print(json.dumps(results[-1], indent=2), flush=True)
        tail.stop.set()
    finally:
        for p in procs.values():
            p.stop()
        delete_world([s])
    table = markdown(results)
    print(table)
    if not args.no_save:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "gateway.json").write_text(json.dumps(results, indent=2) + "\n")
        # bench/results/gateway.md embeds this table with the analysis around it
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
