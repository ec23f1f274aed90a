"""Random interleavings of producers, workers, intruders and the log's clock on one session.

Producers' clocks are skewed at random (minutes behind, an hour ahead, seconds instead of
milliseconds): the decider's clock is the log's, so nothing may depend on them. Workers
remember the generation they were granted, so once a lease moves on they write stale.
Producers name runs (the active one, an old one, none). Intruders from another tenant reuse
command ids the owner will use. Ids are re-sent exactly, and reused for other content.

After every command: exactly one outcome; the processor's state is the fold of the events;
a command naming run R touched no other run; stale writes, rejections and duplicates change
nothing; no state exceeds its bounds; the state survives the state table and decides the
same bytes from there; and the log passes the reference model (`_model`, written from the
protocol, not from the decider). At the end: every steer and follow-up of a finished run
had exactly one fate, fold(whole log) == state, and a replay from scratch gives
byte-identical events.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sessionstream.core.decider import REJECTION_REASONS, DeciderConfig, decide, evolve, fold
from sessionstream.core.state import (
    SessionState,
    command_hash,
    evolved,
    state_to_json,
    validate_state,
)
from sessionstream.core.step import decode_state, encode_state
from sessionstream.core.timers import DueTimer, due_timers, timer_command
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.commands import (
    PRODUCER_COMMAND_TYPES,
    WORKER_COMMAND_TYPES,
    Command,
    CommandClass,
)
from sessionstream.schemas.events import ACTIVE_STATUSES, SESSION_LOG, CommandRejected, Event
from tests.unit._harness import Dedup
from tests.unit._model import Bounds, LogModel
from tests.unit.core.test_command_classes import SPEC as CLASSES

SID = "s-prop"
TENANT = "acme"
CONFIG = DeciderConfig(
    max_queue=4,
    max_inputs=3,
    max_held_bytes=1_000,
    max_actions=2,
    max_lease_ms=20_000,
    finished_window=3,
    cancel_grace_ms=5_000,
    default_run_timeout_ms=120_000,
    max_payload_bytes=400,
    max_step_result_bytes=100,
    max_steps=3,
    max_run_step_bytes=250,
    max_open_calls=2,
    approval_policy=(("*", "payment"), ("intruder", "email")),
    approval_ttl_ms=10_000,
    question_ttl_ms=8_000,
    max_questions=2,
    max_answer_bytes=64,
    retention_ms=150_000,
    max_schedules=2,
)
BOUNDS = Bounds(
    max_queue=CONFIG.max_queue,
    max_inputs=CONFIG.max_inputs,
    max_held_bytes=CONFIG.max_held_bytes,
    max_lease_ms=CONFIG.max_lease_ms,
    max_step_result_bytes=CONFIG.max_step_result_bytes,
    max_steps=CONFIG.max_steps,
    max_run_step_bytes=CONFIG.max_run_step_bytes,
    max_open_calls=CONFIG.max_open_calls,
    approval_ttl_ms=CONFIG.approval_ttl_ms,
    question_ttl_ms=CONFIG.question_ttl_ms,
    max_questions=CONFIG.max_questions,
    max_answer_bytes=CONFIG.max_answer_bytes,
    retention_ms=CONFIG.retention_ms,
    max_schedules=CONFIG.max_schedules,
)
#: the largest state record these bounds allow (JSON; generous for the ids and metadata)
MAX_STATE_BYTES = 2 * CONFIG.max_held_bytes + 12_000
CODEC = Codec()
#: "holder" is whoever holds the lease now: most writes come from it, the rest race it
WORKERS = st.sampled_from(["holder", "holder", "w1", "w2", "w3"])
KEYS = st.sampled_from(["k1", "k2", "k3"])
TEXT = st.sampled_from(["a", "b", "look at the last 7 days", "é✓", "x" * 300])
#: a prompt's typed input: none, small JSON values of every kind, one near the payload bound
INPUT = st.sampled_from(
    [None, None, {"sku": "A-1", "qty": 2}, [1, 2.5, "é"], "x", 0, False, {"n": "y" * 250}]
)
#: producer clock offsets: in sync, 20 min behind, an hour ahead, and a clock in seconds
SKEW = st.sampled_from([0, 0, -20 * 60_000, 3_600_000, "seconds"])
#: steps a worker records in a row: (step id, kind, result JSON or "ref" for a pointer)
STEPS = st.lists(
    st.tuples(
        st.sampled_from(["model-1", "model-2", "tool:search-1", "plan", "é"]),
        st.sampled_from(["model", "tool"]),
        st.sampled_from(['"yes"', "null", '{"rows": [1, 2]}', '"' + "r" * 120 + '"', None, "ref"]),
    ),
    min_size=1,
    max_size=4,
)
#: an action's kind (payments wait for a person), and the digest of its arguments
ACTION_KINDS = st.sampled_from(["email", "email", "payment"])
DIGESTS = st.sampled_from(["sha256:aa", "sha256:aa", "sha256:bb", None])
#: kinds a prompt adds to its run's approval policy
PROMPT_KINDS = st.sampled_from([[], [], ["email"], ["*"]])
#: a prompt's labels
LABELS = st.sampled_from([{}, {}, {"team": "growth"}, {"team": "ops", "ticket/id": "T-1"}])
#: which task a `dequeue` names: one waiting now, the last one removed, the active run's
#: source, a pending input's, one never seen
DEQUEUE_TARGET = st.sampled_from(["waiting", "waiting", "removed", "started", "pending", "never"])
#: which generation a person's decision names: none, the current one, an older one
DECISION_GEN = st.sampled_from(["none", "none", "current", "older"])
#: questions a holder asks a person, and the answers people give (one over the bound)
QIDS = st.sampled_from(["q1", "q2", "q3"])
ANSWERS = st.sampled_from(["yes", None, {"account": "acme-main"}, [1, 2.5], "é" * 40])
#: which run a producer command names
TARGET = st.sampled_from(["none", "none", "active", "old"])
#: schedules: an id (three, beyond the bound of two), when (an interval, a cron in UTC or in
#: a zone, or a refused one), overlap, catch-up and its bound, jitter
SCHEDULE_IDS = st.sampled_from(["s1", "s2", "s3"])
SCHEDULE_WHEN = st.sampled_from(
    [
        {"interval_ms": 60_000},
        {"interval_ms": 150_000},
        {"cron": "*/2 * * * *"},
        {"cron": "* * * * mon-fri", "timezone": "America/New_York"},
        {"interval_ms": 0},
        {"cron": "0 0 30 2 *"},
    ]
)
OVERLAPS = st.sampled_from(["skip", "reject", "enqueue", "interrupt"])
CATCH_UPS = st.sampled_from(["once", "all", "skip"])


def replay(commands: list[tuple[Command, int, CommandClass | None]]) -> list[bytes]:
    state = SessionState.initial(SID)
    dedup = Dedup()
    out = []
    for c, at, via in commands:
        for e in dedup.decide(state, c, CONFIG, at=at, via=via).events:
            state = evolve(state, e, CONFIG)
            out.append(CODEC.encode_event(e))
    return out


def core(state: SessionState) -> SessionState:
    """The state without what every recorded outcome advances (seqs, the clock)."""
    active = evolved(state.active, seq=0) if state.active else None
    return evolved(state, log_seq=0, clock=0, active=active)


class SessionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = SessionState.initial(SID)
        self.dedup = Dedup()
        self.now = 1_000_000
        self.n = 0
        #: (command, the log's time, the class of the topic it came on)
        self.commands: list[tuple[Command, int, CommandClass | None]] = []
        self.log: list[Event] = []
        self.encoded: list[bytes] = []
        #: command id -> the command the session remembers under it
        self.decided: dict[str, Command] = {}
        self.memory: dict[str, tuple[str, int]] = {}  # worker -> (run id, generation granted)
        self.seen_timers: list[DueTimer] = []
        self.finished_runs: list[str] = []
        self.owner_ids: list[str] = []  # ids an intruder used first, for the owner to use
        self.model = LogModel(BOUNDS)  # the protocol, rebuilt from the events alone

    # -- plumbing -----------------------------------------------------------------------------
    def cmd(self, type_: str, payload: dict[str, Any], skew: int | str = 0, **kw: Any) -> Command:
        self.n += 1
        kw.setdefault("tenant_id", TENANT)
        kw.setdefault("command_id", f"c{self.n}")
        ts = self.now // 1000 if skew == "seconds" else max(0, self.now + int(skew))
        return Command(session_id=SID, type=type_, ts=ts, payload=payload, **kw)

    def target(self, which: str) -> str | None:
        if which == "active":
            return self.state.active.run_id if self.state.active else None
        if which == "old":
            return self.finished_runs[-1] if self.finished_runs else "r-never"
        return None

    def apply(self, cmd: Command, via: CommandClass | None = None) -> list[Event]:
        pre = self.state
        seen = self.dedup.records.get((SID, _h(cmd)))
        d = self.dedup.decide(pre, cmd, CONFIG, at=self.now, via=via)
        events = d.events
        for e in events:  # the decider builds events unvalidated: each must validate
            assert Event.model_validate(e.model_dump(by_alias=True)) == e
        assert validate_state(d.state) == d.state
        encoded = [CODEC.encode_event(e) for e in events]
        # the state record (binary) and the JSON of earlier versions read back the same
        restored = decode_state(encode_state(pre))
        assert restored == pre
        assert decode_state(state_to_json(pre)) == pre
        again = decide(restored, cmd, CONFIG, at=self.now, seen=seen, via=via).events
        assert [CODEC.encode_event(e) for e in again] == encoded
        for e in events:
            self.state = evolve(self.state, e, CONFIG)
        assert d.state == self.state, "the processor's state is not the fold of its events"
        self.check_outcome(cmd, pre, events, via)
        self.model.feed(events, cmd)
        if d.remember is not None:
            assert cmd.command_id not in self.decided or self.decided[cmd.command_id] is None
            self.decided[cmd.command_id] = cmd
        if events and events[-1].type == "session.erased":
            # erased: the processor forgets every id the session remembered
            assert events == [events[-1]] and d.remember is None
            self.decided.clear()
            assert self.state.active is None and self.state.finished == ()
        self.commands.append((cmd, self.now, via))
        self.log.extend(events)
        self.encoded.extend(encoded)
        for e in events:
            if e.type in ("run.lease_granted", "run.lease_renewed"):
                self.memory[cmd.worker_id or ""] = (e.run_id, e.generation)
            if e.type == "run.finished":
                self.finished_runs.append(e.run_id)
        return events

    def check_outcome(
        self, cmd: Command, pre: SessionState, events: list[Event], via: str | None = None
    ) -> None:
        if via is not None and cmd.type not in CLASSES[via]:
            # the topic says who wrote it, before the id or the tenant are looked at
            assert _reasons(events) == ["not_allowed_here"], "a command off its topic acted"
            assert len(events) == 1 and core(self.state) == core(pre)
            return
        first = self.decided.get(cmd.command_id)
        foreign = pre.tenant_id is not None and cmd.tenant_id != pre.tenant_id
        if first is not None and not foreign:
            if _same(first, cmd):
                assert events == [], "an exact re-send decides nothing"
            else:
                assert _reasons(events) == ["command_id_reused"], "an id reused for other content"
                assert core(self.state) == core(pre)
            return
        assert events, "every new command has a visible outcome"
        assert all(e.command_id == cmd.command_id for e in events)
        assert all(e.ts == max(pre.clock, self.now) for e in events), "now is the log's clock"
        assert all(e.producer_ts == cmd.ts for e in events)
        rejected = [e for e in events if e.type == "command.rejected"]
        stale_active, stale_done = self.stale(cmd, pre)
        if stale_active:
            assert [e.type for e in events] == ["command.rejected", "run.stale_write_recorded"]
        if stale_done:
            assert [e.type for e in events] == ["command.rejected"]
        if events[0].type == "schedule.fired":
            # a schedule's firing, then its prompt's own outcome (a refusal among them)
            assert all(e.type != "schedule.fired" for e in events[1:])
            assert all(
                r.payload_as(CommandRejected).reason
                in ("session_busy", "session_compacting", "queue_full")
                for r in rejected
            )
            rejected = []
        if rejected:
            assert rejected == events[:1] and rejected[0].run_id == SESSION_LOG
            reason = rejected[0].payload_as(CommandRejected).reason
            assert reason in REJECTION_REASONS
            assert (reason == "stale_generation") == (stale_active or stale_done)
            if len(events) > 1:
                assert [e.type for e in events[1:]] == ["run.stale_write_recorded"]
            assert core(self.state) == core(pre), f"{reason} changed the state"
        if foreign:
            assert _reasons(events) == ["tenant_mismatch"]
        if cmd.type in PRODUCER_COMMAND_TYPES and cmd.run_id is not None and not foreign:
            active = pre.active.run_id if pre.active else None
            if cmd.run_id != active:
                # refused: for that reason, unless a check that comes first (size) refused it
                assert _reasons(events) in (["run_not_active"], ["payload_too_large"]), (
                    "a command for another run acted"
                )
            # a command naming run R changes no other run (a follow-on run it starts aside)
            touched = {e.run_id for e in events if e.run_id != SESSION_LOG}
            started = {e.run_id for e in events if e.type == "run.started"}
            assert touched - started <= {cmd.run_id}, f"{cmd.type} for {cmd.run_id} hit {touched}"

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
        self.work_events(worker, type_, payload)

    def work_events(
        self, worker: str, type_: str, payload: dict[str, Any] | None = None
    ) -> list[Event]:
        worker = self.who(worker)
        run = self.state.active
        if run is not None and run.lease_owner == worker:
            run_id, generation = run.run_id, run.generation  # the holder knows its run
        else:
            fallback = (
                (run.run_id, run.generation) if run else (self.model.last_run or "r-unknown", 1)
            )
            run_id, generation = self.memory.get(worker, fallback)
            if self.state.finished_run(run_id) is None and (run is None or run_id != run.run_id):
                run_id, generation = fallback  # a worker long gone writes no more
        return self.apply(
            self.cmd(type_, payload or {}, run_id=run_id, worker_id=worker, generation=generation)
        )

    def producer(self, type_: str, payload: dict[str, Any], skew: Any, which: str) -> None:
        cid = self.owner_ids.pop() if self.owner_ids else None
        kw: dict[str, Any] = {"run_id": self.target(which), "actor": "user:ana"}
        if cid is not None:
            kw["command_id"] = cid
        self.apply(self.cmd(type_, payload, skew, **kw))

    # -- producers ----------------------------------------------------------------------------
    @rule(
        text=TEXT,
        policy=st.sampled_from(["reject", "enqueue", "interrupt"]),
        skew=SKEW,
        which=TARGET,
        retry=st.booleans(),
        typed=INPUT,
        kinds=PROMPT_KINDS,
        labels=LABELS,
    )
    def prompt(
        self,
        text: str,
        policy: str,
        skew: Any,
        which: str,
        retry: bool,
        typed: Any,
        kinds: list[str],
        labels: dict[str, str],
    ) -> None:
        payload: dict[str, Any] = {"text": text, "policy": policy}
        if typed is not None:
            payload["input"] = typed
        if kinds:
            payload["approval_kinds"] = kinds
        if labels:
            payload["metadata"] = labels
        if retry:
            payload["retry_of"] = self.finished_runs[-1] if self.finished_runs else "r-never"
        self.producer("prompt", payload, skew, which)

    @rule(text=TEXT, skew=SKEW, which=TARGET)
    def send(self, text: str, skew: Any, which: str) -> None:
        self.producer("send", {"text": text}, skew, which)

    @rule(text=TEXT, skew=SKEW, which=TARGET)
    def steer(self, text: str, skew: Any, which: str) -> None:
        self.producer("steer", {"text": text}, skew, which)

    @rule(
        text=TEXT,
        when_idle=st.sampled_from(["start", "reject"]),
        on_run_end=st.sampled_from(["drop", "queue"]),
        skew=SKEW,
        which=TARGET,
    )
    def follow_up(self, text: str, when_idle: str, on_run_end: str, skew: Any, which: str) -> None:
        payload = {"text": text, "when_idle": when_idle, "on_run_end": on_run_end}
        self.producer("follow_up", payload, skew, which)

    @rule(skew=SKEW, which=TARGET)
    def abort(self, skew: Any, which: str) -> None:
        self.producer("abort", {"reason": "user"}, skew, which)

    @precondition(lambda self: self.model.last_run is not None)
    @rule(
        approve=st.booleans(),
        key=KEYS,
        digest=DIGESTS,
        gen=DECISION_GEN,
        which=st.sampled_from(["active", "active", "active", "old"]),
        skew=SKEW,
    )
    def decide_action(
        self, approve: bool, key: str, digest: str | None, gen: str, which: str, skew: Any
    ) -> None:
        """A person approves or denies a key: pending or not, with the digest they saw or
        another, for the request's generation or an older one, on the run or an old one."""
        run_id = self.target(which) or self.model.last_run
        generation = None
        if gen != "none" and self.state.active is not None:
            generation = self.state.active.generation - (gen == "older")
        payload: dict[str, Any] = {
            "idempotency_key": key,
            "args_digest": digest,
            "generation": generation if generation and generation > 0 else None,
        }
        if not approve:
            payload["reason"] = "not this one"
        pre = self.state
        rec = pre.active.actions.get(key) if pre.active and pre.active.run_id == run_id else None
        events = self.apply(
            self.cmd(
                "action.approve" if approve else "action.deny",
                payload,
                skew,
                run_id=run_id,
                actor="user:bo",
            )
        )
        if self.decided.get(events[0].command_id if events else "") is None:
            return
        decided = [e for e in events if e.type in ("action.approved", "action.denied")]
        if decided:
            # only a key waiting for a person, for the digest they saw, within its window
            assert rec is not None and rec.decision == "pending"
            assert rec.args_digest == digest and self.now < (rec.expires_at or 0)
            assert decided[0].payload.model_dump()["decided_by"] == "user:bo"

    @rule(task_of=DEQUEUE_TARGET, i=st.integers(min_value=0), skew=SKEW, which=TARGET)
    def dequeue(self, task_of: str, i: int, skew: Any, which: str) -> None:
        """A person removes a queued task: one that waits, or one that has started, was
        removed already, is an input of the run, or never existed (each refused)."""
        st_ = self.state
        task = "c-never"
        if task_of == "waiting" and st_.queue:
            task = st_.queue[i % len(st_.queue)].source_command_id
        elif task_of == "removed" and st_.removed:
            task = st_.removed[-1].source_command_id
        elif task_of == "started" and st_.active is not None:
            task = st_.active.source_command_id
        elif task_of == "pending" and st_.active is not None and st_.active.inputs:
            task = st_.active.inputs[0].source_command_id
        self.producer("dequeue", {"command_id": task}, skew, which)

    @rule(skew=SKEW, which=TARGET)
    def clear_queue(self, skew: Any, which: str) -> None:
        self.producer("clear_queue", {}, skew, which)

    @precondition(lambda self: self.state.tenant_id == TENANT)
    @rule(text=TEXT, type_=st.sampled_from(["prompt", "abort", "steer", "dequeue", "clear_queue"]))
    def intruder(self, text: str, type_: str) -> None:
        """Another tenant's command, under an id the owner will use next. (Before the
        session's first run any tenant may claim it: that is the tenancy rule, tested in
        the rules; here the owner has.)"""
        self.n += 1
        cid = f"owner-{self.n}"
        payload: dict[str, Any] = {"text": text} if type_ in ("prompt", "steer") else {}
        if type_ == "dequeue":
            q = self.state.queue
            payload = {"command_id": q[0].source_command_id if q else "c-never"}
        self.apply(self.cmd(type_, payload, tenant_id="intruder", command_id=cid))
        self.owner_ids.append(cid)

    @precondition(lambda self: self.model.last_run is not None)
    @rule(
        qid=QIDS,
        answer=ANSWERS,
        gen=DECISION_GEN,
        which=st.sampled_from(["active", "active", "active", "old"]),
        skew=SKEW,
    )
    def answer_question(self, qid: str, answer: Any, gen: str, which: str, skew: Any) -> None:
        """A person answers a question: open or not, for its generation or an older one,
        on the run or an old one, in its window or after, within the bound or over it."""
        run_id = self.target(which) or self.model.last_run
        generation = None
        if gen != "none" and self.state.active is not None:
            generation = self.state.active.generation - (gen == "older")
        payload = {
            "question_id": qid,
            "answer": answer,
            "generation": generation if generation and generation > 0 else None,
        }
        pre = self.state
        rec = pre.active.questions.get(qid) if pre.active and pre.active.run_id == run_id else None
        events = self.apply(
            self.cmd("question.answer", payload, skew, run_id=run_id, actor="user:bo")
        )
        answered = [e for e in events if e.type == "question.answered"]
        if answered:
            # only an open question, for its generation, within its window
            assert rec is not None and rec.status == "open" and self.now < rec.expires_at
            assert payload["generation"] in (None, rec.generation)

    @precondition(lambda self: self.state.active and self.state.active.lease_owner)
    @rule(qid=QIDS, answer=ANSWERS, wait=st.sampled_from([0, 0, 9_000]))
    def holder_asks_and_a_person_answers(self, qid: str, answer: Any, wait: int) -> None:
        """The common case, made frequent: the holder asks, a person answers (perhaps
        after the window), the holder asks again (a re-run handler) and gets the answer."""
        self.work("holder", "question.ask", {"question_id": qid, "question": "Which?"})
        run = self.state.active
        if run is None or run.questions.get(qid) is None:
            return
        self.now += wait
        self.apply(
            self.cmd(
                "question.answer",
                {"question_id": qid, "answer": answer},
                run_id=run.run_id,
                actor="user:bo",
            )
        )
        events = self.work_events(
            "holder", "question.ask", {"question_id": qid, "question": "Which?"}
        )
        rec = self.state.active.questions.get(qid) if self.state.active else None
        if rec is not None and rec.status == "answered":
            assert [e.type for e in events] == ["question.replayed"]
            assert events[0].payload.model_dump()["answer"] == rec.answer

    @precondition(lambda self: self.state.active and self.state.active.lease_owner)
    @rule(qid=QIDS, gen=DECISION_GEN, wait=st.sampled_from([0, 0, 9_000]))
    def takeover_with_an_open_question(self, qid: str, gen: str, wait: int) -> None:
        """The holder asks and gives the run up while it waits; the next holder asks the
        same question again, perhaps after a while; a person then answers, naming a
        generation or not."""
        ask = {"question_id": qid, "question": "Which?"}
        self.work("holder", "question.ask", ask)
        self.work("holder", "lease.release")
        run = self.state.active
        if run is None or run.lease_owner is not None:
            return
        old = run.generation - 1
        self.now += wait
        self.acquire("w3", 30_000)
        self.work("w3", "question.ask", ask)
        run = self.state.active
        if run is None:
            return
        named = {"none": None, "current": run.generation, "older": old or None}[gen]
        answer = {"question_id": qid, "answer": "ok", "generation": named}
        self.apply(self.cmd("question.answer", answer, run_id=run.run_id, actor="user:bo"))

    @precondition(lambda self: self.model.last_run is not None)
    @rule(worker=WORKERS, qid=QIDS)
    def question_ask(self, worker: str, qid: str) -> None:
        self.work(worker, "question.ask", {"question_id": qid, "question": "Which account?"})

    @rule(reason=st.sampled_from([None, "asked"]), foreign=st.booleans())
    def erase(self, reason: str | None, foreign: bool) -> None:
        """An administrator's erase on the control topic: refused while a run is active,
        another tenant's refused; otherwise the session is erased."""
        pre = self.state
        tenant = "intruder" if foreign else TENANT
        payload = {} if reason is None else {"reason": reason}
        events = self.apply(self.cmd("session.erase", payload, tenant_id=tenant), via="timer")
        if foreign and pre.tenant_id == TENANT:
            assert _reasons(events) == ["tenant_mismatch"]
        elif pre.active is not None:
            assert _reasons(events) == ["session_busy"], "erased while a run is active"
        else:
            assert [e.type for e in events] == ["session.erased"]

    @rule(
        kind=st.sampled_from(["lease_expiry", "run_deadline", "cancel_deadline", "approval_expiry"])
    )
    def forged_timer(self, kind: str) -> None:
        """A `timer.fired` from outside, for the active run, whenever the forger likes."""
        run = self.state.active
        if run is None:
            return
        pre = self.state
        events = self.apply(
            self.cmd(
                "timer.fired",
                {"kind": kind, "due_at": 0},
                run_id=run.run_id,
                generation=run.generation,
            )
        )
        due = {t.kind: t.due_at for t in due_timers(pre, CONFIG.retention_ms)}
        if kind not in due or due[kind] > self.now:
            assert _reasons(events) == ["timer_stale"], "a timer honoured before it was due"

    @precondition(lambda self: self.commands)
    @rule(i=st.integers(min_value=0))
    def duplicate(self, i: int) -> None:
        self.apply(self.commands[i % len(self.commands)][0])

    @precondition(lambda self: self.commands)
    @rule(i=st.integers(min_value=0), shift=st.sampled_from([1, 2]), fresh=st.booleans())
    def misrouted(self, i: int, shift: int, fresh: bool) -> None:
        """A command the session saw (a worker's, a timer, a producer's), on the topic of
        another class: a producer forging a worker command or a timer, a worker a prompt.
        Under its own id or a fresh one: refused either way, and nothing else happens."""
        cmd = self.commands[i % len(self.commands)][0]
        own = next(c for c, types in CLASSES.items() if cmd.type in types)
        order = sorted(CLASSES)
        wrong = order[(order.index(own) + shift) % len(order)]
        if fresh:
            self.n += 1
            cmd = cmd.model_copy(update={"command_id": f"m{self.n}"})
        self.apply(cmd, via=wrong)  # type: ignore[arg-type]

    @precondition(lambda self: self.decided)
    @rule(i=st.integers(min_value=0), text=TEXT)
    def reuse_id(self, i: int, text: str) -> None:
        """An id the session decided, for other content."""
        ids = sorted(self.decided)
        first = self.decided[ids[i % len(ids)]]
        other = "steer" if first.type != "steer" else "send"
        self.apply(self.cmd(other, {"text": text + "!"}, command_id=first.command_id))

    @precondition(lambda self: any(c.type == "prompt" for c in self.decided.values() if c))
    @rule(i=st.integers(min_value=0), typed=INPUT)
    def reinput(self, i: int, typed: Any) -> None:
        """A prompt the session decided, sent again under its id with another typed input
        (or the same: then it is an exact re-send)."""
        prompts = sorted(c.command_id for c in self.decided.values() if c and c.type == "prompt")
        first = self.decided[prompts[i % len(prompts)]]
        payload = {**first.payload.model_dump(), "input": typed}
        again = first.model_copy(update={"payload": first.payload.model_validate(payload)})
        self.apply(again)

    # -- workers ------------------------------------------------------------------------------
    @rule(worker=WORKERS, lease_ms=st.sampled_from([5_000, 30_000, 10**12]))
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

    @precondition(lambda self: self.model.last_run is not None)
    @rule(worker=WORKERS)
    def renew(self, worker: str) -> None:
        self.work(worker, "lease.renew", {"lease_ms": 30_000})

    @precondition(lambda self: self.model.last_run is not None)
    @rule(worker=WORKERS)
    def release(self, worker: str) -> None:
        self.work(worker, "lease.release")

    @precondition(lambda self: self.model.last_run is not None)
    @rule(
        worker=WORKERS,
        kind=st.sampled_from(
            ["model.request.started", "tool.started", "model.request.finished", "tool.finished"]
        ),
        call_id=st.sampled_from([None, "c1", "c2", "c3"]),
    )
    def progress(self, worker: str, kind: str, call_id: str | None) -> None:
        """Calls start and end (or never end: their holder dies, and the loss closes them)."""
        self.work(worker, "run.progress", {"kind": kind, "name": "x", "call_id": call_id})

    @precondition(lambda self: self.model.last_run is not None)
    @rule(worker=WORKERS)
    def compact_start(self, worker: str) -> None:
        self.work(worker, "compact.start")

    @precondition(lambda self: self.model.last_run is not None)
    @rule(worker=WORKERS)
    def compact_finish(self, worker: str) -> None:
        self.work(worker, "compact.finish", {"checkpoint_uri": f"s3://ck/{self.n}"})

    @precondition(lambda self: self.model.last_run is not None)
    @rule(worker=WORKERS, key=KEYS, kind=ACTION_KINDS, digest=DIGESTS)
    def action_request(self, worker: str, key: str, kind: str, digest: str | None) -> None:
        payload: dict[str, Any] = {"idempotency_key": key, "kind": kind}
        if digest is not None:
            payload["args_digest"] = digest
        self.work(worker, "action.request", payload)

    @precondition(lambda self: self.model.last_run is not None)
    @rule(worker=WORKERS, key=KEYS, ok=st.booleans())
    def action_result(self, worker: str, key: str, ok: bool) -> None:
        self.work(worker, "action.result", {"idempotency_key": key, "ok": ok})

    @precondition(lambda self: self.model.last_run is not None)
    @rule(
        worker=WORKERS,
        steps=STEPS,
    )
    def step_record(self, worker: str, steps: list[tuple[str, str, str | None]]) -> None:
        self.record_steps(worker, steps)

    @precondition(lambda self: self.state.active and self.state.active.lease_owner)
    @rule(key=KEYS, approve=st.booleans())
    def holder_asks_and_a_person_decides(self, key: str, approve: bool) -> None:
        """The common case, made frequent: the holder asks for a payment, a person sees it
        and decides with the digest shown (sometimes after its window)."""
        payload = {"idempotency_key": key, "kind": "payment", "args_digest": "sha256:aa"}
        self.work("holder", "action.request", payload)
        run = self.state.active
        if run is None or run.actions.get(key) is None:
            return
        decision = {"idempotency_key": key, "args_digest": "sha256:aa"}
        self.apply(
            self.cmd(
                "action.approve" if approve else "action.deny",
                decision,
                run_id=run.run_id,
                actor="user:bo",
            )
        )

    @precondition(lambda self: self.state.active and self.state.active.lease_owner)
    @rule(key=KEYS, digest=DIGESTS, gen=DECISION_GEN, wait=st.sampled_from([0, 0, 6_000]))
    def takeover_with_a_pending_approval(
        self, key: str, digest: str | None, gen: str, wait: int
    ) -> None:
        """The holder asks for a payment and gives the run up while it waits; the next
        holder asks for the key again (the same arguments or others), perhaps after a
        while; a person then decides, naming a generation or not."""
        pay = {"idempotency_key": key, "kind": "payment", "args_digest": "sha256:aa"}
        self.work("holder", "action.request", pay)
        self.work("holder", "lease.release")
        run = self.state.active
        if run is None or run.lease_owner is not None:
            return
        old = run.generation - 1
        self.now += wait
        self.acquire("w3", 30_000)
        self.work("w3", "action.request", {**pay, "args_digest": digest})
        run = self.state.active
        if run is None:
            return
        named = {"none": None, "current": run.generation, "older": old or None}[gen]
        decision = {"idempotency_key": key, "args_digest": digest, "generation": named}
        self.apply(self.cmd("action.approve", decision, run_id=run.run_id, actor="user:bo"))

    @precondition(lambda self: self.state.active and self.state.active.lease_owner)
    @rule(data=st.data())
    def holder_records_steps(self, data: st.DataObject) -> None:
        """The common case, made frequent: the holder records what it ran."""
        steps = data.draw(STEPS)
        self.record_steps("holder", steps)

    def record_steps(self, worker: str, steps: list[tuple[str, str, str | None]]) -> None:
        """Finished steps' results (or pointers), recorded once per step id: a holder may
        record several in a row, repeat one, or pass the run's bounds."""
        for step, kind, result in steps:
            payload: dict[str, Any] = {
                "step_id": step,
                "kind": kind,
                "name": "search" if kind == "tool" else "gpt",
                "input_digest": "d" * 16,
                "input": '{"q": "x"}',
            }
            if result == "ref":
                payload["result_ref"] = f"s3://steps/{step}"
            else:
                payload["result"] = result
            run = self.model.active
            holder = self.who(worker) == (run.holder if run else None)
            already = run is not None and step in run.steps
            events = self.work_events(worker, "step.record", payload)
            if holder and already:
                # the first record stands: a second one for the step id is refused
                assert _reasons(events) == ["step_already_recorded"]

    @precondition(lambda self: self.model.last_run is not None)
    @rule(worker=WORKERS)
    def cancel_ack(self, worker: str) -> None:
        self.work(worker, "cancel.ack", {"model_request_aborted": True})

    @precondition(lambda self: self.model.last_run is not None)
    @rule(worker=WORKERS, consume=st.sampled_from(["none", "follow_ups", "all"]))
    def complete(self, worker: str, consume: str) -> None:
        run = self.state.active
        inputs = run.inputs if run else ()
        payload: dict[str, Any] = {}
        if consume != "none":
            payload["consumed_follow_ups"] = [
                i.source_command_id for i in inputs if i.kind == "follow_up"
            ]
        if consume == "all":
            payload["consumed_steers"] = [i.source_command_id for i in inputs if i.kind == "steer"]
        self.work(worker, "run.complete", payload)

    @precondition(lambda self: self.model.last_run is not None)
    @rule(worker=WORKERS, retryable=st.booleans())
    def fail(self, worker: str, retryable: bool) -> None:
        self.work(worker, "run.fail", {"error": "boom", "retryable": retryable})

    # -- schedules ----------------------------------------------------------------------------
    @rule(
        sid=SCHEDULE_IDS,
        update=st.booleans(),
        when=SCHEDULE_WHEN,
        overlap=OVERLAPS,
        catch_up=CATCH_UPS,
        max_catch_up=st.sampled_from([1, 3]),
        jitter=st.sampled_from([0, 0, 5_000]),
        text=TEXT,
    )
    def define_schedule(
        self,
        sid: str,
        update: bool,
        when: dict[str, Any],
        overlap: str,
        catch_up: str,
        max_catch_up: int,
        jitter: int,
        text: str,
    ) -> None:
        payload = {
            "schedule_id": sid,
            "text": text,
            "overlap": overlap,
            "catch_up": catch_up,
            "max_catch_up": max_catch_up,
            "jitter_ms": jitter,
            **when,
        }
        type_ = "schedule.update" if update else "schedule.create"
        events = self.apply(self.cmd(type_, payload, actor="user:ana"))
        kept = {sc.schedule_id for sc in self.state.schedules}
        assert len(kept) <= CONFIG.max_schedules
        if events and events[0].type.startswith("schedule."):
            assert sid in kept

    @rule(sid=SCHEDULE_IDS)
    def delete_schedule(self, sid: str) -> None:
        self.apply(self.cmd("schedule.delete", {"schedule_id": sid}, actor="user:ana"))
        assert self.state.schedule(sid) is None

    # -- the clock ----------------------------------------------------------------------------
    @rule(ms=st.sampled_from([500, 4_000, 6_000, 21_000, 31_000, 125_000]))
    def advance(self, ms: int) -> None:
        self.seen_timers.extend(due_timers(self.state, CONFIG.retention_ms))
        self.now += ms
        # each due timer removes itself or moves on: a few at most (a schedule catching up
        # fires at most its bound in a row), never a loop
        for _ in range(4 + CONFIG.max_schedules * 5):
            due = [t for t in due_timers(self.state, CONFIG.retention_ms) if t.due_at <= self.now]
            if not due:
                return
            events = self.apply(timer_command(self.state, due[0], self.now))
            assert events and events[0].type != "command.rejected", "a due timer always decides"
        assert not [t for t in due_timers(self.state, CONFIG.retention_ms) if t.due_at <= self.now]

    @rule(ms=st.sampled_from([1, 300]))
    def clock_steps_back(self, ms: int) -> None:
        """The broker's clock stepped back (or a new leader's is behind): the fold holds."""
        self.now -= ms

    @precondition(lambda self: self.seen_timers)
    @rule(i=st.integers(min_value=0))
    def late_timer(self, i: int) -> None:
        """A timer computed from an older state, fired late (e.g. by a restarted processor)."""
        t = self.seen_timers[i % len(self.seen_timers)]
        events = self.apply(timer_command(self.state, t, max(self.now, t.due_at)))
        if events and events[0].type == "schedule.fired":
            return  # still the schedule's current firing, and due: honoured as it should be
        for e in events:
            if e.type == "command.rejected":
                assert e.payload_as(CommandRejected).reason == "timer_stale"

    # -- invariants ---------------------------------------------------------------------------
    @invariant()
    def one_active_run_and_no_idle_backlog(self) -> None:
        run = self.state.active
        assert (run.run_id if run else None) == (self.model.active and self.model.active.run_id)
        if run is None:
            assert self.state.queue == (), "the session sits idle with work waiting"
        else:
            assert run.status in ACTIVE_STATUSES

    @invariant()
    def bounded(self) -> None:
        st_ = self.state
        assert len(st_.queue) <= CONFIG.max_queue
        assert st_.held_bytes() <= CONFIG.max_held_bytes
        assert len(st_.finished) <= CONFIG.finished_window
        assert len(st_.removed) <= CONFIG.finished_window
        if st_.active is not None:
            assert len(st_.active.inputs) <= CONFIG.max_inputs
            assert len(st_.active.actions) <= CONFIG.max_actions
            if st_.active.lease_expires_at is not None:
                assert st_.active.lease_expires_at <= st_.clock + CONFIG.max_lease_ms
        assert len(encode_state(st_)) <= MAX_STATE_BYTES, "a state record beyond its bound"

    def teardown(self) -> None:
        assert self.model.inputs_without_exactly_one_fate() == []
        assert fold(self.log, SID, CONFIG) == self.state
        assert replay(self.commands) == self.encoded
        assert [CODEC.decode_event(b) for b in self.encoded] == self.log


def _h(cmd: Command) -> int:
    return command_hash(cmd.command_id, cmd.tenant_id)


def _same(a: Command, b: Command) -> bool:
    """The same command, re-sent (its producer may have stamped it again). Compared as
    JSON, as the digest compares it: an input of 0 and one of false are equal in Python,
    not on the wire."""
    return Codec.command_to_json(a.model_copy(update={"ts": 0})) == Codec.command_to_json(
        b.model_copy(update={"ts": 0})
    )


def _reasons(events: list[Event]) -> list[str]:
    return [e.payload_as(CommandRejected).reason for e in events if e.type == "command.rejected"]


SessionMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSessionMachine = SessionMachine.TestCase
