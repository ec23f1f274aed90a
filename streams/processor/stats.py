"""What the processor counts: its stats object and the Prometheus metrics, from the
outcomes of each committed transaction (never from an aborted one)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from schemas.events import CancelRequested, CommandRejected, RunFinished
from sessionstream import metrics
from streams.step import StepOutcome

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
        st = self.stats
        st.transactions += 1
        st.timers_fired += timers
        metrics.TRANSACTIONS.labels("committed").inc()
        now = self.clock()
        events = 0
        for o in outcomes:
            st.commands += 1
            events += len(o.events)
            if o.dead_letter is not None:
                st.dead_letters += 1
                r = o.dead_letter.reason
                st.dead_letters_by_reason[r] = st.dead_letters_by_reason.get(r, 0) + 1
                metrics.COMMANDS.labels("dead_letter").inc()
                metrics.DEAD_LETTERS.labels(r).inc()
                continue
            if o.forward_to is not None:
                metrics.COMMANDS.labels("forwarded").inc()
                continue
            if o.duplicate:
                st.duplicates += 1
                metrics.COMMANDS.labels("duplicate").inc()
                continue
            if o.command is not None:
                metrics.COMMAND_AGE.observe(max(0.0, now - o.command.ts / 1000))
            rejected = False
            for e in o.events:
                if e.type == "command.rejected":
                    rejected = True
                    st.rejections += 1
                    reason = e.payload_as(CommandRejected).reason
                    st.rejections_by_reason[reason] = st.rejections_by_reason.get(reason, 0) + 1
                    metrics.REJECTIONS.labels(reason).inc()
                elif e.type == "run.lease_expired":
                    metrics.LEASE_EXPIRIES.inc()
                elif e.type == "run.cancel_requested":
                    e.payload_as(CancelRequested)
                    self._cancel_requested[e.run_id] = e.ts
                    if len(self._cancel_requested) > _CANCELS_CAP:
                        self._cancel_requested.pop(next(iter(self._cancel_requested)))
                elif e.type == "run.finished":
                    asked = self._cancel_requested.pop(e.run_id, None)
                    if (
                        asked is not None
                        and e.payload_as(RunFinished).terminal_status == "cancelled"
                    ):
                        metrics.CANCEL_LATENCY.observe(max(0, e.ts - asked) / 1000)
            metrics.COMMANDS.labels("rejected" if rejected else "accepted").inc()
        st.events += events
        metrics.EVENTS.inc(events)
