"""The fault suite's harness: a whole pipeline, a paced load, a verifier thread, final checks.

`Pipeline` runs processor + sink + workers as real subprocesses on isolated topics and a
private schema; `Load` sends numbered commands and remembers which ones the broker
acknowledged; `Verifier` re-reads the events topic `read_committed` while faults happen and
runs `check_log` on every pass; `assert_consistent` is the end-of-test contract.
`SESSIONSTREAM_SOAK=1` multiplies load and rounds by `SOAK_FACTOR` (`make soak`).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass

import psycopg

from sessionstream.adapters.kafka import LogRecord, read_topic
from sessionstream.adapters.registry import reader_codec
from sessionstream.client import CommandHandle, SessionClient
from sessionstream.core.log_check import state_table
from sessionstream.schemas.events import RunStarted
from sessionstream.settings import Settings, get_settings
from tests.integration.helpers import check_log, fold_log, wait_until
from tests.integration.procs import (
    REPO,
    Proc,
    processor,
    sink,
    wait_processed,
    wait_sink_caught_up,
)
from tests.integration.rows import assert_rows_equal_log

__all__ = [
    "SOAK",
    "Load",
    "Pipeline",
    "Verifier",
    "assert_consistent",
    "restart_server",
    "scaled",
]

SOAK_FACTOR = 10
SOAK = os.environ.get("SESSIONSTREAM_SOAK", "") not in ("", "0")
#: a prompt the reference agent finishes quickly, with one email at the end
RUN_TEXT = "steps=1 tool_ms=50 email=end"
RUN_TIMEOUT_MS = 180_000
#: reading the whole events topic (a soak's 400k events, on a CPU the pipeline keeps busy:
#: 60 s was not always enough)
READ_S = 300.0


def scaled(n: int) -> int:
    return n * SOAK_FACTOR if SOAK else n


def restart_server(which: str) -> None:
    """`stack/stack.sh restart-kafka|restart-postgres`: stop one server, start it, wait."""
    subprocess.run(
        ["bash", str(REPO / "stack/stack.sh"), f"restart-{which}"],
        check=True,
        capture_output=True,
        timeout=300,
    )


class Pipeline:
    """Processor, sink and `workers` reference-agent workers on the test's settings."""

    def __init__(self, s: Settings, workers: int = 2, lease_ms: int = 2000) -> None:
        self.s = s
        self.lease_ms = lease_ms
        self.worker_ids = [f"fw{i}" for i in range(workers)]
        self.proc: Proc | None = None
        self.sink: Proc | None = None
        self.workers: dict[str, Proc] = {}
        self.all: list[Proc] = []  # every process ever started, for the teardown
        os.environ.setdefault("PYTHONFAULTHANDLER", "1")  # inherited by the processes

    def _keep(self, p: Proc) -> Proc:
        self.all.append(p)
        return p

    def start_processor(self) -> None:
        # the same instance id on every restart: it fences the dead one's transaction
        self.proc = self._keep(processor(self.s, "fault-p"))

    def start_sink(self) -> None:
        self.sink = self._keep(sink(self.s, "--batch-size", "200", "--linger-ms", "10"))

    def start_worker(self, wid: str) -> None:
        args = ["worker", "--agent", "reference", "--worker-id", wid]
        args += ["--lease-ms", str(self.lease_ms)]
        self.workers[wid] = self._keep(Proc(self.s, *args).start())

    def start(self) -> Pipeline:
        self.start_processor()
        self.start_sink()
        for wid in self.worker_ids:
            self.start_worker(wid)
        self.wait_ready()
        return self

    def wait_ready(self) -> None:
        assert self.proc is not None and self.sink is not None
        self.proc.wait_log("assigned", timeout=90)
        self.sink.wait_log("assigned", timeout=90)
        for w in self.workers.values():
            w.wait_log("consuming", timeout=90)

    @property
    def current(self) -> list[Proc]:
        out = [p for p in (self.proc, self.sink) if p is not None]
        return out + list(self.workers.values())

    def assert_alive(self) -> None:
        for p in self.current:
            p.assert_alive()

    def kill9(self, what: str) -> None:
        """kill -9 one process and start its replacement (same id, same settings)."""
        if what == "processor":
            assert self.proc is not None
            self.proc.kill9()
            self.start_processor()
        elif what == "sink":
            assert self.sink is not None
            self.sink.kill9()
            self.start_sink()
        else:
            self.workers[what].kill9()
            self.start_worker(what)

    def stop(self) -> None:
        """SIGTERM each; one that does not stop (hung) dumps its stacks to its log first."""
        for p in self.all:
            if p.popen is None or p.popen.poll() is not None:
                continue
            p.popen.send_signal(signal.SIGTERM)
            try:
                p.popen.wait(20)
            except subprocess.TimeoutExpired:
                p.popen.send_signal(signal.SIGABRT)  # faulthandler: every thread's stack
                print(f"{p.args[0]} did not stop on SIGTERM; stacks in {p.log}")
                try:
                    p.popen.wait(10)
                except subprocess.TimeoutExpired:
                    p.popen.kill()
                    p.popen.wait(10)


