"""Random interleavings of producers, workers and the timer clock against one session.

Workers remember the generation they were granted, so once a lease moves on they write
stale. After every command: exactly one outcome; the processor's state (`apply`) is the fold
of the events; stale writes change nothing; the state survives the state table (JSON) and
decides the same bytes from there; and the log passes the reference model (`_model`): seq
contiguous per run and in the session log, never two active runs, nothing after a terminal
event, and the rest of the protocol. At the end of each example: fold(whole log) == state,
and a replay from scratch gives byte-identical events.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from schemas.codec import Codec
from schemas.commands import WORKER_COMMAND_TYPES, Command
from schemas.events import ACTIVE_STATUSES, SESSION_LOG, CommandRejected, Event
from streams.decider import REJECTION_REASONS, DeciderConfig, apply, decide, evolve, fold
from streams.state import SessionState
from streams.timers import DueTimer, due_timers, timer_command
from tests.unit._model import LogModel

SID = "s-prop"
TENANT = "acme"
CONFIG = DeciderConfig(
    max_queue=4, cancel_grace_ms=5_000, default_run_timeout_ms=120_000, max_payload_bytes=256
)
CODEC = Codec()
#: "holder" is whoever holds the lease now: most writes come from it, the rest race it
WORKERS = st.sampled_from(["holder", "holder", "w1", "w2", "w3"])
KEYS = st.sampled_from(["k1", "k2", "k3"])
TEXT = st.sampled_from(["a", "b", "look at the last 7 days", "é✓", "x" * 300])


def replay(commands: list[Command]) -> list[bytes]:
    state = SessionState.initial(SID)
    out = []
    for c in commands:
        for e in decide(state, c, CONFIG):
            state = evolve(state, e, CONFIG)
            out.append(CODEC.encode_event(e))
    return out


def core(state: SessionState) -> SessionState:
    """The state without what every recorded outcome advances (seqs, the dedup window)."""
    active = state.active.model_copy(update={"seq": 0}) if state.active else None
    return state.model_copy(update={"log_seq": 0, "recent_commands": (), "active": active})


class SessionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = SessionState.initial(SID)
        self.now = 1_000
        self.n = 0
        self.commands: list[Command] = []
        self.log: list[Event] = []
        self.encoded: list[bytes] = []
        self.ids: set[str] = set()
        self.memory: dict[str, tuple[str, int]] = {}  # worker -> (run id, generation granted)
        self.seen_timers: list[DueTimer] = []
        self.model = LogModel()  # the protocol, rebuilt from the events alone

    # -- plumbing -----------------------------------------------------------------------------
    def cmd(self, type_: str, payload: dict[str, Any], **kw: Any) -> Command:
        self.n += 1
        kw.setdefault("tenant_id", TENANT)
        return Command(
            command_id=f"c{self.n}", session_id=SID, type=type_, ts=self.now, payload=payload, **kw
        )

    def apply(self, cmd: Command) -> list[Event]:
        pre = self.state
        events, after = apply(pre, cmd, CONFIG)  # what the processor keeps in its table
        encoded = [CODEC.encode_event(e) for e in events]
        restored = SessionState.model_validate_json(pre.model_dump_json())
        assert restored == pre
        assert [CODEC.encode_event(e) for e in decide(restored, cmd, CONFIG)] == encoded
        for e in events:
            self.state = evolve(self.state, e, CONFIG)
        assert after == self.state, "the processor's state is not the fold of its events"
        self.check_outcome(cmd, pre, events)
        self.model.feed(events)
        self.ids.add(cmd.command_id)
        self.commands.append(cmd)
        self.log.extend(events)
        self.encoded.extend(encoded)
        for e in events:
            if e.type in ("run.lease_granted", "run.lease_renewed"):
                self.memory[cmd.worker_id or ""] = (e.run_id, e.generation)
        return events

    def check_outcome(self, cmd: Command, pre: SessionState, events: list[Event]) -> None:
        if cmd.command_id in self.ids:
            assert events == [], "a duplicate commandId decides nothing"
            return
        assert events, "every new command has a visible outcome"
        assert all(e.command_id == cmd.command_id for e in events)
        rejected = [e for e in events if e.type == "command.rejected"]
        stale_active, stale_done = self.stale(cmd, pre)
        if stale_active:
            assert [e.type for e in events] == ["command.rejected", "run.stale_write_recorded"]
        if stale_done:
            assert [e.type for e in events] == ["command.rejected"]
        if rejected:
            assert rejected == events[:1] and rejected[0].run_id == SESSION_LOG
            reason = rejected[0].payload_as(CommandRejected).reason
            assert reason in REJECTION_REASONS
            assert (reason == "stale_generation") == (stale_active or stale_done)
            if len(events) > 1:
                assert [e.type for e in events[1:]] == ["run.stale_write_recorded"]
            assert core(self.state) == core(pre), f"{reason} changed the state"
        if pre.tenant_id is not None and cmd.tenant_id != pre.tenant_id:
            assert [e.type for e in events] == ["command.rejected"]
            assert rejected[0].payload_as(CommandRejected).reason == "tenant_mismatch"

    @staticmethod
    def stale(cmd: Command, pre: SessionState) -> tuple[bool, bool]:
        """(stale write on the active run, stale write on a finished run)."""
        if cmd.type not in WORKER_COMMAND_TYPES or cmd.type == "lease.acquire":
            return False, False
        if pre.tenant_id is not None and cmd.tenant_id != pre.tenant_id:
            return False, False
        run, done = pre.active, pre.finished_run(cmd.run_id or "")
        if run is not None and run.run_id == cmd.run_id:
            return cmd.generation != run.generation, False
        return False, done is not None and cmd.generation != done.generation

    def who(self, worker: str) -> str:
        run = self.state.active
        if worker == "holder":
            return (run.lease_owner if run else None) or "w1"
        return worker

    def work(self, worker: str, type_: str, payload: dict[str, Any] | None = None) -> None:
        worker = self.who(worker)
        run = self.state.active
        fallback = (run.run_id, run.generation) if run else (self.model.last_run or "r-unknown", 1)
        run_id, generation = self.memory.get(worker, fallback)
        self.apply(
            self.cmd(type_, payload or {}, run_id=run_id, worker_id=worker, generation=generation)
        )

    # -- producers ----------------------------------------------------------------------------
    @rule(text=TEXT, policy=st.sampled_from(["reject", "enqueue", "interrupt"]))
    def prompt(self, text: str, policy: str) -> None:
        self.apply(self.cmd("prompt", {"text": text, "policy": policy}))

    @rule(text=TEXT)
    def send(self, text: str) -> None:
        self.apply(self.cmd("send", {"text": text}))

    @rule(text=TEXT)
    def steer(self, text: str) -> None:
        self.apply(self.cmd("steer", {"text": text}))

    @rule(text=TEXT, when_idle=st.sampled_from(["start", "reject"]))
    def follow_up(self, text: str, when_idle: str) -> None:
        self.apply(self.cmd("follow_up", {"text": text, "when_idle": when_idle}))

    @rule()
    def abort(self) -> None:
        self.apply(self.cmd("abort", {"reason": "user"}))

    @rule(text=TEXT)
    def intruder(self, text: str) -> None:
        self.apply(self.cmd("prompt", {"text": text}, tenant_id="intruder"))

    @precondition(lambda self: self.commands)
    @rule(i=st.integers(min_value=0))
    def duplicate(self, i: int) -> None:
        self.apply(self.commands[i % len(self.commands)])

    # -- workers ------------------------------------------------------------------------------
    @rule(worker=WORKERS, lease_ms=st.sampled_from([5_000, 30_000]))
    def acquire(self, worker: str, lease_ms: int) -> None:
        worker = self.who(worker)
        run = self.state.active
        run_id = (
            run.run_id
            if run
            else self.memory.get(worker, (self.model.last_run or "r-unknown", 0))[0]
        )
        self.apply(
            self.cmd("lease.acquire", {"lease_ms": lease_ms}, run_id=run_id, worker_id=worker)
        )

    @precondition(lambda self: self.state.active and self.state.active.lease_owner is None)
    @rule(worker=st.sampled_from(["w1", "w2", "w3"]))
    def take_free_run(self, worker: str) -> None:
        """A worker pool picks up a run nobody executes (or whose holder was fenced)."""
        self.acquire(worker, 30_000)

    @rule(worker=WORKERS)
    def renew(self, worker: str) -> None:
        self.work(worker, "lease.renew", {"lease_ms": 30_000})

    @rule(worker=WORKERS)
    def release(self, worker: str) -> None:
        self.work(worker, "lease.release")

    @rule(worker=WORKERS, kind=st.sampled_from(["model.request.started", "tool.started"]))
    def progress(self, worker: str, kind: str) -> None:
        self.work(worker, "run.progress", {"kind": kind, "name": "x"})

    @rule(worker=WORKERS)
    def compact_start(self, worker: str) -> None:
        self.work(worker, "compact.start")

    @rule(worker=WORKERS)
    def compact_finish(self, worker: str) -> None:
        self.work(worker, "compact.finish", {"checkpoint_uri": f"s3://ck/{self.n}"})

    @rule(worker=WORKERS, key=KEYS)
    def action_request(self, worker: str, key: str) -> None:
        self.work(worker, "action.request", {"idempotency_key": key, "kind": "email"})

    @rule(worker=WORKERS, key=KEYS, ok=st.booleans())
    def action_result(self, worker: str, key: str, ok: bool) -> None:
        self.work(worker, "action.result", {"idempotency_key": key, "ok": ok})

    @rule(worker=WORKERS)
    def cancel_ack(self, worker: str) -> None:
        self.work(worker, "cancel.ack", {"model_request_aborted": True})

    @rule(worker=WORKERS, consume=st.booleans())
    def complete(self, worker: str, consume: bool) -> None:
        consumed = [q.source_command_id for q in self.state.queue] if consume else []
        self.work(worker, "run.complete", {"consumed_follow_ups": consumed})

    @rule(worker=WORKERS)
    def fail(self, worker: str) -> None:
        self.work(worker, "run.fail", {"error": "boom"})

    # -- the clock ----------------------------------------------------------------------------
    @rule(ms=st.sampled_from([500, 4_000, 6_000, 31_000, 125_000]))
    def advance(self, ms: int) -> None:
        self.seen_timers.extend(due_timers(self.state))
        self.now += ms
        for _ in range(4):  # each due timer removes itself: a few at most, never a loop
            due = [t for t in due_timers(self.state) if t.due_at <= self.now]
            if not due:
                return
            events = self.apply(timer_command(self.state, due[0], self.now))
            assert events and events[0].type != "command.rejected", "a due timer always decides"
        assert not [t for t in due_timers(self.state) if t.due_at <= self.now]

    @precondition(lambda self: self.seen_timers)
    @rule(i=st.integers(min_value=0))
    def late_timer(self, i: int) -> None:
        """A timer computed from an older state, fired late (e.g. by a restarted processor)."""
        t = self.seen_timers[i % len(self.seen_timers)]
        events = self.apply(timer_command(self.state, t, max(self.now, t.due_at)))
        for e in events:
            if e.type == "command.rejected":
                assert e.payload_as(CommandRejected).reason == "timer_stale"

    # -- invariants ---------------------------------------------------------------------------
    @invariant()
    def one_active_run_and_no_idle_backlog(self) -> None:
        run = self.state.active
        assert (run.run_id if run else None) == self.model.active
        if run is None:
            assert self.state.queue == (), "the session sits idle with work waiting"
        else:
            assert run.status in ACTIVE_STATUSES
            assert all(q.run_id in (None, run.run_id) for q in self.state.queue)
        assert len(self.state.queue) <= CONFIG.max_queue

    def teardown(self) -> None:
        assert fold(self.log, SID, CONFIG) == self.state
        assert replay(self.commands) == self.encoded
        assert [CODEC.decode_event(b) for b in self.encoded] == self.log


SessionMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSessionMachine = SessionMachine.TestCase
