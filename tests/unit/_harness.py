"""A session driven command by command, checking the log's invariants after each one.

Tests say *what* happens (`h.prompt("p")`, `h.acquire("w1")`, `h.fire("lease_expiry")`) and
read the outcome as short tokens (`rejected:session_busy`, `run.finished:cancelled`).
"""

from __future__ import annotations

from itertools import groupby
from typing import Any

from sessionstream.core.decider import DEFAULT_CONFIG, DeciderConfig, Decision, decide, evolve, fold
from sessionstream.core.state import SessionState, command_hash
from sessionstream.core.timers import due_timers, timer_command
from sessionstream.schemas.commands import Command, CommandClass
from sessionstream.schemas.events import Event
from tests.unit._model import LogModel


class Dedup:
    """The caller's side of duplicate detection, as the processor keeps it: per command id
    digest, the content digest and when it was decided."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, int], tuple[int, int]] = {}

    def decide(
        self,
        state: SessionState | None,
        cmd: Command,
        config: DeciderConfig = DEFAULT_CONFIG,
        *,
        at: int | None = None,
        via: CommandClass | None = None,
    ) -> Decision:
        key = (cmd.session_id, command_hash(cmd.command_id, cmd.tenant_id))
        d = decide(state, cmd, config, at=at, seen=self.records.get(key), via=via)
        if d.remember is not None:
            self.records[key] = (d.remember, d.state.clock)
        if d.events and d.events[-1].type == "session.erased":
            # the processor tombstones an erased session's records (docs/protocol.md)
            self.records = {k: v for k, v in self.records.items() if k[0] != cmd.session_id}
        return d


SID = "s-1"
TENANT = "acme"
T0 = 1_000_000


#: denials the approval rules give, shown with their reason (the gate's own keep the
#: plain token they always had)
_APPROVAL_DENIALS = frozenset({"denied", "approval_expired", "lease_lost", "digest_mismatch"})


def token(e: Event) -> str:
    """A readable summary of one event: its type, plus the detail a transition is about."""
    p: Any = e.payload
    if e.type == "command.rejected":
        return f"rejected:{p.reason}"
    if e.type == "run.finished":
        return f"run.finished:{p.terminal_status}"
    if e.type == "run.started":
        return f"run.started:{p.origin}"
    if e.type == "run.lease_expired":
        return f"run.lease_expired:{p.reason}"
    if e.type == "run.dequeued":
        return f"run.dequeued:{p.reason}"
    if e.type == "action.decision_replayed":
        return f"action.decision_replayed:{p.decision}"
    if e.type == "question.closed":
        return f"question.closed:{p.reason}"
    if e.type == "question.replayed":
        return f"question.replayed:{p.status}"
    if e.type == "action.denied" and p.reason in _APPROVAL_DENIALS:
        return f"action.denied:{p.reason}"
    return e.type


def tokens(events: list[Event]) -> list[str]:
    return [token(e) for e in events]


def check_log(log: list[Event]) -> None:
    """The whole log against the reference model (`_model.LogModel`)."""
    model = LogModel()
    for _, events in groupby(log, key=lambda e: e.command_id):
        model.feed(list(events))


class Harness:
    """One session: commands in, events out, folded state kept and checked."""

    def __init__(
        self, config: DeciderConfig = DEFAULT_CONFIG, session_id: str = SID, tenant: str = TENANT
    ) -> None:
        self.config = config
        self.session_id = session_id
        self.tenant = tenant
        self.now = T0
        self.state = SessionState.initial(session_id)
        self.log: list[Event] = []
        self.commands: list[Command] = []
        self.last_run: str | None = None
        self.dedup = Dedup()
        #: the class of the topic the commands arrive on (None: any, as tools decide)
        self.via: CommandClass | None = None
        self._n = 0

    # -- plumbing -------------------------------------------------------------------------------
    def command(
        self,
        type_: str,
        payload: dict[str, Any] | None = None,
        *,
        run_id: str | None = None,
        worker: str | None = None,
        generation: int | None = None,
        ts: int | None = None,
        tenant: str | None = None,
        command_id: str | None = None,
        actor: str | None = None,
    ) -> Command:
        self._n += 1
        return Command(
            command_id=command_id or f"c{self._n}",
            session_id=self.session_id,
            tenant_id=tenant or self.tenant,
            type=type_,
            ts=self.now if ts is None else ts,
            run_id=run_id,
            worker_id=worker,
            generation=generation,
            actor=actor,
            payload=payload or {},
        )

    def apply(self, cmd: Command, *, at: int | None = None) -> list[Event]:
        """Decide `cmd` as appended to the log at `at` (default: the harness's clock)."""
        at = self.now if at is None else at
        key = (cmd.session_id, command_hash(cmd.command_id, cmd.tenant_id))
        seen = self.dedup.records.get(key)
        d = self.dedup.decide(self.state, cmd, self.config, at=at, via=self.via)
        events, after = d.events, d.state
        assert decide(self.state, cmd, self.config, at=at, seen=seen, via=self.via).events == events
        for e in events:
            self.state = evolve(self.state, e, self.config)
            if e.type == "run.started":
                self.last_run = e.run_id
        assert after == self.state, "apply's state is not the fold of its events"
        self.log.extend(events)
        self.commands.append(cmd)
        check_log(self.log)
        assert fold(self.log, self.session_id, self.config) == self.state
        return events

    def do(
        self, type_: str, payload: dict[str, Any] | None = None, *, at: int | None = None, **kw: Any
    ) -> list[Event]:
        return self.apply(self.command(type_, payload, **kw), at=at)

    @property
    def status(self) -> str | None:
        return self.state.active.status if self.state.active else None

    @property
    def generation(self) -> int:
        assert self.state.active is not None
        return self.state.active.generation

    # -- producers ------------------------------------------------------------------------------
    def prompt(self, text: str = "p", policy: str = "reject", **kw: Any) -> list[Event]:
        return self.do("prompt", {"text": text, "policy": policy}, **kw)

    def send(self, text: str = "s") -> list[Event]:
        return self.do("send", {"text": text})

    def steer(self, text: str = "try another way") -> list[Event]:
        return self.do("steer", {"text": text})

    def follow_up(self, text: str = "f", when_idle: str = "start") -> list[Event]:
        return self.do("follow_up", {"text": text, "when_idle": when_idle})

    def abort(self, reason: str = "user") -> list[Event]:
        return self.do("abort", {"reason": reason})

    def approve(
        self,
        key: str = "k1",
        digest: str | None = "sha256:aa",
        *,
        generation: int | None = None,
        actor: str = "user:bo",
        **kw: Any,
    ) -> list[Event]:
        """A person approves the key on the active (or last) run."""
        payload = {"idempotency_key": key, "args_digest": digest, "generation": generation}
        kw.setdefault("run_id", self.state.active.run_id if self.state.active else self.last_run)
        return self.do("action.approve", payload, actor=actor, **kw)

    def deny(
        self,
        key: str = "k1",
        digest: str | None = "sha256:aa",
        *,
        reason: str | None = "not now",
        actor: str = "user:bo",
        **kw: Any,
    ) -> list[Event]:
        payload = {"idempotency_key": key, "args_digest": digest, "reason": reason}
        kw.setdefault("run_id", self.state.active.run_id if self.state.active else self.last_run)
        return self.do("action.deny", payload, actor=actor, **kw)

    def answer(
        self,
        question_id: str = "q1",
        answer: Any = "yes",
        *,
        generation: int | None = None,
        actor: str = "user:bo",
        **kw: Any,
    ) -> list[Event]:
        """A person answers a question of the active (or last) run."""
        payload = {"question_id": question_id, "answer": answer, "generation": generation}
        kw.setdefault("run_id", self.state.active.run_id if self.state.active else self.last_run)
        return self.do("question.answer", payload, actor=actor, **kw)

    def ask(
        self, question_id: str = "q1", question: str = "Which account?", **kw: Any
    ) -> list[Event]:
        """The holder (w1 unless `worker=`) asks a person."""
        return self.work("question.ask", {"question_id": question_id, "question": question}, **kw)

    def dequeue(self, task: str, *, actor: str | None = "user:bo", **kw: Any) -> list[Event]:
        """A person removes the queued task `task` (the command id that queued it)."""
        return self.do("dequeue", {"command_id": task}, actor=actor, **kw)

    def clear_queue(self, *, actor: str | None = "user:bo", **kw: Any) -> list[Event]:
        return self.do("clear_queue", {}, actor=actor, **kw)

    # -- workers --------------------------------------------------------------------------------
    def acquire(self, worker: str = "w1", lease_ms: int = 30_000) -> list[Event]:
        run = self.state.active
        run_id = run.run_id if run else self.last_run
        return self.do("lease.acquire", {"lease_ms": lease_ms}, run_id=run_id, worker=worker)

    def work(
        self,
        type_: str,
        payload: dict[str, Any] | None = None,
        *,
        worker: str = "w1",
        generation: int | None = None,
        run_id: str | None = None,
    ) -> list[Event]:
        """A worker command on the active run (or the last one), at its current generation."""
        run = self.state.active
        if generation is None:
            generation = run.generation if run else 1
        run_id = run_id or (run.run_id if run else self.last_run)
        return self.do(type_, payload, run_id=run_id, worker=worker, generation=generation)

    # -- schedules ------------------------------------------------------------------------------
    def schedule(self, schedule_id: str = "s1", **kw: Any) -> list[Event]:
        """`schedule.create`: every 60 s by default, prompt "tick"."""
        payload = {"schedule_id": schedule_id, "text": "tick", **kw}
        if "cron" not in kw:
            payload.setdefault("interval_ms", 60_000)
        return self.do("schedule.create", payload)

    def update_schedule(self, schedule_id: str = "s1", **kw: Any) -> list[Event]:
        payload = {"schedule_id": schedule_id, "text": "tick", **kw}
        if "cron" not in kw:
            payload.setdefault("interval_ms", 60_000)
        return self.do("schedule.update", payload)

    def delete_schedule(self, schedule_id: str = "s1") -> list[Event]:
        return self.do("schedule.delete", {"schedule_id": schedule_id})

    # -- timers ---------------------------------------------------------------------------------
    def timer(self, kind: str) -> Command:
        """The `timer.fired` command the processor sends once `kind` is due."""
        due = [t for t in due_timers(self.state, self.config.retention_ms) if t.kind == kind]
        assert due, f"no {kind} timer in {due_timers(self.state, self.config.retention_ms)}"
        self.now = max(self.now, due[0].due_at)
        return timer_command(self.state, due[0], self.now)

    def fire(self, kind: str) -> list[Event]:
        return self.apply(self.timer(kind))


# -- arrangements: a session brought to a named state ---------------------------------------------


def idle(h: Harness) -> None:
    """No run yet."""


def running(h: Harness) -> None:
    """A run nobody executes yet (generation 1, unclaimed)."""
    h.prompt("p0")


def leased(h: Harness) -> None:
    """A running run held by w1 at generation 1."""
    running(h)
    h.acquire("w1")


def compacting(h: Harness) -> None:
    leased(h)
    h.work("compact.start")


def cancelling(h: Harness) -> None:
    leased(h)
    h.abort()


def with_follow_up(h: Harness) -> None:
    """w1 runs the run; one follow-up waits for it."""
    leased(h)
    h.follow_up("f1")
