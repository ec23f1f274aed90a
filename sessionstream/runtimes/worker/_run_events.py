"""What one execution (`_execution.Execution` mixes this in) does with the events of its
run and of the session log: grants, fences, inputs, steps, the gate's decisions, the
answers to its questions, cancels, the run's end."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from sessionstream.runtimes.worker.context import FollowUp, Steer
from sessionstream.schemas.events import (
    SESSION_LOG,
    ActionDecision,
    ActionDecisionReplayed,
    CancelRequested,
    CommandRejected,
    Event,
    FollowUpDelivered,
    FollowUpQueued,
    InputDelivered,
    LeaseExpired,
    LeaseGranted,
    LeaseRenewed,
    RunFinished,
    StaleWriteRecorded,
    Steered,
    StepDelivered,
)
from sessionstream.schemas.questions import QuestionAnswered, QuestionClosed, QuestionReplayed

if TYPE_CHECKING:
    from sessionstream.runtimes.worker._questions import QuestionBook
    from sessionstream.runtimes.worker._steps import StepBook
    from sessionstream.runtimes.worker.context import RunContext

__all__ = ["FENCING_REASONS", "RunEvents"]

log = logging.getLogger("sessionstream.worker")

#: rejections of our own writes that mean "this generation may not write any more"
FENCING_REASONS = frozenset({"stale_generation", "not_lease_holder", "run_finished", "unknown_run"})


class RunEvents:
    """The event side of an execution: one method per source of events."""

    if TYPE_CHECKING:  # what the execution holds and does (`_execution.Execution`)
        w: Any
        run_id: str
        generation: int | None
        ctx: RunContext | None
        cancelling: bool
        checkpoint_ref: str | None
        steps: StepBook
        questions: QuestionBook
        _my_cmds: dict[str, str]
        _complete_cmd: str | None
        _round_end: asyncio.Future[str] | None
        _gate: dict[str, asyncio.Future[tuple[str, str | None]]]
        _gate_cmds: dict[str, str]
        _granted: asyncio.Future[int]
        _grant_cmd: str | None
        _early_cancel: str | None
        _cancelling_task: asyncio.Task[None] | None

        def _stop(self, reason: str, *, fenced: bool) -> None: ...
        def _fail(self, error: str, *, retryable: bool = False) -> None: ...
        def self_fence(self, why: str) -> None: ...
        def _lease_answered(self, command_id: str, lease_ms: int | None) -> None: ...
        def _take_steer(self, s: Steer) -> None: ...
        def _take_follow_up(self, f: FollowUp) -> bool: ...
        def _decide(self, key: str, decision: str, reason: str | None) -> None: ...
        async def _cancel(self, reason: str) -> None: ...

    def on_event(self, e: Event) -> None:
        if e.run_id == SESSION_LOG:
            self._on_session_log(e)
        elif e.type.startswith("question."):
            self._on_question(e)
        else:
            self._on_run_event(e)

    def _on_session_log(self, e: Event) -> None:
        if e.type == "command.rejected" and e.command_id in self._my_cmds:
            r = e.payload_as(CommandRejected)
            kind = self._my_cmds[e.command_id]
            if kind == "lease.acquire":
                self._stop(f"acquire rejected: {r.reason}", fenced=False)
            elif r.reason in FENCING_REASONS:
                log.warning("run %s: %s rejected %s", self.run_id, kind, r.reason)
                self._stop(f"{kind} rejected: {r.reason}", fenced=True)
            elif kind == "run.complete" and e.command_id == self._complete_cmd:
                # refused for what it carries (too large, invalid): nothing will answer it
                if self._round_end is not None and not self._round_end.done():
                    self._round_end.set_result("rejected")
                detail = f": {r.detail}" if r.detail else ""
                self._fail(f"run.complete rejected: {r.reason}{detail}")
            elif kind == "question.ask" and e.command_id in self.questions.commands:
                qid = self.questions.commands[e.command_id]
                self.questions.resolve(qid, ("closed", None, r.reason))
            elif kind == "action.request" and e.command_id in self._gate_cmds:
                fut = self._gate.get(self._gate_cmds[e.command_id])
                if fut is not None and not fut.done():
                    fut.set_result(("denied", r.reason))
            else:
                log.warning("run %s: %s rejected: %s", self.run_id, kind, r.reason)
        elif e.type == "action.denied":
            d = e.payload_as(ActionDecision)
            fut = self._gate.get(d.idempotency_key)
            if fut is not None and not fut.done():
                fut.set_result(("denied", d.reason))

    def _on_run_event(self, e: Event) -> None:
        t, me = e.type, self.w.worker_id
        if t == "run.lease_granted":
            g = e.payload_as(LeaseGranted)
            owner = g.worker_id
            if owner == me and not self._granted.done():
                self._lease_answered(e.command_id, g.lease_ms)
                self.checkpoint_ref = g.checkpoint_ref
                self._grant_cmd = e.command_id
                self.steps.expect(g.steps_delivered)
                self._granted.set_result(e.generation)
            elif owner != me and self.generation is None:
                self._stop(f"lease granted to {owner}", fenced=False)
        elif t == "run.lease_expired" and e.payload_as(LeaseExpired).worker_id == me:
            # the same stop as our own lease count would make, with its note in the trail
            self.self_fence(f"lease expired (generation now {e.generation})")
        elif t == "run.stale_write_recorded":
            sw = e.payload_as(StaleWriteRecorded)
            if sw.worker_id == me and sw.stale_generation == self.generation:
                self._stop(f"stale generation {sw.stale_generation}", fenced=True)
        elif t == "run.steered":
            st = e.payload_as(Steered)
            self._take_steer(Steer(st.text, st.source_command_id or e.command_id))
        elif t == "run.follow_up_queued":
            fq = e.payload_as(FollowUpQueued)
            self._take_follow_up(FollowUp(fq.text, fq.source_command_id))
        elif t == "run.input_delivered":
            # what earlier holders never consumed, handed to us right after our grant
            given = e.payload_as(InputDelivered)
            if given.kind == "steer":
                self._take_steer(Steer(given.text, given.source_command_id))
            else:
                self._take_follow_up(FollowUp(given.text, given.source_command_id))
        elif t == "step.delivered" and e.command_id == self._grant_cmd:
            # recorded by an earlier holder, handed over with our grant: ours to return
            # instead of calling again
            self.steps.deliver(e.payload_as(StepDelivered))
        elif t == "run.follow_up_delivered":
            p = e.payload_as(FollowUpDelivered)
            f = FollowUp(p.text, p.source_command_id)
            if not self._take_follow_up(f):
                return
            assert self.ctx is not None
            if (
                e.command_id == self._complete_cmd
                and p.source_command_id not in self.ctx.consumed_follow_ups
                and self._round_end is not None
                and not self._round_end.done()
            ):
                self._round_end.set_result("follow_ups")
        elif t in ("action.approved", "action.denied"):  # action.pending: a person decides
            d = e.payload_as(ActionDecision)
            why = f"{d.reason} by {d.decided_by}" if d.decided_by else d.reason
            self._decide(d.idempotency_key, t.removeprefix("action."), why)
        elif t == "action.decision_replayed":
            r = e.payload_as(ActionDecisionReplayed)
            self._decide(r.idempotency_key, r.decision, "replayed")
        elif t == "run.lease_renewed" and e.payload_as(LeaseRenewed).worker_id == me:
            self._lease_answered(e.command_id, e.payload_as(LeaseRenewed).lease_ms)
        elif t == "run.cancel_requested" and not self.cancelling:
            reason = e.payload_as(CancelRequested).reason
            if self.ctx is None:
                self._early_cancel = reason  # acknowledged as soon as the context exists
            else:
                self.cancelling = True
                self._cancelling_task = asyncio.create_task(self._cancel(reason))
        elif t == "run.finished":
            status = e.payload_as(RunFinished).terminal_status
            if self._round_end is not None and not self._round_end.done():
                self._round_end.set_result("finished")
            self._stop(f"run finished: {status}", fenced=False)

    def _on_question(self, e: Event) -> None:
        """A question's fate: the answer, its closing, or its record replayed to our re-ask
        (`open`: still waiting for the person)."""
        if e.type == "question.answered":
            a = e.payload_as(QuestionAnswered)
            self.questions.resolve(a.question_id, ("answered", a.answer, a.answered_by))
        elif e.type == "question.closed":
            c = e.payload_as(QuestionClosed)
            self.questions.resolve(c.question_id, ("closed", None, c.reason))
        elif e.type == "question.replayed":
            r = e.payload_as(QuestionReplayed)
            if r.status == "answered":
                self.questions.resolve(r.question_id, ("answered", r.answer, r.answered_by))
            elif r.status == "closed":
                self.questions.resolve(r.question_id, ("closed", None, r.reason))
