"""The workload every system gets, and the per-cycle correctness check.

A cycle on one idle session: `prompt` (policy reject) -> accepted, starts a run; a second
`prompt` while that run is active -> rejected `session_busy`; `abort` naming the run -> the
run ends cancelled. Each command is awaited for its outcome before the next of its cycle.

* Closed loop, C cycles in flight: C tasks, each takes an idle session from the pool, runs
  a cycle, gives the session back, and starts the next. Reported: commands/s completed in
  the measured window (after a warm-up).
* Open loop at R commands/s: a new cycle starts every 3/R s on the schedule, whatever
  happened to the earlier ones (falling behind is reported as `late_max_ms`); inside a
  cycle each command goes as soon as the previous outcome is in. Reported: send -> outcome
  of every command sent after the warm-up, p50/p99/max (HdrHistogram, 3 digits).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from bench._harness import percentiles

now = time.perf_counter

#: a command without its outcome after this long counts as "no outcome"
COMMAND_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Result:
    """A command's outcome, in the same terms for every system."""

    status: str  # accepted | rejected | other
    reason: str | None = None
    run_id: str | None = None
    #: for an abort: the run ended cancelled (in this command's outcome)
    cancelled: bool = False


class System(Protocol):
    name: str

    async def start(self) -> None: ...

    def processes(self) -> dict[str, int]: ...

    async def send(self, session: str, kind: str, run_id: str | None, cid: str) -> Result: ...

    async def stop(self) -> None: ...


@dataclass
class Tally:
    """What one phase saw: per-command (sent, latency) and what went wrong."""

    start: float = 0.0
    end: float = 0.0
    latencies: list[float] = field(default_factory=list)
    done_in_window: int = 0
    commands: int = 0
    cycles: int = 0
    cycles_ok: int = 0
    cycles_without_outcome: int = 0
    two_active_runs: int = 0
    unexpected: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    late_max: float = 0.0


class Pool:
    """Idle sessions; a session whose cycle went wrong is not handed out again."""

    def __init__(self, prefix: str, sessions: int) -> None:
        self.idle = deque(f"{prefix}-s{i:04d}" for i in range(sessions))
        self.broken: set[str] = set()
        self.seq = 0

    def cid(self, session: str) -> str:
        self.seq += 1
        return f"{session}-c{self.seq}"


async def _one(
    system: System, session: str, kind: str, run: str | None, pool: Pool, t: Tally
) -> tuple[Result | None, float]:
    t0 = now()
    try:
        r = await asyncio.wait_for(
            system.send(session, kind, run, pool.cid(session)), COMMAND_TIMEOUT_S
        )
    except TimeoutError:
        return None, t0
    except Exception as e:  # counted per type; the cycle is abandoned
        t.errors[f"{kind}: {type(e).__name__}: {str(e)[:120]}"] += 1
        return None, t0
    t1 = now()
    t.commands += 1
    if t.start <= t0 <= t.end:
        t.latencies.append(t1 - t0)
    if t.start <= t1 <= t.end:
        t.done_in_window += 1
    return r, t0


async def cycle(system: System, session: str, pool: Pool, t: Tally) -> bool:
    """One cycle on `session`; checks each outcome. True when the session is idle again."""
    t.cycles += 1
    first, _ = await _one(system, session, "prompt", None, pool, t)
    if first is None:
        t.cycles_without_outcome += 1
        return False
    if first.status != "accepted" or not first.run_id:
        t.unexpected[f"prompt: {first.status} {first.reason}"] += 1
        return False
    second, _ = await _one(system, session, "prompt", None, pool, t)
    if second is None:
        t.cycles_without_outcome += 1
        return False
    if second.status == "accepted":
        t.two_active_runs += 1
        return False
    if second.reason != "session_busy":
        t.unexpected[f"second prompt: {second.status} {second.reason}"] += 1
    abort, _ = await _one(system, session, "abort", first.run_id, pool, t)
    if abort is None:
        t.cycles_without_outcome += 1
        return False
    if abort.status != "accepted" or not abort.cancelled:
        t.unexpected[f"abort: {abort.status} {abort.reason} cancelled={abort.cancelled}"] += 1
        return False
    t.cycles_ok += 1
    return True


async def _run_cycle(system: System, pool: Pool, t: Tally, session: str) -> None:
    if await cycle(system, session, pool, t):
        pool.idle.append(session)
    else:
        pool.broken.add(session)


async def closed_loop(system: System, pool: Pool, c: int, warm: float, secs: float) -> Tally:
    t = Tally()
    t.start = now() + warm
    t.end = t.start + secs

    async def worker() -> None:
        while now() < t.end:
            if not pool.idle:
                await asyncio.sleep(0.001)
                continue
            await _run_cycle(system, pool, t, pool.idle.popleft())

    await asyncio.gather(*(worker() for _ in range(c)))
    return t


async def open_loop(system: System, pool: Pool, rate: float, warm: float, secs: float) -> Tally:
    t = Tally()
    t0 = now()
    t.start, t.end = t0 + warm, t0 + warm + secs
    interval = 3.0 / rate
    tasks: set[asyncio.Task[None]] = set()
    i = 0
    while True:
        due = t0 + i * interval
        if due >= t.end:
            break
        wait = due - now()
        if wait > 0:
            await asyncio.sleep(wait)
        while not pool.idle:  # all sessions busy: the system is far behind
            await asyncio.sleep(0.001)
        t.late_max = max(t.late_max, now() - due)
        task = asyncio.create_task(_run_cycle(system, pool, t, pool.idle.popleft()))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        i += 1
    # the cycles still going run to their end; only commands sent in the window count
    if tasks:
        await asyncio.wait(tasks, timeout=3 * COMMAND_TIMEOUT_S + 5)
    return t


def summary(t: Tally, mode: str, secs: float) -> dict[str, Any]:
    out: dict[str, Any] = {
        "commands": t.commands,
        "cycles": t.cycles,
        "cycles_ok": t.cycles_ok,
        "cycles_without_outcome": t.cycles_without_outcome,
        "two_active_runs": t.two_active_runs,
        "unexpected": dict(t.unexpected),
        "errors": dict(t.errors),
    }
    if mode == "closed":
        out["commands_per_s"] = round(t.done_in_window / secs, 1)
    else:
        out["measured"] = len(t.latencies)
        out["achieved_commands_per_s"] = round(len(t.latencies) / secs, 1)
        out["late_max_ms"] = round(1000 * t.late_max, 1)
        out.update(percentiles(t.latencies) if t.latencies else {})
    return out
