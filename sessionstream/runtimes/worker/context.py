"""What an agent author writes against: `async def run(ctx: RunContext) -> str | None`.

Every write the context makes (progress, action requests and results, compaction) is
stamped by the runtime with the run id, this worker's id and the lease's generation. A
cancel reaches, in order: the model call (its task is cancelled), the tools (their abort
signal is set), the sub-tasks (cancelled), and new actions (refused locally).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from pydantic import ValidationError

from sessionstream.runtimes.worker._approval import ActionDenied, args_digest
from sessionstream.runtimes.worker._model_call import ModelCall
from sessionstream.runtimes.worker._questions import QuestionClosed, check_answer, schema_of
from sessionstream.runtimes.worker._signal import AbortSignal, RunCancelled, RunFenced
from sessionstream.runtimes.worker._steps import StepBook
from sessionstream.runtimes.worker.chat import (
    Message,
    Tool,
    ToolCall,
    invalid_arguments_text,
    tool_result_text,
)
from sessionstream.runtimes.worker.executor import ActionExecutor, ActionFn, ActionTarget
from sessionstream.runtimes.worker.model import Completion, Model

__all__ = [
    "ActionDenied",
    "CancelReport",
    "FollowUp",
    "ModelCall",
    "QuestionClosed",
    "RunContext",
    "RunIO",
    "Steer",
]

T = TypeVar("T")


class RunIO(Protocol):
    """The runtime side of a context: stamped writes and the gate."""

    def send(self, type_: str, payload: dict[str, Any]) -> str: ...

    async def ask_gate(
        self, kind: str, key: str, detail: str | None, digest: str | None = None
    ) -> tuple[str, str | None]:
        """(decision, reason) — "approved" or "denied", once a person decided if needed."""
        ...

    async def ask_question(
        self, question_id: str, question: str, schema: Any = None
    ) -> tuple[str, str | None, str | None]:
        """("answered", answer JSON, who) or ("closed", None, reason), once a person
        answered or the question closed."""
        ...

    def lease_valid(self) -> bool:
        """This worker's lease surely still holds (no action may start once it has not)."""
        ...

    def delta(self, call_id: str, text: str) -> None:
        """A piece of model call `call_id`'s answer as it streams ("": the call ended); a
        view, published outside the log, dropped once this holder may not write any more."""
        ...


@dataclass(frozen=True)
class FollowUp:
    text: str
    command_id: str


@dataclass(frozen=True)
class Steer:
    text: str
    command_id: str


@dataclass
class CancelReport:
    """What a cancel reached; becomes the `cancel.ack` payload."""

    model_request_aborted: bool = False
    tools_aborted: list[str] = field(default_factory=list)
    subtasks_cancelled: list[str] = field(default_factory=list)
    actions_blocked: list[str] = field(default_factory=list)
    #: approved actions already executing when the cancel came (they are not interrupted)
    actions_executing: list[str] = field(default_factory=list)


