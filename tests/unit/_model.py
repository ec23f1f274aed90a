"""A reference model of the protocol, rebuilt from a session's events alone.

It shares no code with `sessionstream.core.decider` and was written from the protocol's text
(docs/protocol.md), not from the decider: it reads the log the way an auditor
would and fails on anything the protocol forbids:

- a seq gap; an event after its run ended; two active runs; time going backwards;
- a generation that moves without the lease being lost; a lease granted while held or while
  cancelling, or longer than the cap; a lease taken (or a deadline passed) early;
- an approval outside `running`, or a second decision for one idempotency key;
- a steer or follow-up that does not end with exactly one fate (consumed, dropped with
  its run, or re-queued) before its run's `run.finished`; a fate for an input that was
  not pending; a dropped input whose terminal status is not its run's; inputs not handed to
  a new holder right after its grant, in arrival order;
- `completed` with a follow-up the run never consumed; `cancelled` before the ack or the
  loss of the lease; a compacting run nobody holds; a cancelling run nobody holds;
- queued work started out of arrival order (interrupts go first), or anything starting a
  run that was never queued; a follow-up turning into a run without being queued;
- a retry naming a run that did not end retryable; `timed_out` not retryable;
- typed input (docs/protocol.md#producer-commands): a run or a queued task whose input is
  not its prompt's (when the model is shown the command); a queued task that starts with
  another input than it was queued with; a run started by a follow-up or a `send` with an
  input; an input that is not JSON text;
- more waiting tasks, pending inputs or held text (prompts, typed inputs, steers and
  follow-ups) than the bounds allow;
- durable steps (docs/protocol.md#durable-steps): a step recorded by anyone but the holder
  of the current generation, or outside an active run; a step id recorded twice in a run;
  a record with both a result and a pointer, an inline result over its bound, more
  records or held bytes than the run may hold; a grant whose `checkpointRef` is not the
  run's latest `context.checkpointed` or whose `stepsDelivered` is not the number of
  recorded steps; recorded steps not handed to a new holder right after its grant (after
  its inputs), in record order, as recorded, with the generation that recorded them; a
  step delivered outside a grant; a run that asked to start from the session's latest
  checkpoint (`fromCheckpoint`) and did not get it as its `contextRef`;
- a model request, tool call or sub-task (with a call id) left open by a holder that lost
  the lease and not closed right after the loss (after a compaction's abandonment), in
  start order, as `abandoned: lease_lost` by that holder;
- approvals (docs/protocol.md#approvals, and the feature's own text): an action waits for a person
  (`action.pending`) only while the run is `running` and held, and its window ends after
  it was asked; a pending key is decided at most once, by a person before its window
  closes (`action.approved` / `action.denied {denied}`) or by the window's end
  (`approval_expired`, not before), or is resolved by a cancel (`cancelling`), a lease
  loss (`lease_lost`) or the run's end (`run_finished`) — every pending key, **first**, in
  the same decision, before anything else it decides; nothing of the run is pending after
  a cancel, a loss or the end; a person's decision belongs to the pending request's
  generation; a key denied `lease_lost` is asked again only by a later generation, for the
  same kind and digest and with the same window (a takeover never extends it), never
  approved a second time; an action completed without an approval, or one that needed a
  person completed without a person's approval;
- questions to a person (docs/protocol.md#questions-to-a-person): a question is asked
  (`question.asked`) only while the run is `running` and held, with a window that ends
  after it was asked (`questionTtlMs` from now, when the bound is given); it is answered at
  most once, by a person, before its window closes, for the generation that asked it, with
  an answer within `maxAnswerBytes`; it is closed by the window's end (`question_expired`,
  not before) or by a cancel, a lease loss or the run's end — every open question, right
  after the pending approvals and before anything else the decision writes; nothing is open
  after a cancel, a loss or the end; a question closed `lease_lost` is asked again only by
  a later generation, with the same window; a replay repeats the record (the answer it
  got, never another); never more than `maxQuestions` recorded per run;
- queue control (docs/protocol.md#queue-control, and the feature's text): a task leaves the
  queue without starting only by a `run.dequeued` that names a task waiting now, once; a
  `dequeue` removes exactly the task it names (`reason: dequeued`), or is refused
  `not_queued` only when no such task waits; a `clear_queue` removes every waiting task, in
  queue order (`reason: cleared`), and leaves the queue empty, or is refused `queue_empty`
  only when nothing waits; the removal names who removed it (the command's actor) and who
  had queued it; a removed task never starts; and nothing else (no run, no input) changes;
- labels: a prompt's run (started now, or queued and started later) carries its
  `metadata`, the same keys and values.
- erasure (docs/protocol.md#erasure-and-retention, and the feature's text): a session
  erased while a run is active (refused or cancelled first: the spec says refused), or
  with work waiting; an erasure record that names the session by anything but the
  SHA-256 of its id, or counts its runs wrongly; a retention erasure before the session
  was idle for the retention period by the log's clock, or while it was not idle; after
  an erasure, an event of an erased run, a key that repeats an erased event's key (a run
  id used before, a session-log seq going back), a retry of an erased run, a run started
  from an erased checkpoint.
- schedules (docs/protocol.md#schedules): a schedule created under an id the session keeps,
  or updated, deleted or fired under one it does not; more schedules than the bound; a
  first or next firing not after the time it was computed at (a catch-up `all` firing
  excepted, and only up to its bound), or a jitter outside [0, jitterMs]; a firing before
  its recorded time or for another time than recorded; a firing `skipped` `busy` without
  an active run or with another overlap than `skip`, `skipped` `late` under catch-up
  `once`; a `prompted` firing not followed by its prompt's one outcome — idle: its run
  started with the schedule's text and input, asked by `schedule:<id>`; busy: `reject` a
  `session_busy` / `session_compacting`, `enqueue` / `interrupt` the text queued (at the
  front for `interrupt`) or refused `queue_full`; a skipped one followed by anything.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from sessionstream.schemas.commands import Command
from sessionstream.schemas.events import SESSION_LOG, Event

SESSION_LOG_TYPES = {
    "command.rejected",
    "run.queued",
    "action.denied",
    "session.erased",
    "schedule.created",
    "schedule.updated",
    "schedule.deleted",
    "schedule.fired",
    "run.dequeued",
}
FATES = {"run.input_consumed", "run.input_dropped", "run.input_requeued"}

#: progress types that start a call, and the type that ends each kind
CALL_STARTED = {
    "model.request.started": "model",
    "tool.started": "tool",
    "subtask.started": "subtask",
}
CALL_FINISHED = {
    "model": "model.request.finished",
    "tool": "tool.finished",
    "subtask": "subtask.finished",
}

#: event -> (statuses it may follow, status after it)
MOVES = {
    "run.compaction_started": (("running",), "compacting"),
    "run.compaction_finished": (("compacting",), "running"),
    "run.compaction_abandoned": (("compacting",), "running"),
    "run.cancel_requested": (("running", "compacting"), "cancelling"),
}


@dataclass(frozen=True)
class Bounds:
    """The limits a log must respect (None: not checked)."""

    max_queue: int | None = None
    max_inputs: int | None = None
    max_held_bytes: int | None = None
    max_lease_ms: int | None = None
    max_step_result_bytes: int | None = None
    max_steps: int | None = None
    max_run_step_bytes: int | None = None
    #: calls tracked open per run (beyond it a started call is not closed on a loss)
    max_open_calls: int | None = None
    #: how long a pending approval waits for a person
    approval_ttl_ms: int | None = None
    #: how long a question waits for a person, the most a run records, the largest answer
    question_ttl_ms: int | None = None
    max_questions: int | None = None
    max_answer_bytes: int | None = None
    #: how long a finished session stays before its retention erases it
    retention_ms: int | None = None
    #: schedules a session may keep
    max_schedules: int | None = None


def _size(text: str) -> int:
    return len(text.encode())


@dataclass
class Waiting:
    """A task waiting in the session's queue."""

    source: str
    kind: str
    text: str
    actor: str | None
    retry_of: str | None
    #: the typed input it was queued with (JSON text), or None
    input: str | None = None
    #: the labels it was queued with
    metadata: dict[str, str] = field(default_factory=dict)


