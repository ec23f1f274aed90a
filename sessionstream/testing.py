"""Test an agent without the stack: `AgentHarness` runs a handler the way a worker runs it,
against the real decider, in memory — no Kafka, no PostgreSQL, well under a second.

    from sessionstream.agent import RunContext
    from sessionstream.testing import AgentHarness

    async def run(ctx: RunContext) -> str:
        async with ctx.model(step="answer") as m:
            return await m.complete(ctx.prompt)

    async def test_my_agent() -> None:
        async with AgentHarness(run) as h:
            outcome = await h.run("find the invoices")
            assert outcome.status == "completed"

What is real: the decider (every command, the producer's and the worker's, is decided by
`sessionstream.core.decider` with duplicate detection and timers on the harness's clock),
the worker's execution of the run (lease, heartbeats, steers, follow-ups, cancels, durable
steps, the action gate) and the log it writes. What is not: the transport (commands are
decided one at a time, in the order they are sent) and the action store (in memory, with
the same idempotency keys and generation fences as PostgreSQL's).

Script the unlucky cases: `steer`, `follow_up`, `abort` while the handler runs;
`crash_worker()` stops the holder as kill -9 would and lets its lease expire, so another
worker takes the run over (generation + 1) and resumes from the steps recorded so far.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from sessionstream.core.decider import DEFAULT_CONFIG, DeciderConfig, decide
from sessionstream.core.open_runs import open_run
from sessionstream.core.state import SessionState, command_hash
from sessionstream.core.timers import due_timers, timer_command
from sessionstream.errors import SessionstreamError
from sessionstream.runtimes.worker._deltas import DeltaKey
from sessionstream.runtimes.worker._execution import Execution, RunSpec
from sessionstream.runtimes.worker._handler import check_handler
from sessionstream.runtimes.worker._signal import RunFenced
from sessionstream.runtimes.worker._steps import StepStore
from sessionstream.runtimes.worker.executor import ActionExecutor, ActionFn, ActionRun, ActionTarget
from sessionstream.runtimes.worker.model import FakeModel, Model
from sessionstream.schemas._json import jsonable
from sessionstream.schemas.commands import Command, CommandClass, command_class
from sessionstream.schemas.events import SESSION_LOG, Event, RunFinished

__all__ = ["AgentHarness", "HarnessError", "InMemoryActions", "RunOutcome"]

log = logging.getLogger("sessionstream.testing")


class HarnessError(SessionstreamError):
    """What the harness was asked for did not happen in time (the message says what)."""


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended, and everything its log holds."""

    run_id: str
    #: `completed`, `cancelled`, `failed` or `timed_out`
    status: str
    result: str | None
    error: str | None
    #: the run's events, in log order
    events: list[Event]

    @property
    def generations(self) -> int:
        """How many holders were granted the run (2 after one takeover)."""
        return len({e.generation for e in self.events if e.type == "run.lease_granted"})

    def types(self) -> list[str]:
        return [e.type for e in self.events]


@dataclass
class _Claim:
    kind: str
    generation: int
    status: str = "executing"
    result: str | None = None


class InMemoryActions(ActionExecutor):
    """The action store in memory, with PostgreSQL's rules: an idempotency key acts once
    (a second ask gets the recorded outcome), and a generation older than the run's fence
    is refused (`RunFenced`). `runs` counts how often each key's effect ran."""

    def __init__(self) -> None:
        super().__init__("memory://")
        self.fences: dict[str, int] = {}
        self.claims: dict[str, _Claim] = {}
        self.runs: dict[str, int] = {}

    @property
    def conninfo(self) -> str:
        return ""

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def _fence(self, run_id: str, generation: int) -> None:
        current = max(self.fences.get(run_id, generation), generation)
        self.fences[run_id] = current
        if current > generation:
            raise RunFenced(
                f"generation {generation} is fenced: generation {current} holds run {run_id}"
            )

    async def raise_fence(self, run_id: str, generation: int) -> None:
        self._fence(run_id, generation)

    async def execute(
        self, target: ActionTarget, kind: str, key: str, fn: ActionFn, *, transactional: bool
    ) -> tuple[bool, str | None]:
        self._fence(target.run_id, target.generation)
        claim = self.claims.get(key)
        if claim is not None:
            return claim.status == "done", claim.result
        claim = self.claims[key] = _Claim(kind, target.generation)
        self.runs[key] = self.runs.get(key, 0) + 1
        run = ActionRun(key, kind, target.session_id, target.run_id, target.generation, None)
        try:
            result = await fn(run)
        except Exception as e:
            claim.status, claim.result = "failed", repr(e)[:1000]
            return False, claim.result
        claim.status, claim.result = "done", result
        return True, result