class RunContext:
    """The run as its handler sees it."""

    def __init__(
        self,
        *,
        session_id: str,
        run_id: str,
        generation: int,
        worker_id: str,
        prompt: str,
        context_ref: str | None,
        model: Model,
        io: RunIO,
        executor: ActionExecutor | None,
        steps: StepBook | None = None,
        tenant_id: str = "",
        actor: str | None = None,
        input: Any = None,
    ) -> None:
        self.session_id = session_id
        #: the tenant the session belongs to (`tenant:own-id` session ids name it too)
        self.tenant_id = tenant_id
        #: who asked for the run: the starting command's actor (None when it named none)
        self.actor = actor
        self.run_id = run_id
        self.generation = generation
        self.worker_id = worker_id
        self.prompt = prompt
        self.input = input  #: the prompt's typed input, as parsed JSON (None: it had none)
        self.context_ref = context_ref
        self.default_model = model
        #: 0 on the first call of the handler; +1 each time follow-ups re-open the run
        self.round = 0
        self._io = io
        self._executor = executor
        #: the run's recorded steps (durable model and tool calls), across rounds
        self.steps = steps if steps is not None else StepBook(io.send, run_id)
        self._ids = itertools.count(1)
        self._questions_asked = 0
        self._steers: list[Steer] = []
        self._follow_ups: list[FollowUp] = []
        self.consumed_follow_ups: list[str] = []
        #: steers the handler took (`steering()`); `run.complete` reports them consumed
        self.consumed_steers: list[str] = []
        self._models: dict[str, AbortSignal] = {}
        self._tools: dict[str, tuple[str, AbortSignal]] = {}
        self._subtasks: dict[str, asyncio.Task[Any]] = {}
        self._report = CancelReport()
        self.abort_reason: str | None = None
        #: idempotency keys of approved actions executing now
        self.executing_actions: set[str] = set()

    @property
    def database(self) -> str | None:
        """Conninfo of the worker's database (its schema on the search path) for tools that
        query it, e.g. `sql_tool.run_query(ctx.database, ...)`; None when it has none."""
        return self._executor.conninfo if self._executor is not None else None

    # -- messages delivered to the run ----------
    def steering(self) -> list[str]:
        """Steering texts delivered since the last call (check before each step); taking
        them consumes them."""
        out, self._steers = self._steers, []
        self.consumed_steers += [s.command_id for s in out]
        return [s.text for s in out]

    def follow_ups(self) -> list[FollowUp]:
        """Follow-ups delivered to this run and not yet taken; taking them consumes them."""
        out, self._follow_ups = self._follow_ups, []
        self.consumed_follow_ups += [f.command_id for f in out]
        return out

    def _deliver_steer(self, s: Steer) -> None:
        if s.command_id not in self.consumed_steers and s not in self._steers:
            self._steers.append(s)

    def _deliver_follow_up(self, f: FollowUp) -> None:
        if f.command_id not in self.consumed_follow_ups and f not in self._follow_ups:
            self._follow_ups.append(f)

    # -- model, tools, sub-tasks ------------------------------------------------------------------
    @property
    def aborted(self) -> bool:
        return self.abort_reason is not None

    def _check(self) -> None:
        if self.abort_reason is not None:
            raise RunCancelled(self.abort_reason)

    def _progress(
        self,
        kind: str,
        name: str | None,
        call_id: str,
        detail: str | None,
        usage: dict[str, Any] | None = None,
    ) -> None:
        payload = {"kind": kind, "name": name, "callId": call_id, "detail": detail}
        self._io.send("run.progress", {**payload, **(usage or {})})

    @contextlib.asynccontextmanager
    async def model(
        self, model: Model | None = None, *, detail: str | None = None, step: str | None = None
    ) -> AsyncIterator[ModelCall]:
        """A model request: model.request.started/finished around it; aborted on cancel.
        A durable step (`step`, or `model-N` by call order in the round): a recorded one
        returns its reply from `complete` and nothing is called or reported."""
        self._check()
        m = model or self.default_model
        step_id = self.steps.model_step(step)
        signal = AbortSignal()
        started: list[str] = []
        key = f"{step_id}#{next(self._ids)}"  # a step name may be given to two blocks

        def on_call(call_id: str) -> None:
            if not started:  # one started/finished pair per block, as before
                started.append(call_id)
                # only a request really made is one a cancel aborts (and reports)
                self._models[key] = signal
                self._progress(
                    "model.request.started", m.name, call_id, (detail or "")[:500] or None
                )

        def on_delta(text: str) -> None:
            if started and not signal.aborted:
                self._io.delta(started[0], text)

        call = ModelCall(
            m, signal, step_id=step_id, book=self.steps, on_call=on_call, on_delta=on_delta
        )
        outcome = "ok"
        try:
            yield call
        except BaseException as e:
            outcome = f"aborted: {signal.reason}" if signal.aborted else f"error: {e!r}"[:200]
            raise
        finally:
            self._models.pop(key, None)
            if started:
                self._io.delta(started[0], "")  # its last pieces go out before it ends
                self._progress(
                    "model.request.finished", m.name, started[0], outcome, usage=call.usage
                )
        if not signal.aborted:
            for sid, prompt, reply in call.answered:
                await self.steps.record(sid, "model", m.name, prompt, reply)

    async def call_tool(
        self,
        name: str,
        fn: Callable[[AbortSignal, str], Awaitable[T]],
        input: Any = None,
        *,
        step: str | None = None,
    ) -> T:
        """A tool call as a durable step (`step`, or `tool:NAME-N` by call order): a
        recorded one returns its recorded result without calling `fn`; otherwise
        `fn(signal, idempotency_id)` runs inside `tool(name)` and its JSON result is
        recorded. `idempotency_id` (`{runId}/{stepId}`) is the same on every attempt."""
        step_id, rec = self.steps.lookup(
            self.steps.tool_step(name, step), self.steps.digest(input)[1]
        )
        if rec is not None:
            self._check()
            value: T = await self.steps.value(rec)
            return value
        async with self.tool(name, step_id) as signal:
            value = await fn(signal, self.steps.idempotency_id(step_id))
            aborted = signal.aborted
        if not aborted:
            await self.steps.record(step_id, "tool", name, input, value)
        return value

    async def call_tools(
        self, reply: Completion | Sequence[ToolCall], tools: Sequence[Tool]
    ) -> list[Message]:
        """Run the tool calls a chat reply asks for, in order, each a durable step
        (`call_tool`, named by call order), and return their results as tool messages to
        append to the conversation. A call of an unknown tool or with arguments that do not
        fit the tool's schema is answered with an error message instead, so the model can
        call again; an error the tool raises goes to the handler, as with `call_tool`."""
        calls = reply.tool_calls if isinstance(reply, Completion) else tuple(reply)
        by_name = {t.name: t for t in tools}
        messages: list[Message] = []
        for call in calls:
            t = by_name.get(call.name)
            if t is None:
                known = ", ".join(sorted(by_name)) or "none"
                content = json.dumps({"error": f"no tool {call.name!r} (tools: {known})"})
                messages.append(Message.tool(call, content))
                continue
            try:
                args = call.args()
                t.validate(args)
            except (ValueError, ValidationError) as e:
                messages.append(Message.tool(call, invalid_arguments_text(call, e)))
                continue

            async def run(
                signal: AbortSignal, idempotency_id: str, t: Tool = t, args: Any = args
            ) -> Any:
                return await t(args, signal, idempotency_id)

            value = await self.call_tool(call.name, run, input=args)
            messages.append(Message.tool(call, tool_result_text(value)))
        return messages

    @contextlib.asynccontextmanager
    async def tool(self, name: str, call_id: str | None = None) -> AsyncIterator[AbortSignal]:
        """A tool call: tool.started/finished around it; the tool gets the abort signal."""
        self._check()
        call_id = call_id or f"t{next(self._ids)}"
        signal = AbortSignal()
        self._tools[call_id] = (name, signal)
        self._progress("tool.started", name, call_id, None)
        outcome = "ok"
        try:
            yield signal
            if signal.aborted:
                outcome = f"aborted: {signal.reason}"
        except BaseException as e:
            outcome = f"aborted: {signal.reason}" if signal.aborted else f"error: {e!r}"[:200]
            raise
        finally:
            del self._tools[call_id]
            self._progress("tool.finished", name, call_id, outcome)

    def subtask(self, coro: Coroutine[Any, Any, T], name: str | None = None) -> asyncio.Task[T]:
        """Run `coro` alongside; it is cancelled with the run."""
        self._check()
        sub_id = name or f"s{next(self._ids)}"
        task = asyncio.ensure_future(coro)
        self._subtasks[sub_id] = task
        self._progress("subtask.started", sub_id, sub_id, None)

        def done(t: asyncio.Task[T]) -> None:
            self._subtasks.pop(sub_id, None)
            if self.aborted:
                state = f"aborted: {self.abort_reason}"
            elif t.cancelled():
                state = "cancelled"
            elif t.exception() is not None:
                state = f"error: {t.exception()!r}"[:200]
            else:
                state = "ok"
            # every sub-task ends with an event, a cancelled one with why
            self._progress("subtask.finished", sub_id, sub_id, state)

        task.add_done_callback(done)
        return task

    # -- external actions ----------
    async def action(
        self,
        kind: str,
        idempotency_key: str,
        fn: ActionFn,
        *,
        detail: str | None = None,
        transactional: bool = True,
        arguments: Any = None,
    ) -> str | None:
        """Ask the gate; only after approval (a person's, for kinds that need one: waits,
        the lease renewing) run `fn` once per key. `arguments` (JSON) give `argsDigest`."""
        if self.aborted:
            self._report.actions_blocked.append(idempotency_key)
            raise RunCancelled(self.abort_reason or "aborted")
        digest = None if arguments is None else args_digest(arguments)
        decision, reason = await self._io.ask_gate(kind, idempotency_key, detail, digest)
        if decision != "approved" and reason == "cancelling":  # released by the cancel
            self._report.actions_blocked.append(idempotency_key)
            raise RunCancelled(self.abort_reason or "cancelling")
        if decision != "approved":
            self._report.actions_blocked.append(idempotency_key)
            raise ActionDenied(idempotency_key, reason)
        if self.aborted:  # cancel arrived after the approval: refuse locally
            self._report.actions_blocked.append(idempotency_key)
            raise RunCancelled(self.abort_reason or "aborted")
        if not self._io.lease_valid():
            # approved, but our lease may have passed meanwhile (a frozen process): another
            # worker may hold the run now, so this one never acts
            self._report.actions_blocked.append(idempotency_key)
            raise RunFenced(f"lease passed before action {idempotency_key!r} could run")
        if self._executor is None:
            raise RuntimeError("no action executor configured (database_url)")
        target = ActionTarget(self.session_id, self.run_id, self.generation, self.worker_id)
        self.executing_actions.add(idempotency_key)
        try:
            ok, result = await self._executor.execute(
                target, kind, idempotency_key, fn, transactional=transactional
            )
        finally:
            self.executing_actions.discard(idempotency_key)
        self._io.send(
            "action.result", {"idempotencyKey": idempotency_key, "ok": ok, "result": result}
        )
        return result

    # -- questions to a person ----------
    async def ask_user(
        self, question: str, schema: Any = None, *, question_id: str | None = None
    ) -> Any:
        """Ask a person and wait for the answer (the lease renewing meanwhile); returns it,
        parsed. `schema`: a Python type (the answer is validated and converted by pydantic,
        its JSON schema shown to the person), a JSON-schema dict (`type` and `enum`
        checked) or None (any JSON). `question_id` defaults to `question-{n}`, n counting
        this context's questions: a handler re-run by the next holder asks the same ids in
        the same order and gets the recorded answers back, never asking twice. Raises
        RunCancelled at once on a cancel, QuestionClosed if the question closes unanswered
        (expired, too many, or an answer that does not fit `schema`)."""
        self._check()
        self._questions_asked += 1
        qid = question_id or f"question-{self._questions_asked}"
        sent, adapter = schema_of(schema)
        status, answer, why = await self._io.ask_question(qid, question, sent)
        if self.aborted or (status == "closed" and why == "cancelling"):
            raise RunCancelled(self.abort_reason or "cancelling")
        if status != "answered" or answer is None:
            raise QuestionClosed(qid, why)
        return check_answer(qid, answer, sent, adapter)

    # -- compaction ----------
    async def compact(
        self, checkpoint: str | Callable[[], Awaitable[str]], tokens: int | None = None
    ) -> str:
        """compact.start, produce the checkpoint (a pointer), compact.finish with its URI."""
        self._check()
        self._io.send("compact.start", {})
        uri = checkpoint if isinstance(checkpoint, str) else await checkpoint()
        self._io.send("compact.finish", {"checkpointUri": uri, "tokens": tokens})
        return uri

    # -- called by the runtime ----------
    def _abort(self, reason: str) -> CancelReport:
        """Reach everything running, in the protocol's order; idempotent."""
        if self.abort_reason is None:
            self.abort_reason = reason
        r = self._report
        for signal in self._models.values():
            if not signal.aborted:
                signal.abort(reason)
                r.model_request_aborted = True
        for call_id, (name, signal) in self._tools.items():
            if not signal.aborted:
                signal.abort(reason)
                r.tools_aborted.append(f"{name}:{call_id}")
        for sub_id, task in list(self._subtasks.items()):
            if not task.done():
                task.cancel()
                r.subtasks_cancelled.append(sub_id)
        return r
