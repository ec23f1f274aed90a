"""A reference model of the protocol, rebuilt from a session's events alone.

It shares no code with `streams.decider.evolve`: it reads the log the way an auditor would
and fails on anything the protocol forbids: a seq gap, two active runs, an event after a run
ended, a generation that moves without a lease being lost, a lease granted while held or
while cancelling, an approval outside `running` or a second decision for one idempotency
key, completion with follow-ups undelivered, `cancelled` before the ack or the loss of the
lease, a deadline or lease taken early, a cancelling run nobody holds, and queued work
started out of arrival order.
"""

from __future__ import annotations

from schemas.events import SESSION_LOG, Event, RunQueued, RunStarted

SESSION_LOG_TYPES = {"command.rejected", "run.queued", "action.denied"}

#: event -> (statuses it may follow, status after it)
MOVES = {
    "run.compaction_started": (("running",), "compacting"),
    "run.compaction_finished": (("compacting",), "running"),
    "run.cancel_requested": (("running", "compacting"), "cancelling"),
}


class RunModel:
    """What the protocol allows one run to do, rebuilt from its events alone (not `evolve`)."""

    HOLDER_ONLY = {"run.compaction_started", "run.cancel_acknowledged", "action.approved"}

    def __init__(self, started: Event) -> None:
        self.status = "running"
        self.generation = started.generation
        self.timeout_at = started.payload_as(RunStarted).timeout_at
        self.holder: str | None = None
        self.expires_at = 0
        self.decided: set[str] = set()
        self.last = started.type

    def step(self, e: Event, queue: list[tuple[str, str | None]]) -> None:
        t, p = e.type, e.payload.model_dump()
        bump = t in ("run.lease_released", "run.lease_expired")
        assert e.generation == self.generation + bump, f"{t}: generation {e.generation}"
        self.generation = e.generation
        assert t not in self.HOLDER_ONLY or self.holder is not None, f"{t} without a holder"
        if t in ("run.lease_granted", "run.lease_renewed"):
            expected = None if t == "run.lease_granted" else p["worker_id"]
            assert self.holder == expected, f"{t} while {self.holder} holds the lease"
            assert t == "run.lease_renewed" or self.status != "cancelling", "lease while cancelling"
            self.holder, self.expires_at = p["worker_id"], p["lease_expires_at"]
        elif bump:
            assert self.holder is not None
            if p.get("reason") == "lease_expiry":
                assert e.ts >= self.expires_at, "lease taken before it expired"
            self.holder = None
        elif t in MOVES:
            before, after = MOVES[t]
            assert self.status in before, f"{t} while {self.status}"
            self.status = after
        elif t in ("action.approved", "action.denied"):
            retry_refused = t == "action.denied" and self.status == "cancelling"
            # a key is decided once; only a retry of it while cancelling may be refused again
            assert retry_refused or p["idempotency_key"] not in self.decided, (
                "an idempotency key decided twice"
            )
            assert (t == "action.approved") == (self.status == "running")
            self.decided.add(p["idempotency_key"])
        elif t == "action.decision_replayed":
            assert p["idempotency_key"] in self.decided
        elif t == "run.steered":
            assert self.status != "cancelling"
        elif t == "run.cancel_acknowledged":
            assert self.status == "cancelling"
        elif t == "run.follow_up_queued":
            queue.append((p["source_command_id"], e.run_id))
        elif t == "run.follow_up_delivered":
            queue.remove((p["source_command_id"], e.run_id))
        elif t == "run.finished":
            self.finish(e, p["terminal_status"], queue)
        self.last = t

    def finish(self, e: Event, status: str, queue: list[tuple[str, str | None]]) -> None:
        if status == "completed":
            assert self.status == "running"
            assert all(r != e.run_id for _, r in queue), "completed with follow-ups undelivered"
        elif status == "cancelled":
            assert self.status == "cancelling"
            assert self.holder is None or self.last == "run.cancel_acknowledged"
        elif status == "failed":
            assert self.status != "cancelling"
        else:
            assert e.ts >= self.timeout_at, "timed out before its deadline"
        # what the run never got waits for the next runs, in arrival order
        queue[:] = [(src, None if r == e.run_id else r) for src, r in queue]


class LogModel:
    """Feed it events in log order; it asserts the protocol and tracks the active run."""

    def __init__(self) -> None:
        self.active: str | None = None
        self.last_run: str | None = None
        self.finished: set[str] = set()
        self.last_seq: dict[str, int] = {}
        self.runs: dict[str, RunModel] = {}
        self.queue: list[tuple[str, str | None]] = []  # (source command, run it waits for)

    def feed(self, events: list[Event]) -> None:
        for e in events:
            assert e.seq == self.last_seq.get(e.run_id, 0) + 1, f"seq gap in {e.run_id}"
            self.last_seq[e.run_id] = e.seq
            assert e.run_id not in self.finished, f"{e.type} after {e.run_id} ended"
            if e.run_id == SESSION_LOG:
                self.session_event(e)
                continue
            if e.type == "run.started":
                self.start(e)
            else:
                self.runs[e.run_id].step(e, self.queue)
            assert e.run_id == self.active, f"{e.type} for {e.run_id}, active is {self.active}"
            if e.type == "run.finished":
                self.finished.add(e.run_id)
                self.active = None
        # checked between commands: within one, cancel_requested precedes the finish
        run = self.runs.get(self.active or "")
        assert run is None or run.status != "cancelling" or run.holder is not None, (
            "a cancelling run nobody executes would never end"
        )

    def session_event(self, e: Event) -> None:
        assert e.type in SESSION_LOG_TYPES, e.type
        if e.type == "run.queued":
            q = e.payload_as(RunQueued)
            self.queue.insert(0 if q.front else len(self.queue), (q.source_command_id, None))

    def start(self, e: Event) -> None:
        assert self.active is None, f"run {e.run_id} started while {self.active} is active"
        self.active = self.last_run = e.run_id
        self.runs[e.run_id] = RunModel(e)
        started = e.payload_as(RunStarted)
        waiting = [src for src, r in self.queue if r is None]
        if started.origin == "queued":
            assert waiting[:1] == [started.source_command_id], "queued work started out of order"
            self.queue.remove((started.source_command_id, None))
        else:
            assert not waiting, "a new run jumped the queue"