def _input_of(p: dict[str, Any]) -> str | None:
    """A `run.started` / `run.queued` payload's typed input, checked to be JSON text."""
    text = p["input"]
    if text is not None:
        assert isinstance(text, str), f"input {text!r} is not JSON text"
        json.loads(text)  # raises if it is not JSON
    return text


@dataclass
class Approval:
    """A key that waited (or waits) for a person."""

    kind: str
    digest: str | None
    expires_at: int
    generation: int
    state: str = "pending"  # pending | approved | denied
    reason: str | None = None


@dataclass
class Question:
    """A question the run asked a person."""

    expires_at: int
    generation: int
    state: str = "open"  # open | answered | closed
    answer: str | None = None
    answered_by: str | None = None
    reason: str | None = None


#: what resolves every pending approval, and the reason it gives them
RESOLVERS = {
    "run.cancel_requested": "cancelling",
    "run.lease_released": "lease_lost",
    "run.lease_expired": "lease_lost",
    "run.finished": "run_finished",
}


@dataclass
class RunModel:
    """What the protocol allows one run to do."""

    run_id: str
    status: str
    generation: int
    timeout_at: int
    prompt: str
    #: the prompt's typed input (JSON text), or None
    input: str | None = None
    holder: str | None = None
    expires_at: int = 0
    decided: set[str] = field(default_factory=set)
    #: accepted inputs without a fate yet: source command id -> (kind, text)
    pending: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: after a grant: the pending inputs still to be handed to the new holder, in order
    to_deliver: list[str] | None = None
    requeued: list[str] = field(default_factory=list)
    #: the terminal status the end-of-run fates named, and the kinds they dropped
    ending_as: str | None = None
    dropped_kinds: set[str] = field(default_factory=set)
    last: str = "run.started"
    ack_seen: bool = False
    #: recorded steps, in record order: step id -> what a new holder must get back
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: after a grant: the recorded steps still to be handed over, in order
    steps_to_deliver: list[str] | None = None
    #: the run's latest context.checkpointed uri
    checkpoint: str | None = None
    #: calls started and not finished: (kind, call id), in start order
    open_calls: list[tuple[str, str]] = field(default_factory=list)
    #: after a lease loss: the calls still to be closed as abandoned, and by whom
    to_close: list[tuple[str, str]] = field(default_factory=list)
    lost_holder: str | None = None
    #: keys the gate (or a person) approved
    approved: set[str] = field(default_factory=set)
    #: keys that waited for a person
    approvals: dict[str, Approval] = field(default_factory=dict)
    #: questions asked of a person (recorded ones)
    questions: dict[str, Question] = field(default_factory=dict)

    def open_questions(self) -> list[str]:
        return [q for q, x in self.questions.items() if x.state == "open"]

    def pending_keys(self) -> list[str]:
        return [k for k, a in self.approvals.items() if a.state == "pending"]


