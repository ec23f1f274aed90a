"""`python -m bench.peers`: see the package docstring."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.peers import _install
from bench.peers._load import Pool, System, closed_loop, open_loop, summary
from bench.peers._meter import PhaseMeter, loadavg
from bench.peers._report import markdown, ratios

#: the driver's event loop (`PEERS_LOOP`): `uvloop` (the default) or `asyncio`. The driver
#: shares the 2 cores with the system it drives, every system alike: its CPU is taken
#: from theirs (at 64 in flight over HTTP it was ~40 % of the machine's on asyncio's loop)
LOOP = os.environ.get("PEERS_LOOP", "uvloop")


def _loop_factory() -> Any:
    if LOOP == "asyncio":
        return asyncio.new_event_loop
    import uvloop

    return uvloop.new_event_loop


RESULTS = Path(__file__).resolve().parents[1] / "results"
ALL = ("sessionstream-sdk", "sessionstream-http", "restate", "temporal")
SESSIONS = 1000
#: seconds of nothing measured after each system's phases
IDLE_S = 10.0

NOTES = """Notes on what differs between the systems:
- Durability: sessionstream's outcome is a committed Kafka transaction (one local broker,
  replication factor 1, the broker's default flush policy: the page cache, no fsync per
  write). Restate's default config fsyncs its log (Bifrost) before it acknowledges. The
  Temporal dev server keeps its history in SQLite *in memory*: nothing survives a restart.
- Idempotency: every sessionstream command carries a command id the processor dedupes on;
  Restate calls carry an `idempotency-key` (the same ids); Temporal updates carry an
  update id.
- Single writer: sessionstream decides a session on its partition (one processor
  transaction at a time); Restate runs one exclusive handler per object key at a time;
  Temporal applies a workflow's updates in its workflow tasks, one at a time.
- sessionstream runs without a sink and without a worker (an abort cancels at once); the
  broker's CPU and RSS are counted against sessionstream (a shared broker: anything else
  on it counts too). CPU ms/cmd is the system's processes only; the driver (this process:
  the SDK client, or the HTTP / Temporal client) is in brackets.
