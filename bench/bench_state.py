"""Session state at scale through one real processor: memory, record sizes, restart time.

The load the binary state records and the RocksDB store were sized for: `--sessions`
sessions with one prompt each (their runs stay open: no worker) and `--busy` sessions with
`--per-busy` producer commands each (prompts, steers, follow-ups, sends, interrupts,
aborts). Then:

- the processor's RSS, and per session;
- the state records on `session.state`: p50 / p99 / max bytes, a busy session's record, and
  the changelog bytes one command writes at worst (its session's state record, as if no
  batch ever merged two commands of a session; its dedup record rides on its outcome
  record, written for every command anyway);
- restart after kill -9 -> the first new command's event visible: with the local store
  (the changelogs' tail from its checkpoint), and with the store deleted (a full restore).

    .venv/bin/python -m bench.bench_state [--sessions 200000] [--busy 200] [--per-busy 600]
        [--exe OTHER/.venv/bin/sessionstream] [--json]

`--exe` runs another checkout's processor on the same load (e.g. the version before the
store, to compare); its store figures are then whatever that version does.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench._harness import (
    Offsets,
    Processor,
    Workload,
    delete_topics_and_groups,
)
from sessionstream.adapters.kafka import read_records
from sessionstream.client import SessionClient
from sessionstream.settings import Settings
from tests.integration.worlds import isolated_settings


def encoding(repeat: int = 5, n: int = 3000) -> dict[str, Any]:
    """JSON (pydantic) against the binary record for a busy session (600 commands) and a
    fresh one: bytes, encode and decode µs (best of `repeat`)."""
    from bench.bench_decider import build
    from sessionstream.core.decider import decide
    from sessionstream.core.state import SessionState, state_from_json, state_to_json
    from sessionstream.core.state_codec import decode_state, encode_state

    state = SessionState.initial("s-0")
    busy = state
    for cmd in build(600, 1):
        state = decide(state, cmd).state
        if len(encode_state(state)) > len(encode_state(busy)):
            busy = state

    def best(f: Any) -> float:
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            for _ in range(n):
                f()
            times.append((time.perf_counter() - t) / n * 1e6)
        return round(min(times), 1)

    out: dict[str, Any] = {}
    for name, st in (("busy", busy), ("fresh", SessionState(session_id="s-1", clock=1))):
        j, b = state_to_json(st), encode_state(st)
        out[name] = {
            "json_bytes": len(j),
            "binary_bytes": len(b),
            "json_encode_us": best(lambda st=st: state_to_json(st)),
            "binary_encode_us": best(lambda st=st: encode_state(st)),
            "json_decode_us": best(lambda j=j: state_from_json(j)),
            "binary_decode_us": best(lambda b=b: decode_state(b)),
        }
    return out


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def produce(s: Settings, sessions: int, busy: int, per_busy: int) -> int:
    n = 0
    with SessionClient("bench", s) as c:
        for i in range(sessions):
            text = {"text": "summarise my inbox"}
            cmd = c.command(f"one-{i}", "prompt", text, command_id=f"o{i}")
            c.submit(cmd, track=False)
            n += 1
            if n % 20_000 == 0:
                c.flush()
        work = Workload(c, "busy", busy)
        for _ in range(busy * per_busy):
            c.submit(work.next(), track=False)
            n += 1
            if n % 20_000 == 0:
                c.flush()
        c.flush(120)
    return n


def first_event_after_start(s: Settings, proc: Processor) -> float:
    """Start `proc`, send one command to a new session, seconds until its outcome shows."""
    with SessionClient("bench", s) as c:
        t0 = time.perf_counter()
        proc.start()
        handle = c.submit(c.command(f"new-{uuid.uuid4().hex[:8]}", "prompt", {"text": "hi"}))
        outcome = c.wait(handle, timeout=300)
        assert outcome.status == "accepted", outcome
        return time.perf_counter() - t0


def pct(values: list[int], q: float) -> int:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sessions", type=int, default=200_000)
    ap.add_argument("--busy", type=int, default=200)
    ap.add_argument("--per-busy", type=int, default=600)
    ap.add_argument("--exe", type=Path, help="another checkout's `sessionstream` executable")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--encoding-only", action="store_true", help="only the record encodings")
    args = ap.parse_args(argv)
    if args.encoding_only:
        print(json.dumps(encoding(), indent=2))
        return 0

    s = isolated_settings(Settings(), "state", prefix="bench", schema=False)
    out: dict[str, Any] = {"sessions": args.sessions + args.busy, "exe": str(args.exe or "")}
    proc = Processor(s, "state-0")
    proc.exe = args.exe
    offsets = Offsets(s)
    try:
        t0 = time.perf_counter()
        n = produce(s, args.sessions, args.busy, args.per_busy)
        out["commands"] = n
        out["produce_s"] = round(time.perf_counter() - t0, 1)
        t1 = time.perf_counter()
        proc.start()
        end = offsets.end()
        offsets.wait(lambda c: all(c[p] >= o for p, o in end.items()), proc, timeout=3600)
        out["process_s"] = round(time.perf_counter() - t1, 1)
        out["commands_per_s"] = round(n / out["process_s"])
        time.sleep(2)  # the store's last batch and the allocator settle
        out["rss_mib"] = round(rss_mib(proc.pid), 1)
        out["rss_kib_per_session"] = round(out["rss_mib"] * 1024 / out["sessions"], 2)

        sizes: list[int] = []
        busy_sizes: list[int] = []
        for r in read_records(s, {s.state_topic: None}, timeout=600):
            size = len(r.key or b"") + len(r.value or b"")
            sizes.append(size)
            if (r.key or b"").startswith(b"busy-"):
                busy_sizes.append(size)
        out["state_record_bytes"] = {
            "p50": pct(sizes, 0.5),
            "p99": pct(sizes, 0.99),
            "max": max(sizes),
            "busy_p99": pct(busy_sizes, 0.99) if busy_sizes else None,
            "busy_max": max(busy_sizes) if busy_sizes else None,
        }
        out["changelog_bytes_per_command_p99"] = pct(sizes, 0.99)
        out["changelog_records"] = {"state": len(sizes)}

        # restart with the store: kill -9, start, one new command
        proc.kill9()
        out["restart_with_store_s"] = round(first_event_after_start(s, proc), 2)
        proc.kill9()
        store = s.store_path
        shutil.rmtree(store, ignore_errors=True)
        out["restart_without_store_s"] = round(first_event_after_start(s, proc), 2)
        lines = [ln for ln in proc.log_text().splitlines() if "restored partitions" in ln]
        out["restore_lines"] = [ln.split("INFO ", 1)[-1] for ln in lines[-3:]]
        out["median_state_record"] = statistics.median(sizes)
    finally:
        proc.kill9()
        offsets.close()
        delete_topics_and_groups(s)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k:34} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
