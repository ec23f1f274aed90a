"""Reusable pieces for benchmarks against the real broker.

Isolated topics and groups per run, the processor as a subprocess (with its CPU time read
from /proc), a paced command producer that records send times, a `read_committed` tail that
records when each command's first event became visible, and the processor group's offsets.
Everything here times with `time.perf_counter()` in the benchmark's own process.
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from hdrh.histogram import HdrHistogram  # type: ignore[import-untyped]

from sessionstream.adapters.kafka import client_config, read_topic, take
from sessionstream.adapters.registry import reader_codec
from sessionstream.apps._procs import Service, cpu_seconds
from sessionstream.client import CommandHandle, SessionClient
from sessionstream.core.log_check import check_log, fold_log, state_table
from sessionstream.schemas.commands import (
    AbortPayload,
    Command,
    FollowUpPayload,
    PromptPayload,
    SendPayload,
    SteerPayload,
)
from sessionstream.settings import Settings
from stack.worlds import delete_world

REPO = Path(__file__).resolve().parents[1]
TICKS = os.sysconf("SC_CLK_TCK")


# -- topics and groups ------------------------------------------------------------------------
def delete_topics_and_groups(s: Settings) -> list[str]:
    """Best effort; returns what could not be deleted."""
    return delete_world([s], schemas=False)


# -- processes ----------------------------------------------------------------------------------
def broker_pid() -> int | None:
    """The local Kafka broker's pid (a JVM running kafka.Kafka), if it runs on this host."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if b"kafka.Kafka\0" in (entry / "cmdline").read_bytes():
                    return int(entry.name)
    return None


class Processor(Service):
    """`sessionstream processor --instance ID` as a subprocess, its output in a temp file."""

    def __init__(self, settings: Settings, instance: str) -> None:
        fd, path = tempfile.mkstemp(prefix=f"{instance}-", suffix=".log")
        os.close(fd)
        super().__init__(instance, settings, ["processor", "--instance", instance], REPO)
        self.log = Path(path)
        self.cwd = REPO
        self.instance = instance
        self.started_at = 0.0

    def start(self) -> Processor:
        self.started_at = time.perf_counter()
        super().start()
        return self

    def log_text(self) -> str:
        return self.text()

    def assert_alive(self) -> None:
        assert self.popen is not None
        code = self.popen.poll()
        if code is not None:
            raise RuntimeError(f"processor exited with {code}:\n{self.log_text()[-3000:]}")


# -- offsets ------------------------------------------------------------------------------------
def end_offsets(consumer: Consumer, topic: str, partitions: int) -> dict[int, int]:
    """High watermark per partition (transaction markers count as offsets too)."""
    return {
        p: consumer.get_watermark_offsets(TopicPartition(topic, p), 10, cached=False)[1]
        for p in range(partitions)
    }


class Offsets:
    """The processor group's committed offsets and the topics' end offsets.

    `read_uncommitted` so the broker answers with the last *committed* offsets at once
    instead of waiting out a pending transaction (KIP-447 `require_stable`), which is what
    a dead processor leaves behind until its successor fences it.
    """

    def __init__(self, s: Settings) -> None:
        self.s = s
        self.consumer = Consumer(
            client_config(
                s,
                **{
                    "group.id": s.processor_group,
                    "enable.auto.commit": False,
                    "isolation.level": "read_uncommitted",
                },
            )
        )
        self.parts = range(s.partitions)

    def committed(self) -> dict[int, int]:
        tps = [TopicPartition(self.s.commands_topic, p) for p in self.parts]
        return {tp.partition: max(tp.offset, 0) for tp in self.consumer.committed(tps, 10)}

    def end(self, topic: str | None = None) -> dict[int, int]:
        return end_offsets(self.consumer, topic or self.s.commands_topic, self.s.partitions)

    def lag(self) -> tuple[int, dict[int, int]]:
        """(commands not yet committed, committed offsets)."""
        end, done = self.end(), self.committed()
        return sum(max(0, end[p] - done[p]) for p in self.parts), done

    def wait(
        self, pred: Any, proc: Processor, timeout: float = 300
    ) -> tuple[float, dict[int, int]]:
        """Poll the committed offsets (20 ms) until `pred(committed)`; (when, committed)."""
        deadline = time.perf_counter() + timeout
        while True:
            proc.assert_alive()
            c, t = self.committed(), time.perf_counter()
            if pred(c):
                return t, c
            if t > deadline:
                raise TimeoutError(f"processor offsets {c} not there after {timeout}s")
            time.sleep(0.02)

    def wait_past(self, target: dict[int, int], proc: Processor) -> tuple[float, dict[int, int]]:
        """Until the group committed `target` (e.g. the end offsets) on every partition."""
        return self.wait(lambda c: all(c[p] >= o for p, o in target.items()), proc)

    def close(self) -> None:
        self.consumer.close()