class Load(threading.Thread):
    """`n` numbered commands over `sessions` sessions at `rate`/s: prompts, steers, aborts..."""

    def __init__(self, s: Settings, n: int, sessions: int, rate: float, seed: int = 5) -> None:
        super().__init__(name="fault-load", daemon=True)
        self.s, self.n, self.sessions, self.rate = s, n, sessions, rate
        self.rnd = random.Random(seed)
        self.tag = uuid.uuid4().hex[:6]  # run ids derive from ids: unique per test run
        self.handles: list[CommandHandle] = []
        self.error: BaseException | None = None
        #: set to end the load early (a test that paces its faults by time, not by count)
        self.halt = threading.Event()

    def command_ids(self) -> set[str]:
        return {h.command.command_id for h in self.handles}

    def acked(self) -> set[str]:
        return {h.command.command_id for h in self.handles if h.acked}

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:  # reported by the test, not lost in a thread
            self.error = e

    def _run(self) -> None:
        kinds = ["prompt"] * 4 + ["steer"] * 2 + ["follow_up"] * 2 + ["send", "abort", "abort"]
        t0 = time.monotonic()
        with SessionClient("tenant-f", self.s) as c:
            for i in range(self.n):
                if self.halt.is_set():
                    self.n = i  # what was sent is the load
                    break
                # pacing, so that the faults land while commands are in flight
                wait = t0 + i / self.rate - time.monotonic()
                if wait > 0:
                    c.producer.poll(wait)
                sid = f"f-{self.tag}-{i % self.sessions}"
                kind = self.rnd.choice(kinds)
                text = f"#{i} {RUN_TEXT}"
                payload: dict[str, object] = {"text": text}
                if kind == "prompt":
                    policy = self.rnd.choice(["reject", "enqueue", "enqueue", "interrupt"])
                    payload.update(policy=policy, timeoutMs=RUN_TIMEOUT_MS)
                elif kind == "send":
                    payload["timeoutMs"] = RUN_TIMEOUT_MS
                elif kind == "abort":
                    payload = {"reason": f"abort #{i}"}
                elif kind == "steer":
                    payload = {"text": f"steer #{i}: try another way"}
                cmd = c.command(sid, kind, payload, command_id=f"fc-{self.tag}-{i}")
                self.handles.append(c.submit(cmd, track=False))
            # the idempotent producer retries across a broker restart: wait for every ack
            c.flush(300)


@dataclass
class VerifierState:
    passes: int = 0
    errors: int = 0
    last_error: str = ""
    violations: list[str] | None = None
    outcomes: frozenset[str] = frozenset()


class Verifier(threading.Thread):
    """Reads the events topic `read_committed` over and over; `check_log` on every pass."""

    def __init__(self, s: Settings, interval: float = 0.3) -> None:
        super().__init__(name="fault-verifier", daemon=True)
        self.s = s
        self.interval = interval
        self.codec = reader_codec(get_settings())
        self.halt = threading.Event()
        self.state = VerifierState(violations=[])

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                report = check_log(read_topic(self.s, self.s.events_topic, timeout=30), self.codec)
            except Exception as e:  # the broker restarting: try again
                self.state.errors += 1
                self.state.last_error = repr(e)
            else:
                assert self.state.violations is not None
                if report.violations and not self.state.violations:
                    self.state.violations.extend(report.violations)
                self.state.outcomes = frozenset(report.outcomes)
                self.state.passes += 1
            self.halt.wait(self.interval)

    def progress(self, ids: set[str], total: int) -> float:
        """Share of the load whose outcome the verifier has seen."""
        return len(ids & self.state.outcomes) / total

    def finish(self) -> VerifierState:
        self.halt.set()
        self.join(60)
        return self.state


def _wait_for_outcomes(s: Settings, ids: set[str], pipe: Pipeline) -> None:
    left: set[str] = set(ids)

    def missing() -> bool:
        pipe.assert_alive()
        got = set(check_log(read_topic(s, s.events_topic, timeout=READ_S)).outcomes)
        left.difference_update(got)
        return not left

    def say() -> str:
        tail = pipe.proc.log_text()[-3000:] if pipe.proc is not None else ""
        return (
            f"an outcome for every acknowledged command: {len(left)} of {len(ids)} missing,"
            f" e.g. {sorted(left)[:5]}; the processor's log ends with:\n{tail}"
        )

    wait_until(missing, timeout=180, interval=1.0, what=say)


def _runs_settled(s: Settings, pipe: Pipeline, unsettled: list[str] | None = None) -> bool:
    pipe.assert_alive()
    folded = fold_log(read_topic(s, s.events_topic, timeout=READ_S))
    open_runs = [st for st in folded.values() if st.active is not None]
    if unsettled is not None:
        unsettled[:] = [
            f"{st.session_id}: {st.active.run_id} {st.active.status} gen {st.active.generation}"
            f" holder {st.active.lease_owner} until {st.active.lease_expires_at}"
            for st in open_runs[:5]
            if st.active is not None
        ]
    return not open_runs