- The SDK system drives one `SessionClient` from one thread with `submit_many` + `collect`
  (as the gateway does); the loads run on one event loop in this process (uvloop;
  `PEERS_LOOP=asyncio` for asyncio's own, which cost the HTTP loads more CPU). The HTTP
  systems (the gateway, Restate's ingress) are driven by one minimal keep-alive HTTP/1.1
  client (`PEERS_HTTP_CLIENT=raw`; `aiohttp` and `httpx` to compare), which leaves the
  systems more of the 2 cores than aiohttp's client did.
- The broker runs transactions for 20 s before the first sessionstream system (not
  measured): a freshly restarted JVM compiles its hot paths in its first minutes."""


def _systems(names: list[str], prefix: str) -> list[tuple[Any, Pool]]:
    out: list[tuple[Any, Pool]] = []
    for name in names:
        pool = Pool(f"{prefix}-{name}", SESSIONS)
        if name == "sessionstream-sdk":
            from bench.peers._sessionstream import SdkSystem

            out.append((SdkSystem(), pool))
        elif name == "sessionstream-http":
            from bench.peers._sessionstream import HttpSystem

            out.append((HttpSystem(), pool))
        elif name == "restate":
            from bench.peers._restate import RestateSystem

            out.append((RestateSystem(), pool))
        elif name == "temporal":
            from bench.peers._temporal import TemporalSystem

            out.append((TemporalSystem(list(pool.idle)), pool))
        else:
            raise SystemExit(f"unknown system {name!r}; one of {', '.join(ALL)}")
    return out


async def run_system(system: System, pool: Pool, warm: float, secs: float) -> dict[str, Any]:
    out: dict[str, Any] = {"phases": {}}
    t0 = time.perf_counter()
    try:
        await system.start()
        out["start_s"] = round(time.perf_counter() - t0, 1)
        for phase in ("closed-16", "closed-64", "open-100", "open-500"):
            mode, n = phase.split("-")
            meter = PhaseMeter(system.processes())
            if mode == "closed":
                tally = await closed_loop(system, pool, int(n), warm, secs)
            else:
                tally = await open_loop(system, pool, float(n), warm, secs)
            res = summary(tally, mode, secs)
            res["meter"] = meter.read(tally.commands)
            out["phases"][phase] = res
            print(
                f"peers: {system.name} {phase}: "
                + json.dumps({k: v for k, v in res.items() if k != "meter"}),
                file=sys.stderr,
                flush=True,
            )
        out["idle"] = await idle(system, IDLE_S)
        out["sessions_left_broken"] = len(pool.broken)
        if pool.broken:  # keep the servers' logs to see why
            system.keep_logs = True  # type: ignore[attr-defined]
        out["check"] = await asyncio.to_thread(system.check)  # type: ignore[attr-defined]
    except Exception as e:  # reported in the results, the other systems still run
        out["error"] = f"{type(e).__name__}: {e}"
        print(f"peers: {system.name} failed: {out['error']}", file=sys.stderr, flush=True)
    finally:
        await system.stop()
    return out


async def idle(system: System, secs: float) -> dict[str, Any]:
    """The system's CPU with nothing to do, after its phases (its readers assigned, its
    JIT warm): what a deployment costs while its sessions are quiet. In cores, per process;
    the driver counts too (the SDK system's client lives in it)."""
    await asyncio.sleep(2.0)  # the last phase's stragglers settle
    meter = PhaseMeter(system.processes())
    await asyncio.sleep(secs)
    m = meter.read(0)
    cores = {n: round(v["cpu_s"] / m["seconds"], 3) for n, v in m["processes"].items()}
    return {"seconds": m["seconds"], "cores": cores, "total_cores": round(sum(cores.values()), 3)}


def warm_broker(secs: float) -> float:
    """Transactions through the broker for `secs`, not measured: a broker (a JVM) restarted
    shortly before compiles its hot paths during the first minutes, and the systems that
    ran first on it paid for that (a run right after a restart: load average 3.2-3.7 and
    C=64 1,310 commands/s, against 1.9-2.6 and 1,683 on a broker up for hours)."""
    from bench._baselines import passthrough_latency
    from sessionstream.settings import Settings

    print(f"peers: warming the broker up ({secs:g} s)", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    passthrough_latency(Settings().model_copy(update={"partitions": 4}), 500, secs, warmup=0)
    return round(time.monotonic() - t0, 1)


def passthrough(rates: list[float], secs: float, shape: str = "raw") -> dict[str, Any]:
    """The transactional pass-through at each rate: its latency, and the broker's CPU
    per record. "raw" is the Kafka floor under the CPU goal: one transaction per poll, one
    output partition per input partition and the offsets per transaction. The other
    shapes (`bench._baselines.SHAPES`) add what our transactions carry, still without
    logic: the outcome records' second produce round, then the two changelogs (or one,
    where a single changelog topic would put them)."""
    from bench._baselines import passthrough_latency
    from bench._harness import broker_pid
    from sessionstream.settings import Settings

    s = Settings().model_copy(update={"partitions": 4})
    broker = broker_pid()
    out: dict[str, Any] = {}
    for r in rates:
        try:
            meter = PhaseMeter({"kafka broker": broker} if broker else {})
            got = passthrough_latency(s, r, secs, warmup=2, shape=shape)
            used = meter.read(got["sent"])["processes"]
            if broker:
                cpu = used["kafka broker"]["cpu_s"]
                got["broker_cpu_ms_per_record"] = round(1000 * cpu / max(got["sent"], 1), 3)
            out[f"{r:g}"] = got
        except Exception as e:
            out[f"{r:g}"] = f"failed: {type(e).__name__}: {e}"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__package__ or "bench.peers"))
    ap.add_argument("--quick", action="store_true", help="~2-3 min: short phases")
    ap.add_argument("--systems", default=",".join(ALL))
    ap.add_argument("--json", action="store_true", help="print the JSON result to stdout")
    ap.add_argument("--seconds", type=float, help="measured seconds per phase")
    ap.add_argument("--no-passthrough", action="store_true")
    ap.add_argument("--no-save", action="store_true", help="do not write bench/results")
    ap.add_argument("--note", default="", help="a line for the report (e.g. other load)")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.systems.split(",") if n.strip()]
    warm, secs = (1.0, 5.0) if args.quick else (3.0, 15.0)
    secs = args.seconds or secs
    mods = ["hypercorn", "restate"] if "restate" in names else []
    mods += ["temporalio"] if "temporal" in names else []
    _install.python_packages(mods)
    if "restate" in names:
        _install.restate_server()
    if "temporal" in names:
        _install.temporal_cli()

    started = time.time()
    doc: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "started": started,
        "mode": "quick" if args.quick else "full",
        "command": "python -m bench.peers " + " ".join(argv if argv is not None else sys.argv[1:]),
        "host": {
            "cpus": os.cpu_count(),
            "loadavg_start": loadavg(),
            "note": args.note,
            "driver_loop": LOOP,
        },
        "workload": {"sessions": SESSIONS, "warmup_s": warm, "seconds_per_phase": secs},
        "installs": _install.install_times(),
        "versions": {
            "restate-server": _install.RESTATE_VERSION,
            "temporal-cli": _install.TEMPORAL_CLI_VERSION,
        },
        "systems": {},
    }
    prefix = f"peers-{uuid.uuid4().hex[:6]}"
    if any(n.startswith("sessionstream") for n in names):
        doc["broker_warmup_s"] = warm_broker(5 if args.quick else 20)
    for system, pool in _systems(names, prefix):
        print(f"peers: == {system.name}", file=sys.stderr, flush=True)
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            doc["systems"][system.name] = runner.run(run_system(system, pool, warm, secs))
    if not args.no_passthrough:
        doc["passthrough"] = passthrough([100, 500], 5 if args.quick else 10)
        doc["passthrough_shapes"] = {
            shape: passthrough([100, 500], 5 if args.quick else 10, shape)
            for shape in ("outcome", "one-changelog", "ours")
        }
    doc["ratios_to_restate"] = ratios(doc["systems"])
    doc["wall_s"] = round(time.time() - started, 1)
    doc["notes"] = NOTES
    md = markdown(doc)
    if not args.no_save:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "peers.json").write_text(json.dumps(doc, indent=2) + "\n")
        (RESULTS / "peers.md").write_text(md)
    print(json.dumps(doc, indent=2) if args.json else md)
    failed = any("error" in s for s in doc["systems"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
