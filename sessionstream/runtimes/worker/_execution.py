"""One run on one worker: acquire, execute rounds, heartbeat, cancel, fence, finish.

Self-fencing: the lease is counted on this worker's monotonic clock from the moment the
command that earned it (the acquire, then each renew the processor answered) was sent, a
conservative bound of the processor's own count. Once it has passed, or is about to, with no
renewal answered, the run stops its model call, tools, sub-tasks and actions by itself,
says why (`lease.release` with its generation: applied if nobody took the run yet, recorded
as a stale write if someone did) and never starts an approved action after that point.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from sessionstream.adapters import metrics
from sessionstream.runtimes.worker._deltas import DeltaKey
from sessionstream.runtimes.worker._handler import (
    Handler,
    InputRefused,
    ResultRefused,
    RunResult,
    call_handler,
    first_error,
    result_text,
    storable,
)
from sessionstream.runtimes.worker._questions import QuestionBook
from sessionstream.runtimes.worker._run_events import RunEvents
from sessionstream.runtimes.worker._signal import RunAborted, RunFenced
from sessionstream.runtimes.worker._steps import StepBook, StepStore
from sessionstream.runtimes.worker.context import FollowUp, RunContext, Steer
from sessionstream.runtimes.worker.executor import ActionExecutor
from sessionstream.runtimes.worker.model import Model
from sessionstream.schemas.commands import Command

__all__ = ["Execution", "Host", "RunSpec"]

log = logging.getLogger("sessionstream.worker")

#: how long a cancel waits for approved actions already executing (the processor's cancel
#: grace is 30 s: the acknowledgement must come well before it)
ACTION_DRAIN_S = 20.0

#: a lease this close to its end with no renewal answered is given up (fraction of it)
SELF_FENCE_MARGIN = 0.1


class Host(Protocol):
    """What an execution needs from the worker process that runs it."""

    worker_id: str
    lease_ms: int
    #: the processor's limit on a command's payload (as JSON): a larger one is rejected
    max_payload_bytes: int
    acquire_timeout_s: float
    cancel_grace_s: float
    model: Model
    executor: ActionExecutor | None
    #: object storage for step results over the inline bound (None: such steps stay local)
    step_store: StepStore | None
    handler: Handler

    @property
    def control(self) -> Any: ...

    def produce(self, cmd: Command) -> None: ...

    def delta(self, key: DeltaKey, text: str) -> None: ...  # a token delta (a view)

    def forget(self, ex: Execution) -> None: ...


@dataclass(frozen=True)
class RunSpec:
    session_id: str
    tenant_id: str
    run_id: str
    partition: int
    prompt: str
    context_ref: str | None
    actor: str | None = None
    #: the prompt's typed input, its compact JSON text (None: none)
    input_json: str | None = None


class Execution(RunEvents):
    """Implements RunIO for the run's context; receives the run's events from the worker
    (`RunEvents`)."""

    def __init__(self, worker: Host, spec: RunSpec) -> None:
        self.w = worker
        self.spec = spec
        self.run_id = spec.run_id
        self.generation: int | None = None
        self.ctx: RunContext | None = None
        self.done = asyncio.Event()
        self.fenced: str | None = None
        self.cancelling = False
        self._my_cmds: dict[str, str] = {}  # command id -> type
        self._granted: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._gate: dict[str, asyncio.Future[tuple[str, str | None]]] = {}
        self._gate_cmds: dict[str, str] = {}  # action.request command id -> its key
        #: questions to a person the handler waits on (`ctx.ask_user`)
        self.questions = QuestionBook()
        self._handler: asyncio.Task[RunResult] | None = None
        self._complete_cmd: str | None = None
        self._round_end: asyncio.Future[str] | None = None
        self._early_steers: list[Steer] = []
        self._cancelling_task: asyncio.Task[None] | None = None
        self._early_follow_ups: list[FollowUp] = []
        #: a cancel seen before the context existed (it came with the grant)
        self._early_cancel: str | None = None
        #: monotonic time until which our lease certainly holds (None: no lease yet)
        self.lease_until: float | None = None
        #: the lease the processor grants (what was asked, or its cap)
        self.granted_ms = worker.lease_ms
        self._sent_at: dict[str, float] = {}  # lease command id -> monotonic send time
        #: the run's recorded steps; filled by the grant's `step.delivered` and our records
        self.steps = StepBook(
            self.send,
            spec.run_id,
            store=worker.step_store,
            max_payload_bytes=worker.max_payload_bytes,
        )
        #: the run's latest checkpoint, as our grant named it
        self.checkpoint_ref: str | None = None
        self._grant_cmd: str | None = None  # the acquire whose events granted us the run

    # -- RunIO ------------------------------------------------------------------------------------
    def send(self, type_: str, payload: dict[str, Any]) -> str:
        """Produce a worker command stamped with our generation; dropped once fenced."""
        if self.fenced is not None or self.done.is_set():
            return ""
        s = self.spec
        cmd = Command(
            command_id=str(uuid.uuid4()),
            session_id=s.session_id,
            tenant_id=s.tenant_id,
            type=type_,
            ts=int(time.time() * 1000),
            run_id=s.run_id,
            worker_id=self.w.worker_id,
            generation=self.generation,
            payload=payload,
        )
        self._my_cmds[cmd.command_id] = type_
        if type_ in ("lease.acquire", "lease.renew"):
            self._sent_at[cmd.command_id] = time.monotonic()
        self.w.produce(cmd)
        return cmd.command_id

    def delta(self, call_id: str, text: str) -> None:
        """A piece of a streaming answer ("": the call ended); a view: never fails the run,
        dropped once fenced (a stale holder's view would mislead) or done."""
        if self.fenced is None and not self.done.is_set():
            s, g = self.spec, self.generation
            key = DeltaKey(s.session_id, s.tenant_id, s.run_id, g, call_id, s.partition)
            with contextlib.suppress(Exception):
                self.w.delta(key, text)

    def lease_valid(self) -> bool:
        """Our lease surely still holds (counted from when its command was sent)."""
        return self.lease_until is not None and time.monotonic() < self.lease_until

    def _lease_answered(self, command_id: str, lease_ms: int | None) -> None:
        sent = self._sent_at.pop(command_id, None)
        if lease_ms is not None:
            self.granted_ms = lease_ms
        if sent is not None:
            ms = lease_ms if lease_ms is not None else self.w.lease_ms
            self.lease_until = max(self.lease_until or 0.0, sent + ms / 1000)

    async def ask_gate(
        self, kind: str, key: str, detail: str | None, digest: str | None = None
    ) -> tuple[str, str | None]:
        fut = self._gate.get(key)
        if fut is None or fut.done():
            fut = asyncio.get_running_loop().create_future()
            self._gate[key] = fut
            ask = {"idempotencyKey": key, "kind": kind, "detail": detail, "argsDigest": digest}
            cid = self.send("action.request", ask)
            self._gate_cmds[cid] = key
        return await fut

    async def ask_question(
        self, question_id: str, question: str, schema: Any = None
    ) -> tuple[str, str | None, str | None]:
        """Ask a person (once per id while waiting); (status, answer JSON, by or reason)."""
        fut, new = self.questions.wait(question_id)
        if new:
            ask: dict[str, Any] = {"questionId": question_id, "question": question}
            if schema is not None:
                ask["schema"] = schema
            cid = self.send("question.ask", ask)
            if cid:
                self.questions.commands[cid] = question_id
            else:  # fenced or done: nothing will answer
                self.questions.resolve(question_id, ("closed", None, self.fenced or "stopped"))
        return await fut

    # -- lifecycle ----------
    async def main(self) -> None:
        try:
            await self._main()
        except Exception as e:
            # a failure outside what the handler's own errors take (those fail the run in
            # `_rounds`): if the lease is ours the run fails here, once, saying why. Left to
            # its lease it would be taken again, fail the same way, and again, until its
            # deadline
            log.exception("run %s: execution failed", self.run_id)
            if self.generation is not None:
                try:
                    # retryable: the handler did not fail, the worker around it did
                    self._fail(f"the worker failed executing the run: {e!r}", retryable=True)
                except Exception:
                    log.exception("run %s: its run.fail was not sent", self.run_id)
        finally:
            self._finish_local()

    async def _main(self) -> None:
        await self.w.control.watch(self.spec.partition)
        self.send("lease.acquire", {"leaseMs": self.w.lease_ms})
        try:
            # not `asyncio.wait_for`: on Python 3.11 it returns the grant when the grant
            # and a cancel (a shutdown, a crash) come in the same turn of the loop, and
            # the handler would then run in a worker that was told to stop
            async with asyncio.timeout(self.w.acquire_timeout_s):
                self.generation = await self._granted
        except (TimeoutError, RunAborted) as e:
            # a TimeoutError says nothing of itself: the log line must
            why = str(e) or f"no answer to lease.acquire within {self.w.acquire_timeout_s:g} s"
            log.info("run %s: not acquired (%s)", self.run_id, why)
            return
        if self.done.is_set():
            return  # stopped (fenced: the lease expired) before the grant was taken in
        log.info(
            "run %s: lease granted to %s, generation %s",
            self.run_id,
            self.w.worker_id,
            self.generation,
        )
        s = self.spec
        try:
            # the grant's transaction hands over the recorded steps right after it: the
            # handler starts once it has them all, so no recorded step is called again
            async with asyncio.timeout(self.w.acquire_timeout_s):
                await self.steps.all_delivered.wait()
        except TimeoutError:
            log.warning(
                "run %s: %s of %s recorded steps arrived; the rest run again",
                self.run_id,
                self.steps.delivered,
                self.steps.expected,
            )
        if self.w.executor is not None:
            # the fencing token: from now on no older generation's action commits
            try:
                await self.w.executor.raise_fence(s.run_id, self.generation)
            except RunFenced as e:
                self.self_fence(str(e))
                return
        ctx = RunContext(
            session_id=s.session_id,
            tenant_id=s.tenant_id,
            actor=s.actor,
            run_id=s.run_id,
            generation=self.generation,
            worker_id=self.w.worker_id,
            prompt=s.prompt,
            input=None if s.input_json is None else json.loads(s.input_json),
            # a new holder starts from the run's latest checkpoint, if it has one
            context_ref=self.checkpoint_ref or s.context_ref,
            model=self.w.model,
            io=self,
            executor=self.w.executor,
            steps=self.steps,
        )
        for steer in self._early_steers:
            ctx._deliver_steer(steer)
        for f in self._early_follow_ups:
            ctx._deliver_follow_up(f)
        self.ctx = ctx
        heartbeat = asyncio.create_task(self._heartbeat())
        try:
            if self._early_cancel is not None:
                # the cancel came with the grant: nothing ran, acknowledge at once
                self.cancelling = True
                await self._cancel(self._early_cancel)
            else:
                await self._rounds(ctx)
            await self.done.wait()
        finally:
            heartbeat.cancel()

    async def _rounds(self, ctx: RunContext) -> None:
        while not self.done.is_set():
            self.steps.begin_round()
            # the follow-ups this round is called for: its completion consumes them, taken
            # or not (else a handler that never takes follow-ups is called for them forever)
            called_for = [f.command_id for f in ctx._follow_ups] if ctx.round else []
            # inside the handler's task, so that whatever calling it raises (a call that
            # returns no awaitable) is the handler's failure, not the execution's; the input
            # is validated there first, before anything the handler would do
            call = call_handler(self.w.handler, ctx, self.spec.input_json)
            self._handler = asyncio.create_task(call)
            try:
                returned = await self._handler
            except (asyncio.CancelledError, RunAborted) as e:
                if ctx.aborted or self.cancelling or self.done.is_set():
                    return  # cancel / fence / finish paths own the rest
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # this execution itself is being cancelled
                if isinstance(e, RunFenced):
                    # the handler met a fence we had not seen (an action refused by a newer
                    # generation's token): the run is no longer ours to fail
                    self.self_fence(f"the handler was fenced: {e.reason}")
                else:
                    # nothing stopped the run, yet the handler says it was: a run left like
                    # this would hold its lease, renewed, until its deadline
                    self._fail(f"the handler raised {e!r}, but the run was not cancelled")
                return
            except InputRefused as e:  # the handler was not called
                if not ctx.aborted and not self.cancelling:
                    self._fail(str(e))
                return
            except Exception as e:
                if not ctx.aborted and not self.cancelling:
                    log.warning("run %s: handler failed", self.run_id, exc_info=e)
                    self._fail(repr(e))
                return
            if ctx.aborted or self.cancelling:
                return
            try:
                result = result_text(returned)
            except ResultRefused as e:
                self._fail(f"the result cannot be recorded: {e}")
                return
            ctx._follow_ups = [f for f in ctx._follow_ups if f.command_id not in called_for]
            ctx.consumed_follow_ups += [c for c in called_for if c not in ctx.consumed_follow_ups]
            complete = {
                "result": result,
                "consumedFollowUps": list(ctx.consumed_follow_ups),
                "consumedSteers": list(ctx.consumed_steers),
            }
            size = len(json.dumps(complete, separators=(",", ":"), ensure_ascii=False).encode())
            if size > self.w.max_payload_bytes:
                # the processor would refuse it: the run fails now, saying why, rather than
                # wait for an answer to a completion that can never be recorded
                self._fail(
                    f"the result is too large to record: {size} bytes as JSON > "
                    f"{self.w.max_payload_bytes} (SESSIONSTREAM_MAX_PAYLOAD_BYTES)"
                )
                return
            self._round_end = asyncio.get_running_loop().create_future()
            try:
                self._complete_cmd = self.send("run.complete", complete)
            except ValidationError as e:  # e.g. a NUL character in the result
                self._fail(f"the result cannot be recorded: {first_error(e)}")
                return
            metrics.WORKER_RUNS.labels("completed").inc()
            if await self._round_end != "follow_ups":
                return
            ctx.round += 1
            log.info("run %s: follow-ups delivered, round %s", self.run_id, ctx.round)

    def _fail(self, error: str, *, retryable: bool = False) -> None:
        log.warning("run %s: failed: %s", self.run_id, error)
        self.send("run.fail", {"error": storable(error)[:2000], "retryable": retryable})
        metrics.WORKER_RUNS.labels("failed").inc()

    async def _heartbeat(self) -> None:
        """Renew every third of the lease; give the run up before an unanswered lease ends."""
        interval = self.granted_ms / 3000
        margin = self.granted_ms / 1000 * SELF_FENCE_MARGIN
        next_renew = time.monotonic() + interval
        while not self.done.is_set():
            now = time.monotonic()
            if self.lease_until is not None and now >= self.lease_until - margin:
                self.self_fence(f"lease not renewed in time ({self.granted_ms} ms)")
                return
            if now >= next_renew:
                self.send("lease.renew", {"leaseMs": self.granted_ms})
                next_renew = now + interval
            wake = min(next_renew, (self.lease_until or next_renew) - margin)
            await asyncio.sleep(max(0.01, min(wake - time.monotonic(), interval)))

    def self_fence(self, why: str) -> None:
        """Our lease may be gone: stop everything here, and tell the processor so (a
        release with our generation; stale, and recorded, if another worker holds it)."""
        if self.done.is_set():
            return
        log.warning("run %s: self-fenced at generation %s: %s", self.run_id, self.generation, why)
        metrics.WORKER_SELF_FENCES.inc()
        if self.generation is not None:
            # a release names the generation it gives up; before the grant was taken in
            # there is none to give up (the processor ends that lease on its own clock)
            self.send("lease.release", {})
        self._stop(f"self-fenced: {why}", fenced=True)

    async def _cancel(self, reason: str) -> None:
        """Model, tools, sub-tasks, actions — then acknowledge."""
        ctx = self.ctx
        assert ctx is not None
        started = time.monotonic()
        report = ctx._abort(reason)
        # a question waits for nobody once the run is cancelled (its question.closed is
        # on its way too): the handler unwinds now, not at the person's leisure
        self.questions.close_all("cancelling")
        # approved actions already executing finish (or not) on their own: say which
        report.actions_executing = sorted(ctx.executing_actions)
        task = self._handler
        if task is not None and not task.done():
            # let the handler unwind (tools report tool.finished), then force it; but never
            # in the middle of an approved action: its effect commits (or not) whole first
            await asyncio.wait({task}, timeout=self.w.cancel_grace_s)
            drain_until = time.monotonic() + ACTION_DRAIN_S
            while not task.done() and ctx.executing_actions and time.monotonic() < drain_until:
                await asyncio.wait({task}, timeout=0.05)
            if not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=1.0)
        for key, fut in self._gate.items():
            if not fut.done():
                fut.set_result(("denied", "cancelling"))
                report.actions_blocked.append(key)
        if self._round_end is not None and not self._round_end.done():
            self._round_end.set_result("cancelled")
        self.send(
            "cancel.ack",
            {
                "modelRequestAborted": report.model_request_aborted,
                "toolsAborted": report.tools_aborted,
                "subtasksCancelled": report.subtasks_cancelled,
                "actionsBlocked": sorted(set(report.actions_blocked)),
                "actionsExecuting": sorted(set(report.actions_executing)),
            },
        )
        metrics.WORKER_CANCEL_SECONDS.observe(time.monotonic() - started)
        metrics.WORKER_RUNS.labels("cancelled").inc()
        log.info("run %s: cancel acknowledged %s", self.run_id, report)

    def _stop(self, reason: str, *, fenced: bool) -> None:
        """Stop locally without further writes (fenced, or finished elsewhere)."""
        if self.done.is_set():
            return
        if fenced:
            self.fenced = reason
        metrics.WORKER_RUNS.labels("fenced" if fenced else "stopped").inc()
        log.info("run %s: stopped locally: %s", self.run_id, reason)
        if not self._granted.done():
            self._granted.set_exception(RunAborted(reason))
        if self.ctx is not None:
            self.ctx._abort(reason)
        if self._handler is not None and not self._handler.done():
            self._handler.cancel()
        for fut in self._gate.values():
            if not fut.done():
                fut.set_result(("denied", reason))
        self.questions.close_all(reason)
        if self._round_end is not None and not self._round_end.done():
            self._round_end.set_result("stopped")
        self.done.set()

    def _finish_local(self) -> None:
        self.done.set()
        if self._handler is not None and not self._handler.done():
            self._handler.cancel()
        self.w.forget(self)

    def release(self, reason: str) -> None:
        """Give the run up on shutdown: another worker may acquire it at once."""
        if self.generation is None or self.done.is_set():
            return
        if self.cancelling:
            return
        self.send("lease.release", {})
        self._stop(reason, fenced=False)

    # -- events (the rest in `RunEvents`) ----------
    def _take_steer(self, s: Steer) -> None:
        if self.ctx is not None:
            self.ctx._deliver_steer(s)
        elif s not in self._early_steers:
            self._early_steers.append(s)

    def _take_follow_up(self, f: FollowUp) -> bool:
        """Hand `f` to the context (True), or keep it for the context to come (False)."""
        if self.ctx is not None:
            self.ctx._deliver_follow_up(f)
            return True
        if f not in self._early_follow_ups:
            self._early_follow_ups.append(f)
        return False

    def _decide(self, key: str, decision: str, reason: str | None) -> None:
        fut = self._gate.get(key)  # still pending (replayed): keep waiting for the person
        if fut is not None and not fut.done() and decision != "pending":
            fut.set_result((decision, reason))
