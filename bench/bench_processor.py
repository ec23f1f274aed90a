"""Session processor benchmark on the real broker: one processor, exactly-once on.

1. Throughput: a backlog produced *before* the processor starts, measured from its first
   committed offset to all committed (group offsets, polled); then commands produced live.
2. Latency at a steady rate (default 500/s): send -> first event of the command visible to a
   `read_committed` consumer (HdrHistogram).
3. Recovery: under steady load, kill -9 and restart at once with the same instance id;
   kill -> first event of the new processor visible, kill -> backlog drained.

Every phase sends the `CYCLE` mix (prompts with reject / enqueue / interrupt policies, steers,
follow-ups, sends, aborts) to sessions of its own. At the end the whole events log goes
through `check_log`; a broken log is reported loudly and exits 1. Topics are per run.

    .venv/bin/python -m bench.bench_processor [--quick] [--json] [--no-save]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import confluent_kafka

from bench._harness import (
    CpuMeter,
    EventTail,
    Offsets,
    PacedProducer,
    Processor,
    Workload,
    broker_pid,
    delete_topics_and_groups,
    first_after,
    percentiles,
    verify_log,
)
from sessionstream.client import SessionClient
from sessionstream.settings import Settings
from tests.integration.worlds import isolated_settings

RESULTS = Path(__file__).resolve().parent / "results"
now = time.perf_counter


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.s = isolated_settings(Settings(), "proc", partitions=4, prefix="bench", schema=False)
        self.client = SessionClient("bench", self.s)
        self.offsets = Offsets(self.s)
        self.instance = f"bench-{uuid.uuid4().hex[:6]}"
        self.proc: Processor | None = None
        self.broker = broker_pid()
        self.ids: dict[str, list[str]] = {}  # phase -> command ids sent
        self.tail: EventTail | None = None

    def start_processor(self) -> Processor:
        self.proc = Processor(self.s, self.instance).start()
        return self.proc

    # -- 1. throughput ---------------------------------------------------------------------
    def produce(self, phase: str, n: int, seed: int) -> float:
        """Produce `n` commands as fast as the client goes; returns the seconds it took."""
        wl, ids, t0 = Workload(self.client, phase, self.args.sessions, seed), [], now()
        for _ in range(n):
            cmd = wl.next()
            ids.append(cmd.command_id)
            self.client.submit(cmd, track=False)
        self.client.flush()
        self.ids[phase] = ids
        return now() - t0

    def throughput_backlog(self, n: int) -> dict[str, Any]:
        produce_s = self.produce("tput", n, seed=1)
        target = self.offsets.end()
        proc = self.start_processor()
        t1, c1 = self.offsets.wait(lambda c: any(c.values()), proc)  # first transaction in
        meter = CpuMeter(proc.pid, self.broker)
        t2, _ = self.offsets.wait_past(target, proc)
        cmds = n - sum(c1.values())
        return {
            "commands": n,
            "sessions": self.args.sessions,
            "produce_s": round(produce_s, 2),
            "startup_to_first_commit_s": round(t1 - proc.started_at, 2),
            "measured_commands": cmds,
            "seconds": round(t2 - t1, 2),
            "commands_per_s": round(cmds / (t2 - t1)),
            **meter.read(),
        }

    def throughput_live(self, n: int) -> dict[str, Any]:
        assert self.proc is not None
        meter, t0 = CpuMeter(self.proc.pid, self.broker), now()
        produce_s = self.produce("live", n, seed=2)
        secs = self.offsets.wait_past(self.offsets.end(), self.proc)[0] - t0
        return {
            "commands": n,
            "produce_commands_per_s": round(n / produce_s),
            "seconds": round(secs, 2),
            "commands_per_s": round(n / secs),
            **meter.read(),
        }

    # -- 2. latency ------------------------------------------------------------------------
    def latency(self, rate: float, seconds: float, warmup: float) -> dict[str, Any]:
        assert self.proc is not None and self.tail is not None
        prod = PacedProducer(self.client, Workload(self.client, "lat", self.args.sessions, 3), rate)
        prod.start()
        time.sleep(warmup)
        meter = CpuMeter(self.proc.pid, self.broker)
        time.sleep(seconds)
        cpu = meter.read()
        prod.stop()
        self.ids["lat"] = list(prod.sent)
        missing = self.tail.settle(prod.sent)
        start = prod.first + warmup
        window = {c: t for c, t in prod.sent.items() if t >= start}
        seen = self.tail.first_seen
        lat = [seen[c] - t for c, t in window.items() if c in seen]
        return {
            "target_rate": rate,
            "achieved_rate": round((len(window) - 1) / (prod.last - start), 1),
            "producer_late_max_ms": round(prod.late_max * 1000, 1),
            "seconds": seconds,
            "warmup_s": warmup,
            "measured": len(lat),
            "missing_outcomes": missing,
            **percentiles(lat),
            **cpu,
        }

    # -- 3. recovery -----------------------------------------------------------------------
    def recovery(self, rate: float, kills: int, steady: float) -> dict[str, Any]:
        assert self.tail is not None
        prod = PacedProducer(self.client, Workload(self.client, "rec", self.args.sessions, 4), rate)
        prod.start()
        runs = []
        for _ in range(kills):
            runs.append(self.kill_and_recover(prod, rate, steady))
        time.sleep(steady)
        prod.stop()
        self.ids["rec"] = list(prod.sent)
        missing = self.tail.settle(prod.sent)
        seen = self.tail.first_seen
        for r in runs:  # the first event of a command the killed processor had not committed
            t_kill, at_kill = r.pop("t_kill"), r.pop("at_kill")
            r["first_event_s"] = round(first_after(prod, seen, at_kill, t_kill) - t_kill, 3)
            until = t_kill + r["drained_s"]
            stalled = [seen[c] - t for c, t in prod.sent.items() if t_kill - 1 <= t <= until]
            r["max_latency_s"] = round(max(stalled), 3)
        med = {
            k: statistics.median(r[k] for r in runs)
            for k in ("up_s", "assigned_s", "first_event_s", "drained_s")
        }
        return {
            "load_rate": rate,
            "achieved_rate": round(prod.achieved_rate, 1),
            "kills": runs,
            "median": med,
            "missing_outcomes": missing,
        }

    def kill_and_recover(self, prod: PacedProducer, rate: float, steady: float) -> dict[str, Any]:
        base, end = 0, now() + steady
        while now() < end:  # steady state: the lag a running processor keeps
            base = max(base, self.offsets.lag()[0])
            time.sleep(0.025)
        threshold = max(base, int(rate * 0.1))
        state_records = sum(self.offsets.end(self.s.state_topic).values())  # what restore reads
        assert self.proc is not None
        t_kill = now()
        self.proc.kill9()
        proc = self.start_processor()  # same instance id: fences its predecessor
        time.sleep(0.1)  # a new Python process cannot commit this soon
        at_kill = self.offsets.committed()
        marks: dict[str, float] = {}
        peak, deadline = 0, t_kill + 120
        while True:
            proc.assert_alive()
            if prod.error:
                raise prod.error
            lag, c = self.offsets.lag()
            t = now()
            peak = max(peak, lag)
            if len(marks) < 2:
                text = proc.log_text()
                for key, needle in (("up_s", " consuming "), ("assigned_s", " assigned [")):
                    if needle in text:
                        marks.setdefault(key, t - t_kill)
            if any(c[p] > at_kill[p] for p in c) and lag <= threshold:
                break
            if t > deadline:
                raise TimeoutError(f"not recovered 120 s after kill -9; lag {lag}")
            time.sleep(0.025)
        return {
            "t_kill": t_kill,
            "at_kill": at_kill,
            "up_s": round(marks.get("up_s", float("nan")), 3),
            "assigned_s": round(marks.get("assigned_s", float("nan")), 3),
            "drained_s": round(t - t_kill, 3),
            "peak_lag": peak,
            "steady_lag_max": base,
            "state_records": state_records,
            "drained_at_lag": lag,
        }

    def close(self, keep: bool) -> list[str]:
        if self.tail is not None and self.tail.is_alive():
            self.tail.halt.set()
        if self.proc is not None:
            self.proc.stop()
        self.offsets.close()
        return [] if keep else delete_topics_and_groups(self.s)


def run(args: argparse.Namespace) -> dict[str, Any]:
    b = Bench(args)
    out: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {
            "cpus": os.cpu_count(),
            "loadavg_start": os.getloadavg(),
            "python": sys.version.split()[0],
            "librdkafka": confluent_kafka.libversion()[0],
        },
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "save")},
    }
    try:
        out["throughput"] = b.throughput_backlog(args.commands)
        out["throughput_live"] = b.throughput_live(args.live_commands)
        b.tail = EventTail(b.s)
        b.tail.start()
        out["latency"] = b.latency(args.rate, args.seconds, args.warmup)
        out["recovery"] = b.recovery(args.recovery_rate, args.kills, args.steady)
        b.tail.stop()
        assert b.proc is not None
        b.proc.stop()
        out["log_check"] = check = verify_log(b.s, b.ids)
        for key, phase in (("throughput", "tput"), ("throughput_live", "live")):
            per_cmd = check["phases"][phase]["events"] / check["phases"][phase]["commands"]
            out[key]["events_per_command"] = round(per_cmd, 3)
            out[key]["events_per_s"] = round(out[key]["commands_per_s"] * per_cmd)
    finally:
        out["cleanup_failures"] = b.close(args.keep_topics)
        out["host"]["loadavg_end"] = os.getloadavg()
    return out


def markdown(r: dict[str, Any]) -> str:
    t, tl, la, rc, lc = (
        r[k] for k in ("throughput", "throughput_live", "latency", "recovery", "log_check")
    )
    med, h = rc["median"], r["host"]
    busy = statistics.mean(x["machine_busy_cores"] for x in (t, tl, la))
    other = busy - statistics.mean(
        x["processor_cores"] + (x["broker_cores"] or 0) for x in (t, tl, la)
    )
    cores = "{processor_cores} / {broker_cores} / {machine_busy_cores}"
    rows = [
        (
            f"throughput, backlog of {t['commands']:,} commands on {t['sessions']} sessions",
            f"**{t['commands_per_s']:,} cmd/s**, {t['events_per_s']:,} events/s",
        ),
        ("&nbsp; cores busy: processor / broker / machine", cores.format(**t)),
        (
            f"throughput, {tl['commands']:,} commands produced live",
            f"{tl['commands_per_s']:,} cmd/s, {tl['events_per_s']:,} events/s",
        ),
        ("&nbsp; cores busy: processor / broker / machine", cores.format(**tl)),
        (
            f"latency at {la['achieved_rate']} cmd/s (target {la['target_rate']:g}), "
            f"{la['measured']:,} commands",
            f"p50 **{la['p50_ms']} ms**, p90 {la['p90_ms']}, p99 **{la['p99_ms']} ms**, "
            f"p99.9 {la['p99.9_ms']}, max {la['max_ms']}",
        ),
        ("&nbsp; cores busy: processor / broker / machine", cores.format(**la)),
        (
            f"kill -9 under {rc['load_rate']:g} cmd/s, median of {len(rc['kills'])}",
            f"first new event **{med['first_event_s']} s**, "
            f"backlog drained **{med['drained_s']} s**",
        ),
    ]
    rows += [
        (
            f"&nbsp; kill {i}: up / assigned / first event / drained (s); peak lag; max latency",
            f"{k['up_s']} / {k['assigned_s']} / {k['first_event_s']} / {k['drained_s']}; "
            f"{k['peak_lag']:,} cmds; {k['max_latency_s']} s",
        )
        for i, k in enumerate(rc["kills"], 1)
    ]
    rows.append(
        (
            "log check (`check_log`)",
            ("OK" if lc["ok"] else "**VIOLATIONS**")
            + f": {lc['events']:,} events, {lc['runs']:,} runs, {lc['violations'][:3]}, "
            f"{lc['commands_without_outcome']} commands without outcome, "
            f"state table = fold: {lc['state_table_equals_fold']}",
        )
    )
    return (
        f"# Session processor benchmark ({r['when']})\n\n"
        f"One processor, exactly-once (transactions), 4 partitions; {h['cpus']} CPUs shared with "
        f"the broker (load average {h['loadavg_start'][0]:.2f} at start, {h['loadavg_end'][0]:.2f} "
        f"at end); Python {h['python']}, librdkafka {h['librdkafka']}. "
        f"During the measured phases the machine was busy {busy:.2f} of {h['cpus']} cores on "
        f"average, {other:.2f} of them neither the processor nor the broker (other work on the "
        "shared host). From `bench/bench_processor.py`; every number in `processor.json`.\n\n"
        "| measure | result |\n|---|---|\n" + "\n".join(f"| {a} | {b} |" for a, b in rows) + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a ~30 s run with smaller numbers")
    ap.add_argument("--commands", type=int, help="backlog size (default 20000; quick 4000)")
    ap.add_argument("--live-commands", type=int, help="live-produced (default 10000; quick 2000)")
    ap.add_argument("--sessions", type=int, default=500)
    ap.add_argument("--rate", type=float, default=500.0, help="latency phase commands/s")
    ap.add_argument("--seconds", type=float, help="latency measured (default 20; quick 6)")
    ap.add_argument("--warmup", type=float, default=2.0, help="latency warm-up seconds")
    ap.add_argument("--recovery-rate", type=float, default=200.0)
    ap.add_argument("--kills", type=int, help="kill -9 repetitions (default 3; quick 1)")
    ap.add_argument("--steady", type=float, default=3.0, help="seconds of load before a kill")
    ap.add_argument("--keep-topics", action="store_true")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument(
        "--save",
        action=argparse.BooleanOptionalAction,
        help="write bench/results/processor.{json,md} (default: yes, except with --quick)",
    )
    args = ap.parse_args(argv)
    for name, full, quick in (
        ("commands", 20_000, 4_000),
        ("live_commands", 10_000, 2_000),
        ("seconds", 20.0, 6.0),
        ("kills", 3, 1),
    ):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)

    result = run(args)
    ok = result["log_check"]["ok"]
    if args.save if args.save is not None else not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "processor.json").write_text(json.dumps(result, indent=2) + "\n")
        (RESULTS / "processor.md").write_text(markdown(result))
    print(json.dumps(result) if args.json else markdown(result))
    if not ok:
        print("\n!!! LOG CHECK FAILED: the processor wrote a broken log !!!", file=sys.stderr)
        print(json.dumps(result["log_check"], indent=2), file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