# -- workload -----------------------------------------------------------------------------------
_TEXT = (
    "Find the three cheapest direct flights from Berlin to Lisbon next weekend, compare "
    "them with the train, and draft a short summary for the team channel."
)
#: one session's cycle of producer commands: busy prompts, queueing, interrupts, aborts
CYCLE: list[tuple[str, Any]] = [
    ("prompt", PromptPayload(text=_TEXT, policy="reject")),
    ("steer", SteerPayload(text="Only direct flights, and skip the low-cost carriers.")),
    ("follow_up", FollowUpPayload(text="Also check trains that leave after 6 pm.")),
    ("send", SendPayload(text="And a hotel near the old town for two nights.")),
    ("prompt", PromptPayload(text=_TEXT[:90], policy="enqueue")),
    ("abort", AbortPayload(reason="user")),
    ("prompt", PromptPayload(text="Forget that: book the 9:40 flight.", policy="interrupt")),
    ("steer", SteerPayload(text="Use the company card.")),
    ("prompt", PromptPayload(text=_TEXT[:60], policy="reject")),
    ("abort", AbortPayload(reason="user")),
]


class Workload:
    """Producer commands on `sessions` sessions picked at random, each walking `CYCLE`."""

    def __init__(self, client: SessionClient, prefix: str, sessions: int, seed: int = 7) -> None:
        self.client = client
        self.sids = [f"{prefix}-s{i:04d}" for i in range(sessions)]
        self.rng = random.Random(seed)
        self.steps: Counter[str] = Counter()

    def next(self) -> Command:
        sid = self.rng.choice(self.sids)
        n = self.steps[sid]
        self.steps[sid] += 1
        type_, payload = CYCLE[n % len(CYCLE)]
        return self.client.command(sid, type_, payload, command_id=f"{sid}-{n}")


class PacedProducer(threading.Thread):
    """Sends `workload` commands at `rate`/s until stopped (or `limit` sent).

    Records each command's send time (just before `submit`) and its delivery handle.
    Falling behind the schedule sends immediately (catch-up), and is reported as `late_max`.
    """

    def __init__(self, client: SessionClient, workload: Workload, rate: float) -> None:
        super().__init__(daemon=True)
        self.client, self.workload, self.rate = client, workload, rate
        self.sent: dict[str, float] = {}
        self.handles: dict[str, CommandHandle] = {}
        self.halt = threading.Event()
        self.first = self.last = 0.0
        self.late_max = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            t0 = time.perf_counter()
            i = 0
            while not self.halt.is_set():
                wait = t0 + i / self.rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                else:
                    self.late_max = max(self.late_max, -wait)
                cmd = self.workload.next()
                now = time.perf_counter()
                self.sent[cmd.command_id] = now
                self.handles[cmd.command_id] = self.client.submit(cmd, track=False)
                self.first = self.first or now
                self.last = now
                i += 1
            self.client.flush()
        except BaseException as e:  # surfaced by the main thread
            self.error = e

    def stop(self) -> None:
        self.halt.set()
        self.join(30)
        if self.error is not None:
            raise self.error

    @property
    def achieved_rate(self) -> float:
        return (len(self.sent) - 1) / (self.last - self.first) if self.last > self.first else 0.0


class EventTail(threading.Thread):
    """Reads the events topic `read_committed` from its current end; per command id, the
    perf_counter time its first event was handed to us."""

    def __init__(self, s: Settings) -> None:
        super().__init__(daemon=True)
        self.codec = reader_codec(s)
        self.first_seen: dict[str, float] = {}
        self.events = 0
        self.halt = threading.Event()
        self.error: BaseException | None = None
        self.consumer = Consumer(
            client_config(
                s,
                **{
                    "group.id": f"bench-tail-{uuid.uuid4().hex[:8]}",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "fetch.wait.max.ms": 10,
                },
            )
        )
        ends = end_offsets(self.consumer, s.events_topic, s.partitions)
        self.consumer.assign([TopicPartition(s.events_topic, p, o) for p, o in ends.items()])

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                msgs = take(self.consumer, 1000, 0.05)
                now = time.perf_counter()
                for m in msgs:
                    if m.error() is not None:
                        raise KafkaException(m.error())
                    cid = self.codec.decode_event(m.value() or b"").command_id
                    self.first_seen.setdefault(cid, now)
                    self.events += 1
        except BaseException as e:
            self.error = e
        finally:
            self.consumer.close()

    def stop(self) -> None:
        self.halt.set()
        self.join(30)
        if self.error is not None:
            raise self.error

    def settle(self, ids: Any, timeout: float = 60) -> int:
        """Wait for the first event of every command in `ids`; returns how many never came."""
        seen = self.first_seen
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: all(c in seen for c in ids), timeout, "outcomes", 0.1)
        return sum(1 for c in ids if c not in seen)