class LogModel:
    """Feed it one command's events at a time, in log order; it asserts the protocol."""

    def __init__(self, bounds: Bounds | None = None) -> None:
        self.bounds = bounds or Bounds()
        self.active: RunModel | None = None
        self.last_run: str | None = None
        self.runs: dict[str, RunModel] = {}
        self.ended: dict[str, tuple[str, bool]] = {}  # run -> (terminal status, retryable)
        self.last_seq: dict[str, int] = {}
        self.queue: list[Waiting] = []
        self.clock = 0
        #: every input accepted, and how many fates it got
        self.fates: dict[str, int] = {}
        #: the latest context.checkpointed of any run of the session
        self.checkpoint: str | None = None
        #: tasks removed from the queue (they never start)
        self.removed: set[str] = set()
        #: when the last run finished, while no run started after it (None: not idle)
        self.idle_since: int | None = None
        #: runs of the session erased (nothing of them may follow)
        self.erased: set[str] = set()
        #: the schedules kept: id -> what their definition and last firing said
        self.schedules: dict[str, dict[str, Any]] = {}

    # -- per command ----------------------------------------------------------------------------
    def feed(self, events: list[Event], command: Command | None = None) -> None:
        """One command's events; with the `command` itself, also what its events must
        carry of it."""
        self.rounds(events)
        self.resolution_first(events)
        self.schedule_firing(events)
        waiting = list(self.queue)
        active = self.active.run_id if self.active is not None else None
        for e in events:
            self.event(e)
        if command is not None:
            self.carried(command, events)
            self.queue_control(command, events, waiting, active)
        self.between_commands()

    def queue_control(
        self, command: Command, events: list[Event], waiting: list[Waiting], active: str | None
    ) -> None:
        """What `dequeue` and `clear_queue` may do, and what only they may do."""
        removals = [e for e in events if e.type == "run.dequeued"]
        types = [e.type for e in events]
        if command.type not in ("dequeue", "clear_queue"):
            assert not removals, f"a {command.type} removed a queued task"
            return
        if not events:
            return  # an exact re-send
        assert types == ["command.rejected"] or set(types) == {"run.dequeued"}, (
            f"a {command.type} decided {types}"
        )
        got = [e.payload.model_dump() for e in removals]
        for p in got:
            assert p["actor"] == command.actor, "a removal names another remover"
        by_source = {w.source: w for w in waiting}
        refused = events[0].payload.model_dump()["reason"] if not removals else None
        if command.type == "dequeue":
            target = command.payload.model_dump()["command_id"]
            if removals:
                assert target in by_source, f"dequeue removed {target}, which did not wait"
                assert [(p["source_command_id"], p["reason"]) for p in got] == [
                    (target, "dequeued")
                ], f"dequeue of waiting {target} gave {types}"
            else:
                assert not (refused == "not_queued" and target in by_source), (
                    f"{target} waits, yet refused not_queued"
                )
        else:
            if removals:
                assert [(p["source_command_id"], p["reason"]) for p in got] == [
                    (w.source, "cleared") for w in waiting
                ], f"clear_queue of {[w.source for w in waiting]} gave {types}"
                assert not self.queue, "a cleared queue still holds tasks"
            else:
                assert not (refused == "queue_empty" and waiting), "tasks wait, yet queue_empty"
        for p in got:
            w = by_source[p["source_command_id"]]
            assert (p["kind"], p["queued_by"]) == (w.kind, w.actor), "removal misnames the task"
        after = self.active.run_id if self.active is not None else None
        assert after == active, "removing queued tasks changed the active run"

    @staticmethod
    def carried(command: Command, events: list[Event]) -> None:
        """A prompt's run (started now, or queued for later) carries the prompt's typed
        input: the same JSON value, null when it had none."""
        if command.type != "prompt":
            return
        want = command.payload.model_dump().get("input")  # left out when null
        for e in events:
            if e.type not in ("run.started", "run.queued"):
                continue
            p = e.payload.model_dump()
            if p["source_command_id"] != command.command_id:
                continue  # a queued task of an earlier command that started now
            text = p["input"]
            got = None if text is None else json.loads(text)
            assert (text is None) == (want is None) and got == want, (
                f"{e.type} carries the input {text!r}, the prompt had {want!r}"
            )
            kinds = command.payload.model_dump().get("approval_kinds", [])
            assert p["approval_kinds"] == kinds, (
                f"{e.type} carries the approval kinds {p['approval_kinds']}, the prompt {kinds}"
            )
            labels = command.payload.model_dump().get("metadata") or {}
            assert (p["metadata"] or {}) == labels, (
                f"{e.type} carries the labels {p['metadata']}, the prompt had {labels}"
            )

    def resolution_first(self, events: list[Event]) -> None:
        """A cancel, a lease loss or the run's end denies every pending approval of the
        run first: the decision's first events are those denials, with that reason."""
        run = self.active
        pending = run.pending_keys() if run is not None else []
        asked = run.open_questions() if run is not None else []
        if run is None or not (pending or asked):
            return
        ends = [e.type for e in events if e.run_id == run.run_id and e.type in RESOLVERS]
        if not ends:
            return
        closed = events[len(pending) : len(pending) + len(asked)]
        assert [
            (
                e.type,
                e.payload.model_dump().get("question_id"),
                e.payload.model_dump().get("reason"),
            )
            for e in closed
        ] == [("question.closed", q, RESOLVERS[ends[0]]) for q in asked], (
            f"{ends[0]} with questions open, not closed right after the approvals: "
            f"{[e.type for e in events]}"
        )
        head = events[: len(pending)]
        assert [e.type for e in head] == ["action.denied"] * len(pending), (
            f"{ends[0]} with approvals pending, not denied first: {[e.type for e in events]}"
        )
        got = [
            (e.payload.model_dump()["idempotency_key"], e.payload.model_dump()["reason"])
            for e in head
        ]
        assert got == [(k, RESOLVERS[ends[0]]) for k in pending], (
            f"pending approvals resolved as {got} by {ends[0]}"
        )

    def schedule_firing(self, events: list[Event]) -> None:
        """A firing is the decision's first event; a skipped one its only event, a
        prompted one followed by its prompt's one outcome, by the overlap policy."""
        fired = [e for e in events if e.type == "schedule.fired"]
        if not fired:
            return
        assert len(fired) == 1 and events[0] is fired[0], "a firing is its decision's first event"
        f = fired[0].payload.model_dump()
        sc = self.schedules.get(f["schedule_id"])
        assert sc is not None, f"schedule {f['schedule_id']} fired and is not kept"
        rest = events[1:]
        if f["outcome"] == "skipped":
            assert not rest, f"a skipped firing decided more: {[e.type for e in rest]}"
            if f["reason"] == "busy":
                assert self.active is not None and sc["overlap"] == "skip", "skipped busy"
            else:
                assert f["reason"] == "late" and sc["catch_up"] in ("skip", "all"), f["reason"]
            return
        assert rest, "a prompted firing with no outcome for its prompt"
        head = rest[0].payload.model_dump()
        actor = f"schedule:{f['schedule_id']}"
        if self.active is None:
            assert rest[0].type == "run.started", rest[0].type
            assert (head["prompt"], head["actor"], head["input"]) == (
                sc["text"],
                actor,
                sc["input"],
            ), "the schedule's run started with another text, actor or input"
            return
        types = [e.type for e in rest]
        if sc["overlap"] in ("reject", "skip"):
            assert types == ["command.rejected"], types
            assert head["reason"] in ("session_busy", "session_compacting"), head["reason"]
            return
        queued = [e.payload.model_dump() for e in rest if e.type == "run.queued"]
        if not queued:
            assert types == ["command.rejected"] and head["reason"] == "queue_full", types
            return
        q = queued[0]
        assert (q["text"], q["actor"], q["input"]) == (sc["text"], actor, sc["input"])
        assert q["front"] == (sc["overlap"] == "interrupt"), "interrupt queues at the front"

    def schedule_event(self, e: Event, p: dict[str, Any]) -> None:
        sid = p["schedule_id"]
        sc = self.schedules.get(sid)
        if e.type == "schedule.deleted":
            assert sc is not None, f"deleted {sid}, which is not kept"
            del self.schedules[sid]
            return
        if e.type == "schedule.fired":
            assert sc is not None
            assert e.ts >= sc["next_at"], f"{sid} fired at {e.ts}, before {sc['next_at']}"
            assert p["nominal_at"] == sc["next_nominal_at"], "fired for another time"
            nxt = p["next_nominal_at"]
            assert nxt > p["nominal_at"], "the next time is not after the one fired"
            if nxt <= e.ts:  # still behind: only catch-up `all` fires each missed time
                # (each by the overlap policy: prompted, or skipped busy)
                assert sc["catch_up"] == "all" and p["reason"] in (None, "busy")
                assert 1 <= p["caught_up"] <= sc["max_catch_up"], p["caught_up"]
            assert 0 <= p["next_at"] - nxt <= sc["jitter_ms"], "jitter out of bounds"
            sc.update(next_at=p["next_at"], next_nominal_at=nxt)
            return
        if e.type == "schedule.created":
            assert sc is None, f"created {sid}, which is kept already"
            n = self.bounds.max_schedules
            assert n is None or len(self.schedules) < n, "more schedules than the bound"
        else:
            assert sc is not None, f"updated {sid}, which is not kept"
        assert (p["cron"] is None) != (p["interval_ms"] is None), "cron or interval, one"
        assert p["next_nominal_at"] > e.ts, "a first firing not after its definition"
        assert 0 <= p["next_at"] - p["next_nominal_at"] <= p["jitter_ms"], "jitter"
        if p["input"] is not None:
            json.loads(p["input"])
        self.schedules[sid] = dict(p)

    @staticmethod
    def rounds(events: list[Event]) -> None:
        """A completion that leaves follow-ups pending keeps its round's result
        (`run.round_completed`) and delivers them right after; the run does not end."""
        types = [e.type for e in events]
        if "run.round_completed" not in types and "run.follow_up_delivered" not in types:
            return
        assert types.count("run.round_completed") == 1, f"one round result per completion: {types}"
        i = types.index("run.round_completed")
        delivered = types[i + 1 :]
        assert delivered and set(delivered) == {"run.follow_up_delivered"}, (
            f"a round's result, then only its deliveries: {types}"
        )
        assert "run.finished" not in types, "a run that goes on does not finish"

    def between_commands(self) -> None:
        run = self.active
        if run is not None:
            assert run.to_deliver in (None, []), f"inputs never handed over: {run.to_deliver}"
            run.to_deliver = None
            assert not run.to_close, f"calls of a lost holder never closed: {run.to_close}"
            assert run.steps_to_deliver in (None, []), (
                f"recorded steps never handed over: {run.steps_to_deliver}"
            )
            run.steps_to_deliver = None
            if run.status == "cancelling":
                assert run.holder is not None, "a cancelling run nobody executes would never end"
            if run.status == "compacting":
                assert run.holder is not None, "a compacting run nobody holds is stuck"
        else:
            assert not self.queue, "the session sits idle with work waiting"
        b = self.bounds
        if b.max_queue is not None:
            assert len(self.queue) <= b.max_queue, f"{len(self.queue)} tasks waiting"
        if b.max_inputs is not None and run is not None:
            assert len(run.pending) <= b.max_inputs, f"{len(run.pending)} inputs pending"
        if b.max_held_bytes is not None:
            held = sum(_size(w.text) + _size(w.input or "") for w in self.queue)
            held += sum(
                _size(sc["text"]) + _size(sc["input"] or "") for sc in self.schedules.values()
            )
            if run is not None:
                held += _size(run.prompt) + _size(run.input or "")
                held += sum(_size(t) for _k, t in run.pending.values())
            assert held <= b.max_held_bytes, f"{held} bytes of text held"

    # -- per event ------------------------------------------------------------------------------
    def event(self, e: Event) -> None:
        assert e.seq == self.last_seq.get(e.run_id, 0) + 1, f"seq gap in {e.run_id}"
        self.last_seq[e.run_id] = e.seq
        assert e.ts >= self.clock, f"{e.type} at {e.ts}: the session's clock went back"
        self.clock = e.ts
        assert e.run_id not in self.ended, f"{e.type} after {e.run_id} ended"
        assert e.run_id not in self.erased, f"{e.type} of {e.run_id}, an erased run"
        p = e.payload.model_dump()
        if e.run_id == SESSION_LOG:
            self.session_event(e, p)
        elif e.type == "run.started":
            self.start(e, p)
        else:
            run = self.active
            assert run is not None and run.run_id == e.run_id, (
                f"{e.type} for {e.run_id}, active is {run and run.run_id}"
            )
            self.run_event(run, e, p)

    def session_event(self, e: Event, p: dict[str, Any]) -> None:
        assert e.type in SESSION_LOG_TYPES, e.type
        assert e.generation == 0
        if e.type == "session.erased":
            self.erasure(e, p)
        if e.type.startswith("schedule."):
            self.schedule_event(e, p)
        if e.type == "run.queued":
            w = Waiting(
                p["source_command_id"],
                p["kind"],
                p["text"],
                p["actor"],
                p["retry_of"],
                _input_of(p),
                dict(p["metadata"] or {}),
            )
            if w.kind == "follow_up":
                assert not w.metadata, "a follow-up queued with labels"
                assert w.input is None, "a follow-up queued with a typed input"
            requeued = [r for r in self.runs.values() if w.source in r.requeued]
            if requeued:
                assert w.kind == "follow_up" and not p["front"]
                for r in requeued:
                    r.requeued.remove(w.source)
            self.queue.insert(0 if p["front"] else len(self.queue), w)
        elif e.type == "run.dequeued":
            src = p["source_command_id"]
            i = next((i for i, w in enumerate(self.queue) if w.source == src), None)
            assert i is not None, f"run.dequeued for {src}, which does not wait"
            assert p["reason"] in ("dequeued", "cleared"), p["reason"]
            del self.queue[i]
            self.removed.add(src)

    def erasure(self, e: Event, p: dict[str, Any]) -> None:
        """Refused while a run is active, so an erasure finds the session idle; it forgets
        every run, the latest checkpoint, the retry links and the schedules (everything of
        the session goes), keeps the keys counting."""
        assert self.active is None, f"session erased while run {self.active} is active"
        self.schedules.clear()
        assert not self.queue, "session erased with work waiting"
        want = "sha256:" + hashlib.sha256(e.session_id.encode()).hexdigest()
        assert p["session_hash"] == want, "the erasure names the session by another hash"
        assert p["runs_started"] == len(self.runs), "the erasure miscounts the session's runs"
        if p["trigger"] == "retention":
            assert self.idle_since is not None, "retention erased a session that was not idle"
            if self.bounds.retention_ms is not None:
                assert e.ts >= self.idle_since + self.bounds.retention_ms, (
                    f"retention erased at {e.ts}, idle since {self.idle_since}"
                )
        else:
            assert p["trigger"] == "admin", p["trigger"]
        self.erased.update(self.runs)
        self.ended.clear()
        self.checkpoint = None
        self.idle_since = None

    def start(self, e: Event, p: dict[str, Any]) -> None:
        assert self.active is None, f"run {e.run_id} started while {self.active} is active"
        assert e.seq == 1 and e.generation == 1
        if p["origin"] == "queued":
            assert self.queue, "a queued run started with nothing queued"
            first = self.queue.pop(0)
            assert first.source not in self.removed, "a removed task started"
            assert first.source == p["source_command_id"], "queued work started out of order"
            assert (first.text, first.actor, first.retry_of, first.input, first.metadata) == (
                p["prompt"],
                p["actor"],
                p["retry_of"],
                _input_of(p),
                p["metadata"] or {},
            ), "a queued run started with another task's text, actor, retry link, input or labels"
        else:
            assert not self.queue, "a new run jumped the queue"
        if p["retry_of"] is not None:
            ended = self.ended.get(p["retry_of"])
            assert ended is not None and ended[1], "a retry of a run that did not end retryable"
        if p["from_checkpoint"]:
            assert p["context_ref"] == self.checkpoint, "not started from the latest checkpoint"
        if p["origin"] in ("follow_up", "send"):
            assert p["input"] is None, f"a run started by a {p['origin']} with a typed input"
            assert not p["metadata"], f"a run started by a {p['origin']} with labels"
        assert e.run_id not in self.runs, f"run id {e.run_id} used twice (an erased key again?)"
        run = RunModel(e.run_id, "running", 1, p["timeout_at"], p["prompt"], _input_of(p))
        self.active = self.runs[e.run_id] = run
        self.idle_since = None
        self.last_run = e.run_id

    def run_event(self, run: RunModel, e: Event, p: dict[str, Any]) -> None:
        t = e.type
        lost = t in ("run.lease_released", "run.lease_expired")
        assert e.generation == run.generation + lost, f"{t}: generation {e.generation}"
        run.generation = e.generation
        if run.to_deliver and t != "run.input_delivered":
            raise AssertionError(f"{t} before the new holder got its inputs {run.to_deliver}")
        if run.steps_to_deliver and t not in ("step.delivered", "run.input_delivered"):
            raise AssertionError(f"{t} before the new holder got its steps {run.steps_to_deliver}")
        if run.to_close and t != "run.compaction_abandoned":
            kind, call_id = run.to_close.pop(0)
            assert (t, p.get("call_id")) == (CALL_FINISHED[kind], call_id), (
                f"{t} before the lost holder's open {kind} call {call_id} was closed"
            )
            assert p["detail"] == "abandoned: lease_lost" and p["worker_id"] == run.lost_holder
        elif t in CALL_STARTED and p.get("call_id") is not None:
            cap = self.bounds.max_open_calls
            if cap is None or len(run.open_calls) < cap:
                run.open_calls.append((CALL_STARTED[t], p["call_id"]))
        if t in CALL_FINISHED.values() and p.get("call_id") is not None:
            key = (next(k for k, v in CALL_FINISHED.items() if v == t), p["call_id"])
            if key in run.open_calls:
                run.open_calls.remove(key)
        if t in ("run.compaction_started", "run.cancel_acknowledged", "action.approved"):
            assert run.holder is not None, f"{t} without a holder"
        if t in RESOLVERS:
            assert not run.pending_keys(), f"{t} with approvals still pending"
            assert not run.open_questions(), f"{t} with questions still open"
        if t in ("run.lease_granted", "run.lease_renewed"):
            self.lease(run, e, p)
        elif lost:
            assert run.holder is not None, f"{t} with no holder"
            if p.get("reason") == "lease_expiry":
                assert e.ts >= run.expires_at, "lease taken before it expired"
            # what the lost holder left open ends now, as abandoned
            run.to_close, run.lost_holder = list(run.open_calls), run.holder
            run.holder = None
        elif t in MOVES:
            before, after = MOVES[t]
            assert run.status in before, f"{t} while {run.status}"
            if t == "run.compaction_abandoned":
                assert run.last in ("run.lease_released", "run.lease_expired"), (
                    "compaction abandoned without the lease being lost"
                )
            run.status = after
        elif t == "action.pending":
            self.pending(run, e, p)
        elif t in ("action.approved", "action.denied"):
            key = p["idempotency_key"]
            a = run.approvals.get(key)
            if p["reason"] == "digest_mismatch":
                # a repeat with other arguments: refused, and the key keeps its record
                assert t == "action.denied" and key in run.decided, "other arguments, no key"
            elif a is not None and a.state == "pending":
                self.resolve(run, e, p, a)
            elif a is not None and a.reason == "lease_lost" and t == "action.denied":
                # the next holder asked again: refused (not running, or the window closed)
                assert p["reason"] in ("compacting", "cancelling", "approval_expired")
                if p["reason"] == "approval_expired":
                    assert e.ts >= a.expires_at, "expired before its window closed"
                a.reason = p["reason"]
            else:
                refusal = t == "action.denied" and (
                    run.status == "cancelling" or p["reason"] == "too_many_actions"
                )
                assert refusal or key not in run.decided, "an idempotency key decided twice"
                assert (t == "action.approved") == (run.status == "running") or refusal
                if p["reason"] != "too_many_actions":
                    run.decided.add(key)
                if t == "action.approved":
                    run.approved.add(key)
        elif t == "action.decision_replayed":
            key = p["idempotency_key"]
            assert key in run.decided
            a = run.approvals.get(key)
            if p["decision"] == "pending":
                assert a is not None and a.state == "pending", "replayed a wait that is over"
                assert a.generation == e.generation
        elif t.startswith("question."):
            self.question(run, e, p)
        elif t == "action.completed":
            key = p["idempotency_key"]
            assert key in run.approved, f"action {key} completed without an approval"
            a = run.approvals.get(key)
            assert a is None or a.state == "approved", f"{key} ran without a person's approval"
        elif t in ("run.steered", "run.follow_up_queued"):
            assert run.status != "cancelling", f"{t} while cancelling"
            src = p["source_command_id"] or e.command_id
            assert src not in self.fates, "one input accepted twice"
            kind = "steer" if t == "run.steered" else "follow_up"
            run.pending[src] = (kind, p["text"])
            self.fates[src] = 0
        elif t == "run.input_delivered":
            assert run.to_deliver, "an input delivered outside a grant"
            src = run.to_deliver.pop(0)
            assert p["source_command_id"] == src, "inputs handed over out of arrival order"
            assert (p["kind"], p["text"]) == run.pending[src]
        elif t == "run.round_completed":
            assert run.status == "running", f"a round completed while {run.status}"
        elif t == "run.follow_up_delivered":
            src = p["source_command_id"]
            assert run.pending.get(src, ("", ""))[0] == "follow_up", "delivered unknown follow-up"
        elif t in FATES:
            self.fate(run, e, p)
        elif t == "run.cancel_acknowledged":
            assert run.status == "cancelling"
            run.ack_seen = True
        elif t == "step.recorded":
            self.step_recorded(run, e, p)
        elif t == "step.delivered":
            assert run.steps_to_deliver, "a step delivered outside a grant"
            step_id = run.steps_to_deliver.pop(0)
            assert p["step_id"] == step_id, "steps handed over out of record order"
            want = run.steps[step_id]
            got = {k: p[k] for k in want}
            assert got == want, f"step {step_id} handed over as {got}, recorded as {want}"
        elif t == "context.checkpointed":
            run.checkpoint = self.checkpoint = p["uri"]
        elif t == "run.finished":
            self.finish(run, e, p)
        run.last = t

    def pending(self, run: RunModel, e: Event, p: dict[str, Any]) -> None:
        """An action waits for a person: asked while running, by the holder; or asked again
        by a later holder after a lease loss, for the same thing, in the same window."""
        assert run.status == "running" and run.holder is not None, (
            f"an approval asked for while {run.status}, held by {run.holder}"
        )
        key = p["idempotency_key"]
        assert p["expires_at"] > e.ts, "a pending approval whose window is already closed"
        a = run.approvals.get(key)
        if a is None:
            assert key not in run.decided, f"{key} was decided before it waited"
            ttl = self.bounds.approval_ttl_ms
            if ttl is not None:
                assert p["expires_at"] == e.ts + ttl, "the window is not counted from now"
            run.approvals[key] = Approval(
                p["kind"], p["args_digest"], p["expires_at"], e.generation
            )
            run.decided.add(key)
            return
        assert a.state == "denied" and a.reason == "lease_lost", (
            f"{key} asked of a person again after it was {a.state} ({a.reason})"
        )
        assert e.generation > a.generation, "asked again by the generation that lost it"
        assert (p["kind"], p["args_digest"], p["expires_at"]) == (a.kind, a.digest, a.expires_at), (
            "a takeover asked for another action, or extended the person's window"
        )
        a.state, a.reason, a.generation = "pending", None, e.generation

    def question(self, run: RunModel, e: Event, p: dict[str, Any]) -> None:
        """A question's life: asked while running and held, answered once in its window by
        a person for the asking generation, or closed; a takeover re-asks, same window."""
        t, qid, b = e.type, p["question_id"], self.bounds
        q = run.questions.get(qid)
        if t == "question.asked":
            assert run.status == "running" and run.holder is not None, (
                f"a question asked while {run.status}, held by {run.holder}"
            )
            assert p["expires_at"] > e.ts, "a question whose window is already closed"
            if q is None:
                if b.question_ttl_ms is not None:
                    assert p["expires_at"] == e.ts + b.question_ttl_ms, "window not from now"
                run.questions[qid] = Question(p["expires_at"], e.generation)
            else:
                assert q.state == "closed" and q.reason == "lease_lost", (
                    f"{qid} asked again after it was {q.state} ({q.reason})"
                )
                assert e.generation > q.generation, "asked again by the generation that lost it"
                assert p["expires_at"] == q.expires_at, "a takeover extended the person's window"
                q.state, q.reason, q.generation = "open", None, e.generation
        elif t == "question.answered":
            assert q is not None and q.state == "open", f"{qid} answered while not open"
            assert e.generation == q.generation, "answered for another generation's question"
            assert e.ts < q.expires_at, "answered after its window closed"
            assert p["answered_by"] is not None, "an answer from nobody"
            json.loads(p["answer"])  # JSON text
            if b.max_answer_bytes is not None:
                assert _size(p["answer"]) <= b.max_answer_bytes, "an answer over its bound"
            q.state, q.answer, q.answered_by = "answered", p["answer"], p["answered_by"]
        elif t == "question.closed":
            reason = p["reason"]
            if q is None:
                # a new question refused: too many, or the run is not running
                assert reason == "too_many_questions" or reason == run.status, reason
                if reason != "too_many_questions":
                    run.questions[qid] = Question(e.ts, e.generation, "closed", reason=reason)
            elif q.state == "open":
                if reason == "question_expired":
                    assert e.ts >= q.expires_at, "closed as expired before its window closed"
                else:
                    # the cancel's, the loss's or the end's: checked to come first
                    assert reason in ("cancelling", "lease_lost", "run_finished"), reason
                q.state, q.reason = "closed", reason
            else:
                # the next holder re-asked a question lost with the lease: refused
                assert q.state == "closed" and q.reason == "lease_lost", (
                    f"{qid} closed again after it was {q.state} ({q.reason})"
                )
                assert reason in ("compacting", "cancelling", "question_expired"), reason
                if reason == "question_expired":
                    assert e.ts >= q.expires_at, "expired before its window closed"
                q.reason = reason
        else:  # question.replayed
            assert q is not None, f"replayed {qid}, never recorded"
            assert (p["status"], p["answer"], p["answered_by"]) == (
                q.state,
                q.answer,
                q.answered_by,
            ), f"replayed {qid} as {p['status']}, recorded {q.state}"
            if q.state == "open":
                assert q.generation == e.generation, "replayed a wait of another generation"
        if b.max_questions is not None:
            assert len(run.questions) <= b.max_questions, f"{len(run.questions)} questions"

    @staticmethod
    def resolve(run: RunModel, e: Event, p: dict[str, Any], a: Approval) -> None:
        """A pending key's one decision."""
        key = p["idempotency_key"]
        assert e.generation == a.generation, "decided for another generation's request"
        if e.type == "action.approved":
            assert run.status in ("running", "compacting"), f"approved while {run.status}"
            assert e.ts < a.expires_at, "approved after its window closed"
            a.state = "approved"
            run.approved.add(key)
            return
        reason = p["reason"]
        if reason == "denied":
            assert e.ts < a.expires_at, "a person's denial after the window closed"
        elif reason == "approval_expired":
            assert e.ts >= a.expires_at, "expired before its window closed"
        else:
            # the cancel's, the loss's or the end's: checked to come first (resolution_first)
            assert reason in ("cancelling", "lease_lost", "run_finished"), reason
        a.state, a.reason = "denied", reason

    def step_recorded(self, run: RunModel, e: Event, p: dict[str, Any]) -> None:
        """Only the holder of the current generation records, each step id once, within
        the run's bounds; the first record stands."""
        assert run.holder is not None and p["worker_id"] == run.holder, (
            f"step recorded by {p['worker_id']}, the holder is {run.holder}"
        )
        step_id = p["step_id"]
        assert step_id not in run.steps, f"step {step_id} recorded twice"
        assert p["result"] is None or p["result_ref"] is None, "a result and a pointer"
        b = self.bounds
        inline = _size(p["result"] or "") + _size(p["result_ref"] or "")
        if b.max_step_result_bytes is not None:
            assert inline <= b.max_step_result_bytes, f"{inline} bytes of result held inline"
        held_fields = ("step_id", "name", "input_digest", "result", "result_ref")
        run.steps[step_id] = {
            "kind": p["kind"],
            "name": p["name"],
            "input_digest": p["input_digest"],
            "result": p["result"],
            "result_ref": p["result_ref"],
            "generation": e.generation,
        }
        if b.max_steps is not None:
            assert len(run.steps) <= b.max_steps, f"{len(run.steps)} steps recorded"
        if b.max_run_step_bytes is not None:
            held = sum(
                _size(step.get(f) or "") if f != "step_id" else _size(sid)
                for sid, step in run.steps.items()
                for f in held_fields
            )
            assert held <= b.max_run_step_bytes, f"{held} bytes of steps held"

    def lease(self, run: RunModel, e: Event, p: dict[str, Any]) -> None:
        granted = e.type == "run.lease_granted"
        if granted:
            assert run.holder is None, f"lease granted while {run.holder} holds it"
            assert run.status != "cancelling", "lease granted while cancelling"
            # everything not consumed yet goes to the new holder, in arrival order
            run.to_deliver = list(run.pending)
            # and every recorded step, in record order, with the latest checkpoint
            run.steps_to_deliver = list(run.steps)
            assert p["steps_delivered"] == len(run.steps), "the grant miscounts the steps"
            assert p["checkpoint_ref"] == run.checkpoint, "the grant names another checkpoint"
        else:
            assert run.holder == p["worker_id"], f"renewed by {p['worker_id']}, not the holder"
        if p["lease_ms"] is not None:
            assert p["lease_expires_at"] == e.ts + p["lease_ms"], "lease not counted from now"
            cap = self.bounds.max_lease_ms
            if cap is not None:
                assert p["lease_ms"] <= cap and p["capped"] == (p["lease_ms"] == cap)
        run.holder, run.expires_at = p["worker_id"], p["lease_expires_at"]

    def fate(self, run: RunModel, e: Event, p: dict[str, Any]) -> None:
        src = p["source_command_id"]
        assert src in run.pending, f"{e.type} for {src}, which is not pending"
        assert run.pending[src][0] == p["kind"]
        self.fates[src] += 1
        if e.type == "run.input_consumed":
            assert run.status == "running", "consumed outside a completion"
        else:
            # fates at the run's end: nothing but other fates until run.finished
            if e.type == "run.input_requeued":
                assert p["kind"] == "follow_up", "only a follow-up is re-queued"
                run.requeued.append(src)
            if run.ending_as is None:
                run.ending_as = p["terminal_status"]
            assert run.ending_as == p["terminal_status"], "fates name two endings"
            run.dropped_kinds.add(p["kind"])
        del run.pending[src]

    def finish(self, run: RunModel, e: Event, p: dict[str, Any]) -> None:
        status = p["terminal_status"]
        assert not run.pending, f"run ended with inputs without a fate: {list(run.pending)}"
        assert run.ending_as in (None, status), "fates name another ending"
        if status == "completed":
            assert run.status == "running"
            assert "follow_up" not in run.dropped_kinds, "completed with a follow-up unconsumed"
        elif status == "cancelled":
            assert run.status == "cancelling"
            assert (
                run.holder is None
                or run.last == "run.cancel_acknowledged"
                or (run.last in FATES and run.ack_seen)
            ), "cancelled before the holder acknowledged or lost the lease"
        elif status == "failed":
            assert run.status != "cancelling"
        else:
            assert e.ts >= run.timeout_at, "timed out before its deadline"
            assert p["retryable"], "timed_out is retryable"
        if status in ("completed", "cancelled"):
            assert not p["retryable"]
        self.ended[run.run_id] = (status, p["retryable"])
        self.active = None
        self.idle_since = e.ts

    # -- what the stateful test asks at the end -------------------------------------------------
    def inputs_without_exactly_one_fate(self) -> list[str]:
        """Accepted inputs whose fate count is not 1 (the active run's pending ones aside)."""
        pending = set(self.active.pending) if self.active is not None else set()
        return [src for src, n in self.fates.items() if n != 1 and src not in pending]