class _Worker:
    """The worker process an execution runs in (`Host`); a crashed one sends nothing more."""

    def __init__(self, harness: AgentHarness, worker_id: str) -> None:
        self.harness = harness
        self.worker_id = worker_id
        self.lease_ms = harness.lease_ms
        self.max_payload_bytes = harness.config.max_payload_bytes
        self.acquire_timeout_s = 5.0
        self.cancel_grace_s = 0.5
        self.model = harness.model
        self.executor: ActionExecutor | None = harness.actions
        self.step_store: StepStore | None = None
        self.handler = harness.handler
        self.alive = True

    @property
    def control(self) -> _Worker:
        return self

    async def watch(self, partition: int) -> None:
        return None

    def produce(self, cmd: Command) -> None:
        if self.alive:
            self.harness._send(cmd, "worker")

    def delta(self, key: DeltaKey, text: str) -> None:
        if self.alive and text:  # "": the call ended
            self.harness.deltas.append((key, text))

    def forget(self, ex: Execution) -> None:
        self.harness._forget(ex)


class AgentHarness:
    """One session with one agent, in memory. Use it as an async context manager (or call
    `close()`); every wait is bounded and raises `HarnessError` saying what did not come."""

    def __init__(
        self,
        handler: Any,
        *,
        model: Model | None = None,
        session_id: str = "session-1",
        tenant_id: str = "tenant-1",
        actor: str = "user:test",
        lease_ms: int = 30_000,
        config: DeciderConfig = DEFAULT_CONFIG,
        timeout_s: float = 10.0,
    ) -> None:
        self.handler = check_handler(handler)
        self.model: Model = model if model is not None else FakeModel(latency_s=0.0)
        self.session_id, self.tenant_id, self.actor = session_id, tenant_id, actor
        self.lease_ms = lease_ms
        self.config = config
        self.timeout_s = timeout_s
        self.actions = InMemoryActions()
        #: the session's log, every event in order
        self.log: list[Event] = []
        #: the token deltas the runs' streaming model calls published, in order (a model
        #: that takes `on_delta`; the default FakeModel does)
        self.deltas: list[tuple[DeltaKey, str]] = []
        self.state: SessionState | None = None
        self._dedup: dict[tuple[str, int], tuple[int, int]] = {}
        self._fired: set[str] = set()
        #: crashed workers: a lease one of them holds (or is granted late) ends at once
        self._dead: set[str] = set()
        self._queue: asyncio.Queue[tuple[Command, CommandClass]] = asyncio.Queue()
        self._clock = 0
        self._skew_ms = 0
        self._worker_ids = itertools.count(1)
        self._worker = _Worker(self, f"worker-{next(self._worker_ids)}")
        self._executions: dict[str, tuple[Execution, asyncio.Task[None]]] = {}
        self._changed = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None
        self._closing = False

    async def __aenter__(self) -> AgentHarness:
        self._start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop the executions (as a shutdown would) and the harness's loop."""
        for _, task in list(self._executions.values()):
            task.cancel()
        for _, task in list(self._executions.values()):
            await asyncio.gather(task, return_exceptions=True)
        self._executions.clear()
        if self._loop is not None:
            self._closing = True
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)
            self._loop = None

    # -- the producer's side ----------
    async def prompt(self, text: str, *, input: Any = None, **payload: Any) -> str:
        """Send a prompt; returns its command id. `input`: its typed input, any JSON value
        or a pydantic model (as `SessionClient.prompt` takes it); `payload`: the prompt's
        other fields (`policy`, `contextRef`, `timeoutMs`, ...)."""
        if input is not None:
            payload["input"] = jsonable(input)
        return self._produce("prompt", {"text": text, **payload})

    async def steer(self, text: str, run_id: str | None = None) -> str:
        return self._produce("steer", {"text": text}, run_id=run_id or self._active())

    async def follow_up(self, text: str, run_id: str | None = None, **payload: Any) -> str:
        return self._produce(
            "follow_up", {"text": text, **payload}, run_id=run_id or self._active()
        )

    async def abort(self, reason: str = "user", run_id: str | None = None) -> str:
        return self._produce("abort", {"reason": reason}, run_id=run_id or self._active())

    async def approve(
        self,
        key: str,
        args_digest: str | None,
        *,
        run_id: str | None = None,
        generation: int | None = None,
    ) -> str:
        """A person (the harness's `actor`) approves a pending action of the active run."""
        payload = {"idempotencyKey": key, "argsDigest": args_digest, "generation": generation}
        return self._produce("action.approve", payload, run_id=run_id or self._active())

    async def deny(
        self,
        key: str,
        args_digest: str | None,
        *,
        reason: str | None = None,
        run_id: str | None = None,
    ) -> str:
        """A person denies a pending action of the active run."""
        payload = {"idempotencyKey": key, "argsDigest": args_digest, "reason": reason}
        return self._produce("action.deny", payload, run_id=run_id or self._active())

    async def answer(
        self,
        question_id: str,
        answer: Any,
        *,
        run_id: str | None = None,
        generation: int | None = None,
    ) -> str:
        """A person (the harness's `actor`) answers an open question (`ctx.ask_user`) of the
        active run; `answer` is any JSON value."""
        payload = {"questionId": question_id, "answer": answer, "generation": generation}
        return self._produce("question.answer", payload, run_id=run_id or self._active())

    async def run(self, text: str, *, input: Any = None, **payload: Any) -> RunOutcome:
        """Prompt (with its typed `input`, if any) and wait for the run it starts to end."""
        cid = await self.prompt(text, input=input, **payload)
        return await self.finished(await self.run_of(cid))

    # -- the worker's side ----------
    async def crash_worker(self) -> None:
        """The holder stops as kill -9 would stop it (its handler, its heartbeats, its
        commands: nothing more is sent), its lease runs out on the harness's clock, and a
        new worker takes the run over from the steps it recorded."""
        dead = self._worker
        dead.alive = False
        self._dead.add(dead.worker_id)
        self._worker = _Worker(self, f"worker-{next(self._worker_ids)}")
        for run_id, (ex, task) in list(self._executions.items()):
            if ex.w is cast(Any, dead):
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                self._executions.pop(run_id, None)
        self._changed.set()

    # -- reading ----------
    def types(self) -> list[str]:
        """The log's event types, in order."""
        return [e.type for e in self.log]

    def events_of(self, command_id: str) -> list[Event]:
        """What the decider wrote for one command (a rejection, or what it applied)."""
        return [e for e in self.log if e.command_id == command_id]

    async def until(self, what: Callable[[], bool], description: str) -> None:
        """Wait until `what()` holds (checked after every decision)."""
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        while not what():
            if self._loop is not None and self._loop.done() and not self._loop.cancelled():
                raise HarnessError(f"the harness stopped: {self._loop.exception()!r}")
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                tail = ", ".join(self.types()[-8:]) or "nothing"
                raise HarnessError(
                    f"not within {self.timeout_s:g} s: {description} (the log's last events: "
                    f"{tail})"
                )
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 0.05))

    async def until_event(self, type_: str, count: int = 1) -> Event:
        """Wait for the `count`-th event of `type_`, and return it."""
        await self.until(lambda: self.types().count(type_) >= count, f"{count} x {type_}")
        return [e for e in self.log if e.type == type_][count - 1]

    async def run_of(self, prompt_id: str) -> str:
        """The run a prompt started (waiting for it to start, if it was queued)."""

        def started() -> Event | None:
            for e in self.log:
                if e.type == "run.started" and e.command_id == prompt_id:
                    return e
                if e.command_id == prompt_id and e.type == "command.rejected":
                    raise HarnessError(f"prompt {prompt_id} was rejected: {e.payload}")
            return None

        await self.until(lambda: started() is not None, f"the run of prompt {prompt_id}")
        found = started()
        assert found is not None
        return found.run_id

    async def finished(self, run_id: str | None = None) -> RunOutcome:
        """Wait for a run (default: the active one) to end; its outcome and events."""
        run_id = run_id or self._active()

        def end() -> Event | None:
            return next(
                (e for e in self.log if e.run_id == run_id and e.type == "run.finished"), None
            )

        await self.until(lambda: end() is not None, f"run {run_id} finished")
        e = end()
        assert e is not None
        f = e.payload_as(RunFinished)
        events = [x for x in self.log if x.run_id == run_id]
        return RunOutcome(run_id, f.terminal_status, f.result, f.error, events)

    # -- the processor's side ----------
    def _start(self) -> None:
        if self._loop is None:
            self._closing = False
            self._loop = asyncio.get_running_loop().create_task(self._decide_loop())

    def _active(self) -> str:
        run = self.state.active if self.state is not None else None
        if run is None:
            raise HarnessError("no active run in the session")
        return run.run_id

    def _produce(self, type_: str, payload: dict[str, Any], run_id: str | None = None) -> str:
        cmd = Command(
            command_id=str(uuid.uuid4()),
            session_id=self.session_id,
            tenant_id=self.tenant_id,
            type=type_,
            ts=int(time.time() * 1000),
            run_id=run_id,
            actor=self.actor,
            payload=payload,
        )
        self._send(cmd, command_class(cmd.type))
        return cmd.command_id

    def _send(self, cmd: Command, via: CommandClass) -> None:
        self._start()
        self._queue.put_nowait((cmd, via))

    def _now(self) -> int:
        # the log's clock: the broker's append time, never going back
        self._clock = max(self._clock + 1, int(time.time() * 1000) + self._skew_ms)
        return self._clock

    async def _decide_loop(self) -> None:
        # `close` says so before it cancels: on Python 3.11 `asyncio.wait_for` swallows a
        # cancel that comes as the command does (its get, a task of its own, is also what
        # gives the executions a turn between two decisions)
        while not self._closing:
            try:
                cmd, via = await asyncio.wait_for(self._queue.get(), 0.01)
            except TimeoutError:
                pass
            else:
                self._decide(cmd, via)
            self._fire_due()
            self._hand_out()

    def _decide(self, cmd: Command, via: CommandClass) -> None:
        key = (cmd.session_id, command_hash(cmd.command_id, cmd.tenant_id))
        d = decide(self.state, cmd, self.config, at=self._now(), seen=self._dedup.get(key), via=via)
        if d.remember is not None:
            self._dedup[key] = (d.remember, d.state.clock)
        self.state = d.state
        self.log.extend(d.events)
        for e in d.events:
            for ex, _ in list(self._executions.values()):
                if ex.w.worker_id in self._dead:
                    continue  # a crashed worker reads nothing more (its task is ending)
                if e.run_id == ex.run_id or e.run_id == SESSION_LOG:
                    try:
                        ex.on_event(e)
                    except Exception:
                        # the worker's feed logs and goes on; so does the harness
                        log.exception("run %s: event %s not taken", ex.run_id, e.type)
        self._changed.set()

    def _fire_due(self) -> None:
        if self.state is None:
            return
        run = self.state.active
        if run is not None and run.lease_owner in self._dead and run.lease_expires_at:
            # a dead holder's lease: its end, and the expiry timer, come now on the log's
            # clock (a real processor would wait the lease out)
            self._skew_ms += max(0, run.lease_expires_at - self._now()) + 1
        now = self._now()
        for timer in due_timers(self.state):
            cmd = timer_command(self.state, timer, now)
            if timer.due_at <= now and cmd.command_id not in self._fired:
                self._fired.add(cmd.command_id)
                self._decide(cmd, "timer")

    def _hand_out(self) -> None:
        """A run that needs a holder goes to the live worker, as `session.open-runs` does."""
        o = open_run(self.state)
        if o is None or o.run_id in self._executions:
            return
        spec = RunSpec(
            o.session_id, o.tenant_id, o.run_id, 0, o.prompt, o.context_ref, o.actor, o.input
        )
        ex = Execution(self._worker, spec)
        self._executions[o.run_id] = (ex, asyncio.get_running_loop().create_task(ex.main()))

    def _forget(self, ex: Execution) -> None:
        held = self._executions.get(ex.run_id)
        if held is not None and held[0] is ex:
            del self._executions[ex.run_id]
        self._changed.set()