def first_after(prod: PacedProducer, seen: dict[str, float], at: dict[int, int], t: float) -> float:
    """When the first event of a command at or past the committed offsets `at` became
    visible after time `t`: the first output of a processor that took over at `t`."""
    return min(
        seen[c]
        for c, h in prod.handles.items()
        if h.partition is not None
        and h.offset is not None
        and h.offset >= at[h.partition]
        and seen.get(c, 0) > t
    )


# -- the log ------------------------------------------------------------------------------------
def verify_log(s: Settings, ids_by_phase: dict[str, list[str]]) -> dict[str, Any]:
    """`check_log` over the whole events log, plus: every command sent has an outcome, the
    state table equals the fold of the log, no dead letters. Events and rejections per phase."""
    events = read_topic(s, s.events_topic, timeout=180)
    report = check_log(events, reader_codec(s))
    sent = {c for ids in ids_by_phase.values() for c in ids}
    missing = sent - set(report.outcomes)
    state_ok = state_table(read_topic(s, s.state_topic)) == fold_log(events, reader_codec(s))
    dlq = len(read_topic(s, s.dlq_topic))
    phases = {}
    for phase, ids in ids_by_phase.items():
        evs = [e for c in ids for e in report.outcomes.get(c, [])]
        rejected = sum(e.type == "command.rejected" for e in evs)
        phases[phase] = {"commands": len(ids), "events": len(evs), "rejected": rejected}
    return {
        "ok": report.ok and not missing and state_ok and dlq == 0,
        "events": report.events,
        "sessions": report.sessions,
        "runs": report.runs,
        "identical_duplicates": report.identical_duplicates,
        "violations": report.violations,
        "commands_without_outcome": len(missing),
        "state_table_equals_fold": state_ok,
        "dead_letters": dlq,
        "phases": phases,
    }


# -- numbers ------------------------------------------------------------------------------------
def percentiles(seconds: list[float]) -> dict[str, float]:
    """p50/p90/p99/p99.9/max in ms of latencies given in seconds (HdrHistogram, 3 digits)."""
    h = HdrHistogram(1, 600_000_000, 3)  # microseconds, up to 10 minutes
    for v in seconds:
        h.record_value(max(1, round(v * 1e6)))
    out = {f"p{q:g}_ms": h.get_value_at_percentile(q) / 1000 for q in (50, 90, 99, 99.9)}
    out["max_ms"] = h.get_max_value() / 1000
    out["mean_ms"] = round(h.get_mean_value() / 1000, 3)
    return out


def wait_for(pred: Any, timeout: float, what: str, interval: float = 0.05) -> float:
    """Poll `pred()` until true; returns the perf_counter time it became true."""
    deadline = time.perf_counter() + timeout
    while not pred():
        if time.perf_counter() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
    return time.perf_counter()


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / TICKS, sum(fields) / TICKS


class CpuMeter:
    """CPU used between `__init__` and `read()` by a process, the broker and the machine."""

    def __init__(self, pid: int | None, broker: int | None) -> None:
        self.pid, self.broker = pid, broker
        self.t0, self.p0, self.b0 = time.perf_counter(), cpu_seconds(pid), cpu_seconds(broker)
        self.m0 = machine_busy()[0]

    def read(self) -> dict[str, float | None]:
        secs = time.perf_counter() - self.t0
        p, b, m = cpu_seconds(self.pid) - self.p0, cpu_seconds(self.broker), machine_busy()[0]
        return {
            "processor_cpu_s": round(p, 2),
            "processor_cores": round(p / secs, 2),
            "broker_cores": round((b - self.b0) / secs, 2) if self.broker else None,
            "machine_busy_cores": round((m - self.m0) / secs, 2),
        }