def assert_consistent(
    s: Settings, pipe: Pipeline, load: Load, verifier: Verifier, settle_s: float = 180.0
) -> dict[str, int]:
    """The fault suite's contract, after the load; returns a few counts for the report.
    `settle_s`: how long the runs (and the tasks queued behind them) may take to end."""
    load.join(load.n / load.rate + 300)
    assert not load.is_alive(), "the load did not finish"
    assert load.error is None, f"load failed: {load.error!r}"
    acked = load.acked()
    if acked != load.command_ids():
        failed = [(h.command.command_id, h.error) for h in load.handles if not h.acked]
        raise AssertionError(f"{len(failed)} commands not acked: {failed[:5]}")
    # Step 1: every acknowledged command got its outcome; every run came to an end
    _wait_for_outcomes(s, acked, pipe)
    unsettled: list[str] = []
    try:
        wait_until(
            lambda: _runs_settled(s, pipe, unsettled),
            timeout=settle_s,
            interval=1.0,
            what="runs to end",
        )
    except AssertionError as e:
        raise AssertionError(f"{e}; still active: {unsettled}") from None
    wait_processed(s, timeout=180, procs=pipe.current)
    wait_sink_caught_up(s, timeout=180, procs=pipe.current)
    vstate = verifier.finish()
    assert vstate.violations == [], vstate.violations
    assert vstate.passes >= 3, f"verifier made {vstate.passes} passes ({vstate.last_error})"
    # Step 2: the log — no duplicate or gap in (session, run, seq), one active run at a time
    records = read_topic(s, s.events_topic, timeout=READ_S)
    report = check_log(records)
    assert report.ok, report.violations
    lost = acked - set(report.outcomes)
    assert not lost, f"{len(lost)} acknowledged commands lost, e.g. {sorted(lost)[:3]}"
    # Step 3: the state table is the fold of the log (read both until one moment agrees)
    _assert_state_is_fold(s)
    # Step 4: PostgreSQL equals the log
    rows = assert_rows_equal_log(s)
    # Step 5: every run ended (or may still run: its deadline is ahead); emails at most once
    terminal = _assert_runs_and_emails(s, records)
    pipe.assert_alive()
    return {
        "commands": len(acked),
        "events": report.events,
        "runs": report.runs,
        "rows": rows,
        "verifier_passes": vstate.passes,
        **terminal,
    }


def _assert_state_is_fold(s: Settings) -> None:
    diff: list[str] = []

    def agree() -> bool:
        folded = fold_log(read_topic(s, s.events_topic, timeout=READ_S))
        table = state_table(read_topic(s, s.state_topic))
        diff[:] = sorted(k for k in set(folded) | set(table) if folded.get(k) != table.get(k))
        return not diff

    try:
        wait_until(agree, timeout=60, interval=1.0, what="state table == fold of the log")
    except AssertionError as e:  # which sessions, and how: the wait alone does not say
        folded = fold_log(read_topic(s, s.events_topic, timeout=READ_S))
        table = state_table(read_topic(s, s.state_topic))
        shown = [f"{k}: fold {folded.get(k)!r} / table {table.get(k)!r}" for k in diff[:3]]
        raise AssertionError(f"{e}; {len(diff)} sessions differ, e.g. {shown}") from None
    assert not diff, diff[:5]


def _assert_runs_and_emails(s: Settings, records: list[LogRecord]) -> dict[str, int]:
    codec = reader_codec(get_settings())
    started: dict[str, str] = {}
    statuses: dict[str, str] = {}
    deadline: dict[str, int] = {}
    for r in records:
        e = codec.decode_event(r.value or b"")
        if e.type == "run.started":
            p = e.payload_as(RunStarted)
            started[e.run_id], deadline[e.run_id] = p.prompt, p.timeout_at
        elif e.type == "run.finished":
            statuses[e.run_id] = str(e.payload.model_dump()["terminal_status"])
    now_ms = int(time.time() * 1000)
    open_runs = [r for r in started if r not in statuses and deadline[r] <= now_ms]
    assert not open_runs, f"{len(open_runs)} runs past their deadline without an end"
    with psycopg.connect(s.database_url, options=f"-c search_path={s.database_schema}") as conn:
        rows = conn.execute(
            "select run_id, idempotency_key, count(*) from agent_outbox"
            " where run_id = any(%s) group by run_id, idempotency_key",
            (list(started),),
        ).fetchall()
    twice = [k for _r, k, n in rows if int(n) > 1]
    assert not twice, f"emails sent twice: {twice[:3]}"
    emailed = {str(r) for r, _k, _n in rows}
    completed = [r for r, st in statuses.items() if st == "completed" and "email=end" in started[r]]
    unsent = [r for r in completed if r not in emailed]
    assert not unsent, f"{len(unsent)} completed runs without their email, e.g. {unsent[:3]}"
    counts = {f"runs_{st}": 0 for st in ("completed", "cancelled", "failed", "timed_out")}
    for st in statuses.values():
        counts[f"runs_{st}"] = counts.get(f"runs_{st}", 0) + 1
    counts["emails"] = len(rows)
    return counts
