"""What the processor counts: its stats object and the Prometheus metrics, from the
outcomes of each committed transaction (never from an aborted one)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sessionstream.adapters import metrics
from sessionstream.core.step import StepOutcome
from sessionstream.schemas.events import CommandRejected, RunFinished

__all__ = ["ProcessorStats", "StatsObserver"]

#: cancel requests remembered for the cancel-latency histogram (runs that never finish
#: here, e.g. moved to another processor, are forgotten oldest first)
_CANCELS_CAP = 10_000


@dataclass
class ProcessorStats:
    commands: int = 0
    events: int = 0
    dead_letters: int = 0
    duplicates: int = 0
    rejections: int = 0
    timers_fired: int = 0
    forwarded: int = 0
    transactions: int = 0
    aborts: int = 0
    #: transactions reported failed that the group's offsets showed committed (counted in
    #: `transactions` too)
    committed_after_all: int = 0
    rejections_by_reason: dict[str, int] = field(default_factory=dict)
    dead_letters_by_reason: dict[str, int] = field(default_factory=dict)
    #: seconds spent in each phase of the committed transactions, summed
    phase_seconds: dict[str, float] = field(default_factory=dict)


class StatsObserver:
    """Folds committed outcomes into `stats` and the metrics."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.stats = ProcessorStats()
        self.clock = clock
        self._cancel_requested: dict[str, int] = {}  # run id -> decided at (ms)

    def aborted(self) -> None:
        self.stats.aborts += 1
        metrics.TRANSACTIONS.labels("aborted").inc()

    def forwarded(self) -> int:
        self.stats.forwarded += 1
        metrics.FORWARDED.inc()
        return self.stats.forwarded

    def phases(self, **seconds: float) -> None:
        """Where a committed transaction's time went: begin, decide (commands decided and
        their events produced), changelogs, send_offsets, commit, store (after the commit)."""
        sums = self.stats.phase_seconds
        for phase, s in seconds.items():
            sums[phase] = sums.get(phase, 0.0) + s
            metrics.TRANSACTION_PHASE_SECONDS.labels(phase).observe(s)

    def committed(self, outcomes: list[StepOutcome], timers: int) -> None:
        """Count a committed transaction's outcomes; the metrics move once per label per
        transaction (a labelled counter costs a lock and a lookup per update)."""
        st = self.stats
        st.transactions += 1
        st.timers_fired += timers
        metrics.TRANSACTIONS.labels("committed").inc()
        now = self.clock()
        events = 0
        outcome_counts: dict[str, int] = {}
        dead: dict[str, int] = {}
        rejections: dict[str, int] = {}
        expiries = 0
        for o in outcomes:
            events += len(o.events)
            if o.dead_letter is not None:
                r = o.dead_letter.reason
                dead[r] = dead.get(r, 0) + 1
                outcome = "dead_letter"
            elif o.forward_to is not None:
                outcome = "forwarded"
            elif o.duplicate:
                outcome = "duplicate"
            else:
                if o.command is not None:
                    metrics.COMMAND_AGE.observe(max(0.0, now - o.command.ts / 1000))
                outcome = "accepted"
                for e in o.events:
                    t = e.type
                    if t == "command.rejected":
                        outcome = "rejected"
                        reason = e.payload_as(CommandRejected).reason
                        rejections[reason] = rejections.get(reason, 0) + 1
                    elif t == "run.lease_expired":
                        expiries += 1
                    elif t == "run.cancel_requested":
                        self._cancel_requested[e.run_id] = e.ts
                        if len(self._cancel_requested) > _CANCELS_CAP:
                            self._cancel_requested.pop(next(iter(self._cancel_requested)))
                    elif t == "run.finished":
                        asked = self._cancel_requested.pop(e.run_id, None)
                        if (
                            asked is not None
                            and e.payload_as(RunFinished).terminal_status == "cancelled"
                        ):
                            metrics.CANCEL_LATENCY.observe(max(0, e.ts - asked) / 1000)
            outcome_counts[outcome] = outcome_counts.get(outcome, 0) + 1
        st.commands += len(outcomes)
        st.events += events
        st.duplicates += outcome_counts.get("duplicate", 0)
        st.dead_letters += outcome_counts.get("dead_letter", 0)
        st.rejections += sum(rejections.values())
        for r, n in dead.items():
            st.dead_letters_by_reason[r] = st.dead_letters_by_reason.get(r, 0) + n
            metrics.DEAD_LETTERS.labels(r).inc(n)
        for r, n in rejections.items():
            st.rejections_by_reason[r] = st.rejections_by_reason.get(r, 0) + n
            metrics.REJECTIONS.labels(r).inc(n)
        for outcome, n in outcome_counts.items():
            metrics.COMMANDS.labels(outcome).inc(n)
        if expiries:
            metrics.LEASE_EXPIRIES.inc(expiries)
        metrics.EVENTS.inc(events)
