"""The processor's CPU per command without a broker: the floor under its throughput.

The processor's main thread does, per poll batch: `decide_batch` (decode each command,
check placement, look up its dedup record, decide, fold, encode the events, stage the
states), `produce` (a confluent-kafka `produce()` per record: events, the state
changelog, open runs) and, once the transaction committed, the store write (RocksDB batch,
timer wheel). This script runs exactly that code on records built in memory, one core, with
a real `Producer` pointed at a closed loopback port (its `produce()` queues as it would;
nothing is sent) and a real store in a temporary directory. No broker, no other process:
the figures do not move with the machine's load the way `bench_hot`'s do, so they say what
one core could do at most, and a change to the per-command CPU shows here first.

Two workloads, each on `--sessions` sessions:
- `producer`: `bench/_harness.py`'s cycle (prompts with every policy, steers, follow-ups,
  sends, aborts; no worker), the backlog `bench_hot` and `bench_profile` measure;
- `protocol`: `bench_decider`'s cycle (a worker leases the run, reports progress, completes;
  steers, follow-ups, an abort and its acknowledgement), worker commands on their own topic.

The garbage collector is settled first, as `sessionstream processor` does once started
(`sessionstream.adapters._gc`); `--default-gc` keeps CPython's thresholds instead, to compare.

Printed per workload: commands, events per command, microseconds per command of decode
(a separate pass), decide_batch, produce and store, commands/s for the whole, and the
collections run while measuring (count, milliseconds).

    .venv/bin/python -m bench.bench_step [--commands 60000] [--sessions 1000] [--batch 500]
        [--default-gc] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import rocksdict
from confluent_kafka import Producer

from bench._harness import CYCLE as PRODUCER_CYCLE
from bench.bench_decider import build as protocol_commands
from sessionstream.adapters._gc import settle_collector
from sessionstream.adapters.registry import reader_codec
from sessionstream.core.partitioning import partition_for
from sessionstream.core.step import CommandStep
from sessionstream.runtimes.processor.batch import decide_batch, input_classes, produce
from sessionstream.runtimes.processor.partition import PartitionState
from sessionstream.runtimes.processor.store import PartitionStore
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.commands import Command, command_class
from sessionstream.settings import Settings, get_settings

PARTITIONS = 4


class Record:
    """What `decide_batch` reads of a consumed record (confluent-kafka's `Message` cannot be
    made from Python)."""

    __slots__ = ("_key", "_offset", "_partition", "_topic", "_ts", "_value")

    def __init__(self, topic: str, partition: int, offset: int, key: bytes, value: bytes, ts: int):
        self._topic, self._partition, self._offset = topic, partition, offset
        self._key, self._value, self._ts = key, value, ts

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return 2, self._ts  # TIMESTAMP_LOG_APPEND_TIME

    def error(self) -> None:
        return None


def producer_commands(n: int, sessions: int) -> list[Command]:
    """`bench/_harness.py`'s workload: sessions picked at random, each walking its cycle."""
    rng = random.Random(7)
    sids = [f"step-s{i:04d}" for i in range(sessions)]
    steps: dict[str, int] = {}
    t0 = 1_767_225_600_000
    out = []
    for i in range(n):
        sid = rng.choice(sids)
        k = steps[sid] = steps.get(sid, -1) + 1
        type_, payload = PRODUCER_CYCLE[k % len(PRODUCER_CYCLE)]
        out.append(
            Command(
                command_id=f"{sid}-{k}",
                session_id=sid,
                tenant_id="bench",
                type=type_,
                ts=t0 + i,
                payload=payload,
                actor="bench",
            )
        )
    return out


def records(s: Settings, codec: Codec, commands: list[Command]) -> list[Record]:
    """Each command encoded on its class's topic and its session's partition, appended in
    order (the append time never goes back)."""
    topics = {"producer": s.commands_topic, "worker": s.worker_commands_topic}
    offsets: dict[tuple[str, int], int] = {}
    out = []
    last = 0
    for cmd in commands:
        key = cmd.session_id.encode()
        topic, p = topics[command_class(cmd.type)], partition_for(key, PARTITIONS)
        o = offsets[(topic, p)] = offsets.get((topic, p), -1) + 1
        last = max(last, cmd.ts)
        out.append(Record(topic, p, o, key, codec.encode_command(cmd), last))
    return out


