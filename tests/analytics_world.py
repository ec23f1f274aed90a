"""A generated history of sessions for the analytics tests, with its numbers counted by hand.

Each session has a tenant, runs that complete, fail, time out, are cancelled (with a known
cancel latency) or stay active, progress events analytics ignores, and rejections and
`run.queued` entries on its session log. `Expected` is computed from the scenario itself,
never through `sessionstream.runtimes.analytics`, so the tests compare two independent countings.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from dataclasses import dataclass, field

from sessionstream.schemas.events import (
    SESSION_LOG,
    CancelRequested,
    CommandRejected,
    Event,
    Progress,
    RunFinished,
    RunQueued,
    RunStarted,
)

__all__ = ["COUNTED_TYPES", "MINUTE", "Expected", "World", "make_world"]

MINUTE = 60_000
OUTCOMES = ("completed", "failed", "timed_out", "cancelled", "active")
#: the event types analytics folds; a duplicate of one of these is a "repeat"
COUNTED_TYPES = frozenset(
    {"run.started", "run.cancel_requested", "run.finished", "command.rejected"}
)
REASONS = ("session_busy", "stale_generation", "not_lease_holder", "queue_full")


@dataclass
class Expected:
    """The stats a correct analytics app reports for a set of events."""

    #: (minute, tenant) -> field -> count; fields "started", "completed", ... "timedOut"
    runs: dict[tuple[int, str], Counter[str]] = field(default_factory=dict)
    #: (minute, tenant, reason) -> count
    rejections: Counter[tuple[int, str, str]] = field(default_factory=Counter)
    #: cancel latencies in ms
    latencies: list[int] = field(default_factory=list)
    #: tenant -> runs started and not finished
    active: Counter[str] = field(default_factory=Counter)

    def add_run(self, minute: int, tenant: str, what: str) -> None:
        self.runs.setdefault((minute, tenant), Counter())[what] += 1


@dataclass
class World:
    events: list[Event]
    expected: Expected


def _minute(ts: int) -> int:
    return ts - ts % MINUTE


def make_world(sessions: int, runs_per_session: int, start_ms: int, seed: int = 7) -> World:
    """Events of `sessions` sessions, each running `runs_per_session` runs one after another.

    Event time advances by whole seconds from `start_ms`, so runs spread over minutes.
    """
    rnd = random.Random(seed)
    tenants = ["acme", "globex", "initech"]
    events: list[Event] = []
    exp = Expected()
    tag = uuid.UUID(int=rnd.getrandbits(128)).hex[:8]
    for s in range(sessions):
        sid = f"an-{tag}-{s}"
        tenant = tenants[s % len(tenants)]
        ts = start_ms + rnd.randrange(0, 120) * 1000
        log_seq = 0

        def ev(
            run_id: str,
            seq: int,
            type_: str,
            payload: object,
            t: int,
            sid: str = sid,
            tenant: str = tenant,
        ) -> Event:
            return Event.model_validate(
                {
                    "session_id": sid,
                    "run_id": run_id,
                    "seq": seq,
                    "type": type_,
                    "payload": payload,
                    "generation": 1 if run_id != SESSION_LOG else 0,
                    "command_id": f"{sid}-{run_id[:8]}-{seq}",
                    "ts": t,
                    "tenant_id": tenant,
                }
            )

        for r in range(runs_per_session):
            rid = str(uuid.UUID(int=rnd.getrandbits(128)))
            # the last run of a session may stay active; earlier ones must end
            outcome = rnd.choice(OUTCOMES if r == runs_per_session - 1 else OUTCOMES[:4])
            seq = 1
            events.append(
                ev(
                    rid,
                    seq,
                    "run.started",
                    RunStarted(
                        prompt="p",
                        origin="prompt",
                        source_command_id=f"c{r}",
                        timeout_at=ts + 600_000,
                    ),
                    ts,
                )
            )
            exp.add_run(_minute(ts), tenant, "started")
            for _ in range(rnd.randrange(0, 4)):
                ts += 1000 * rnd.randrange(1, 20)
                seq += 1
                events.append(
                    ev(rid, seq, "model.request.started", Progress(worker_id="w1", name="gpt"), ts)
                )
            if rnd.random() < 0.4:
                # a rejection on the session log while the run is busy
                ts += 1000
                log_seq += 1
                reason = rnd.choice(REASONS)
                events.append(
                    ev(
                        SESSION_LOG,
                        log_seq,
                        "command.rejected",
                        CommandRejected(reason=reason, command_type="prompt"),
                        ts,
                    )
                )
                exp.rejections[(_minute(ts), tenant, reason)] += 1
            if rnd.random() < 0.2:
                ts += 1000
                log_seq += 1
                events.append(
                    ev(
                        SESSION_LOG,
                        log_seq,
                        "run.queued",
                        RunQueued(source_command_id="q", kind="prompt", text="t"),
                        ts,
                    )
                )
            if outcome == "active":
                exp.active[tenant] += 1
                continue
            if outcome == "cancelled":
                ts += 1000 * rnd.randrange(1, 30)
                seq += 1
                events.append(
                    ev(
                        rid,
                        seq,
                        "run.cancel_requested",
                        CancelRequested(reason="user", cancel_deadline_at=ts + 30_000),
                        ts,
                    )
                )
                latency = rnd.choice([0, 250, 1000, 3000, 12_000, 29_000])
                ts += latency
                exp.latencies.append(latency)
            else:
                ts += 1000 * rnd.randrange(1, 60)
            seq += 1
            events.append(ev(rid, seq, "run.finished", RunFinished(terminal_status=outcome), ts))
            exp.add_run(_minute(ts), tenant, "timedOut" if outcome == "timed_out" else outcome)
            ts += 1000 * rnd.randrange(1, 10)
    return World(events=events, expected=exp)
