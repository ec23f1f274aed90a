"""Check the protocol's invariants on the event log (records read by any reader).

Used by the fault tests, `sessionstream audit` and the benchmarks: what the processor wrote
must show at most one active run per session at every point, `seq` contiguous from 1 per
run, unique keys, every session on one partition, nothing after a run's terminal event,
and a state table equal to the fold of the log.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from sessionstream.core.decider import evolve
from sessionstream.core.state import SessionState
from sessionstream.core.step import decode_state
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.events import ACTIVE_STATUSES, SESSION_LOG, Event

__all__ = ["LogReport", "Record", "check_log", "fold_log", "state_table"]


class Record(Protocol):
    """A record of the events (or state) topic as any reader hands it over
    (`sessionstream.adapters.kafka.LogRecord` is one)."""

    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...


@dataclass
class LogReport:
    """What `check_log` found; `violations` empty means the log keeps the protocol."""

    events: int = 0
    sessions: int = 0
    runs: int = 0
    identical_duplicates: int = 0
    violations: list[str] = field(default_factory=list)
    outcomes: dict[str, list[Event]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations


def check_log(records: Iterable[Record], codec: Codec | None = None, limit: int = 50) -> LogReport:
    """Check the invariants over decoded events, in each partition's order."""
    codec = codec or Codec()
    report = LogReport()
    seen: dict[bytes, bytes] = {}
    partition_of: dict[str, int] = {}
    last_seq: dict[tuple[str, str], int] = {}
    active: dict[str, str] = {}
    finished: set[tuple[str, str]] = set()
    outcomes: dict[str, list[Event]] = defaultdict(list)

    def bad(msg: str) -> None:
        if len(report.violations) < limit:
            report.violations.append(msg)

    for r in records:
        if r.key is None:
            bad(f"p{r.partition}@{r.offset}: keyless record in the events topic")
            continue
        if r.value is None:
            continue  # a tombstone: the sink erased the key (docs/protocol.md, erasure)
        if r.key in seen:
            if seen[r.key] == r.value:
                report.identical_duplicates += 1
            else:
                bad(f"p{r.partition}@{r.offset}: key {r.key!r} written twice with different bytes")
            continue
        seen[r.key] = r.value
        e = codec.decode_event(r.value)
        report.events += 1
        if e.key.encode() != r.key:
            bad(f"p{r.partition}@{r.offset}: key {r.key!r} is not the event's {e.key!r}")
        home = partition_of.setdefault(e.session_id, r.partition)
        if home != r.partition:
            bad(f"session {e.session_id} on partitions {home} and {r.partition}: two writers")
        run = (e.session_id, e.run_id)
        expected = last_seq.get(run, 0) + 1
        if e.seq != expected:
            bad(
                f"{e.session_id}/{e.run_id}: seq {e.seq}, expected {expected} "
                f"(p{r.partition}@{r.offset})"
            )
        last_seq[run] = e.seq
        if run in finished:
            bad(f"{e.session_id}/{e.run_id}: {e.type} after the run's terminal event")
        if e.run_id != SESSION_LOG:
            if e.type == "run.started":
                other = active.get(e.session_id)
                if other is not None:
                    bad(f"session {e.session_id}: run {e.run_id} started while {other} is active")
                active[e.session_id] = e.run_id
                report.runs += 1
            elif e.type == "run.finished":
                active.pop(e.session_id, None)
                finished.add(run)
        outcomes[e.command_id].append(e)
    report.sessions = len(partition_of)
    report.outcomes = dict(outcomes)
    for cid, evs in report.outcomes.items():
        # a command id is decided once; refusals of commands the session never took under
        # the id stand aside: another tenant's (refused every time, the owner may still use
        # the id), one on a topic its writer may not use (its own topic may still take
        # it), another command reusing a decided id, a timer re-fired before it was due
        rejected = [
            e
            for e in evs
            if e.type == "command.rejected"
            and getattr(e.payload, "reason", "") not in _REMEMBER_NOTHING
        ]
        if len(rejected) > 1:
            bad(f"command {cid}: {len(rejected)} rejections")
        if rejected and any(
            e.type not in ("command.rejected", "run.stale_write_recorded") for e in evs
        ):
            bad(f"command {cid}: rejected and applied")
    return report


_REMEMBER_NOTHING = frozenset(
    {"tenant_mismatch", "not_allowed_here", "command_id_reused", "timer_stale"}
)


def fold_log(records: Iterable[Record], codec: Codec | None = None) -> dict[str, SessionState]:
    """The state every session's events imply."""
    codec = codec or Codec()
    states: dict[str, SessionState] = {}
    seen: set[bytes] = set()
    for r in records:
        if r.value is None or r.key in seen:
            continue
        seen.add(r.key or b"")
        e = codec.decode_event(r.value)
        state = states.get(e.session_id) or SessionState.initial(e.session_id)
        states[e.session_id] = evolve(state, e)
    return states


def state_table(records: Iterable[Record]) -> dict[str, SessionState]:
    """The latest state per session in the processor's changelog."""
    out: dict[str, SessionState] = {}
    for r in records:
        if r.key is None:
            continue
        if r.value is None:
            out.pop(r.key.decode(), None)
        else:
            out[r.key.decode()] = decode_state(r.value)
    return out


def active_run_count(states: dict[str, SessionState]) -> int:
    return sum(
        1 for s in states.values() if s.active is not None and s.active.status in ACTIVE_STATUSES
    )