def measure(s: Settings, recs: list[Record], batch_size: int) -> dict[str, Any]:
    codec = reader_codec(get_settings())
    root = Path(tempfile.mkdtemp(prefix="bench-step-"))
    cache = rocksdict.Cache(64 << 20)
    parts = {
        p: PartitionState(
            p,
            PartitionStore(
                root / f"p{p}", p, cache_sessions=100_000, dedup_ttl_s=3600, block_cache=cache
            ),
            state_topic_id="state",
            outcomes_topic_id="dedup",
        )
        for p in range(PARTITIONS)
    }
    # queues what it is given, as it would for a broker; nothing listens on port 1
    producer = Producer(
        {
            "bootstrap.servers": "127.0.0.1:1",
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 2_000_000,
            "log_level": 0,
        }
    )
    step = CommandStep(codec, partitions=PARTITIONS)
    classes = input_classes(s)

    def delivered(_err: Any, _msg: Any) -> None:
        pass

    collections = [0, 0.0, 0.0]  # count, seconds, when the current one started

    def timed(phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            collections[2] = time.perf_counter()
        else:
            collections[0] += 1
            collections[1] += time.perf_counter() - collections[2]

    gc.callbacks.append(timed)
    t = time.perf_counter()
    for r in recs:
        codec.decode_command(r.value())
    decode_s = time.perf_counter() - t
    took = {"decide_batch": 0.0, "produce": 0.0, "store": 0.0}
    events = 0
    clock = time.perf_counter
    t_all = clock()
    for i in range(0, len(recs), batch_size):
        t0 = clock()
        batch = decide_batch(step, recs[i : i + batch_size], [], parts, None, classes)  # type: ignore[arg-type]
        t1 = clock()
        produce(producer, s, codec, batch, delivered)
        t2 = clock()
        # what `_settle` does once the transaction committed
        for p in batch.records.keys() | batch.dedup.keys():
            parts[p].commit(batch.records.get(p, ()), batch.dedup.get(p, ()), i + 1, i + 1)
        t3 = clock()
        took["decide_batch"] += t1 - t0
        took["produce"] += t2 - t1
        took["store"] += t3 - t2
        events += len(batch.events)
    total = clock() - t_all
    gc.callbacks.remove(timed)
    for part in parts.values():
        part.close()
    shutil.rmtree(root, ignore_errors=True)
    n = len(recs)
    return {
        "commands": n,
        "events_per_command": round(events / n, 2),
        "us_per_command": {
            "decode (separate pass)": round(decode_s / n * 1e6, 1),
            **{k: round(v / n * 1e6, 1) for k, v in took.items()},
            "all": round(total / n * 1e6, 1),
        },
        "commands_per_s_one_core": round(n / total),
        "gc": {"collections": collections[0], "ms": round(collections[1] * 1000)},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--commands", type=int, default=60_000)
    ap.add_argument("--sessions", type=int, default=1_000)
    ap.add_argument("--batch", type=int, default=500, help="records per decided batch")
    ap.add_argument(
        "--default-gc", action="store_true", help="CPython's collector thresholds (no settle)"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    s = Settings()
    codec = reader_codec(get_settings())
    out: dict[str, Any] = {
        "python": sys.version.split()[0],
        "batch": args.batch,
        "gc": "default" if args.default_gc else "settled",
    }
    for name, make in (("producer", producer_commands), ("protocol", protocol_commands)):
        recs = records(s, codec, make(args.commands, args.sessions))
        if not args.default_gc:
            settle_collector()
        out[name] = measure(s, recs, args.batch)
        if not args.json:
            print(f"{name}: {json.dumps(out[name])}", flush=True)
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
