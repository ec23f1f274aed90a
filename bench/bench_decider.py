"""Decider throughput on one core: decide + evolve + Avro encoding of the events.

Also measured: `apply` + encoding, the processor's path (`apply` folds the events while it
decides them, so the state needs no second `evolve`).

A realistic mix across many sessions, interleaved as one partition would see them: prompts,
leases and heartbeats, model/tool progress, steers, follow-ups (delivered before the run may
finish), completions, aborts and their acknowledgements. The commands are built in a first,
untimed pass (worker commands need the run ids and generations the decider hands out); the
timed pass replays them from empty states.

    .venv/bin/python -m bench.bench_decider [--commands 50000] [--sessions 1000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from sessionstream.adapters.registry import reader_codec
from sessionstream.core.decider import DEFAULT_CONFIG, apply, decide
from sessionstream.core.state import SessionState
from sessionstream.schemas.commands import Command
from sessionstream.settings import get_settings

W = True  # a worker command: it needs the run id and generation the decider handed out

#: one session's cycle: a run that completes after a follow-up, then a run that is aborted
CYCLE: list[tuple[str, dict[str, Any], bool]] = [
    ("prompt", {"text": "find flights to Lisbon", "policy": "enqueue"}, False),
    ("lease.acquire", {"lease_ms": 30_000}, W),
    ("run.progress", {"kind": "model.request.started", "name": "gpt"}, W),
    ("run.progress", {"kind": "model.request.finished", "name": "gpt"}, W),
    ("steer", {"text": "only direct flights"}, False),
    ("run.progress", {"kind": "tool.started", "name": "web_search", "call_id": "t1"}, W),
    ("follow_up", {"text": "also check trains"}, False),
    ("lease.renew", {"lease_ms": 30_000}, W),
    ("run.progress", {"kind": "tool.finished", "name": "web_search", "call_id": "t1"}, W),
    ("run.complete", {"result": "draft"}, W),  # delivers the follow-up, the run goes on
    ("run.complete", {"result": "3 options", "consume": True}, W),  # takes steer + follow-up
    ("prompt", {"text": "book the second one"}, False),
    ("lease.acquire", {"lease_ms": 30_000}, W),
    ("run.progress", {"kind": "model.request.started", "name": "gpt"}, W),
    ("abort", {"reason": "user"}, False),
    ("cancel.ack", {"model_request_aborted": True}, W),
]


def build(n_commands: int, n_sessions: int) -> list[Command]:
    """The workload, round-robin over the sessions (untimed)."""
    states = {f"s-{i}": SessionState.initial(f"s-{i}") for i in range(n_sessions)}
    steps = dict.fromkeys(states, 0)
    out: list[Command] = []
    clock = 1_767_225_600_000

    def round_robin() -> Iterator[str]:
        while True:
            yield from states

    for sid in round_robin():
        if len(out) >= n_commands:
            break
        state = states[sid]
        type_, payload, worker = CYCLE[steps[sid] % len(CYCLE)]
        steps[sid] += 1
        clock += 1
        extra: dict[str, Any] = {}
        if worker:
            run = state.active
            assert run is not None, (sid, type_)
            extra = {"run_id": run.run_id, "worker_id": "w-1"}
            if type_ != "lease.acquire":
                extra["generation"] = run.generation
            if payload.get("consume"):
                # a run completes once the worker says it consumed every input it was given
                ids = {
                    k: [i.source_command_id for i in run.inputs if i.kind == k]
                    for k in ("steer", "follow_up")
                }
                payload = {
                    "result": payload["result"],
                    "consumed_steers": ids["steer"],
                    "consumed_follow_ups": ids["follow_up"],
                }
        cmd = Command(
            command_id=f"{sid}-{steps[sid]}",
            session_id=sid,
            tenant_id="acme",
            type=type_,
            ts=clock,
            payload=payload,
            **extra,
        )
        decision = decide(state, cmd)
        for e in decision.events:
            assert e.type != "command.rejected", (cmd, e)  # the mix is all accepted work
        state = decision.state
        states[sid] = state
        out.append(cmd)
    return out


def run(commands: list[Command]) -> tuple[float, int, int]:
    """Timed: decide + evolve + encode. Returns (seconds, events, encoded bytes)."""
    codec = reader_codec(get_settings())
    config = DEFAULT_CONFIG
    states: dict[str, SessionState] = {}
    n_events = n_bytes = 0
    t0 = time.perf_counter()
    for cmd in commands:
        state = states.get(cmd.session_id) or SessionState.initial(cmd.session_id)
        decision = decide(state, cmd, config)
        for e in decision.events:
            n_bytes += len(codec.encode_event(e))
            n_events += 1
        states[cmd.session_id] = decision.state
    return time.perf_counter() - t0, n_events, n_bytes


def run_apply(commands: list[Command]) -> float:
    """Timed: apply + encode, as the processor does it. Returns seconds."""
    codec = reader_codec(get_settings())
    states: dict[str, SessionState] = {}
    t0 = time.perf_counter()
    for cmd in commands:
        events, states[cmd.session_id] = apply(states.get(cmd.session_id), cmd, DEFAULT_CONFIG)
        for e in events:
            codec.encode_event(e)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commands", type=int, default=50_000, help="commands to decide")
    ap.add_argument("--sessions", type=int, default=1_000, help="sessions they spread over")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as a partition gets

    commands = build(args.commands, args.sessions)
    seconds, n_events, n_bytes = run(commands)
    apply_seconds = run_apply(commands)
    result = {
        "commands": len(commands),
        "sessions": args.sessions,
        "events": n_events,
        "seconds": round(seconds, 3),
        "commands_per_s": round(len(commands) / seconds),
        "events_per_s": round(n_events / seconds),
        "avg_event_bytes": round(n_bytes / max(n_events, 1), 1),
        "apply_commands_per_s": round(len(commands) / apply_seconds),
        "python": sys.version.split()[0],
    }
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")


if __name__ == "__main__":
    main()
