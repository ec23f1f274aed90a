"""One run's execution on a worker, driven event by event (no Kafka: the host records the
commands the execution sends, the test hands it the events the processor would write)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from sessionstream.runtimes.worker._execution import Execution, RunSpec
from sessionstream.runtimes.worker.context import RunContext
from sessionstream.runtimes.worker.model import FakeModel
from sessionstream.schemas.commands import Command
from sessionstream.schemas.events import SESSION_LOG, Event

SPEC = RunSpec("s-1", "acme", "r-1", 0, "do it", None)


class Host:
    def __init__(self, handler: Any, lease_ms: int = 3000) -> None:
        self.worker_id = "w1"
        self.lease_ms = lease_ms
        self.max_payload_bytes = 256 * 1024
        self.acquire_timeout_s = 5.0
        self.cancel_grace_s = 0.5
        self.model = FakeModel()
        self.executor = None
        self.step_store = None
        self.handler = handler
        self.sent: list[Command] = []
        self.deltas: list[tuple[Any, str]] = []
        self.control = self
        self.forgotten = False

    async def watch(self, partition: int) -> None:
        return None

    def produce(self, cmd: Command) -> None:
        self.sent.append(cmd)

    def delta(self, key: Any, text: str) -> None:
        self.deltas.append((key, text))

    def forget(self, ex: Execution) -> None:
        self.forgotten = True

    def types(self) -> list[str]:
        return [c.type for c in self.sent]


def event(
    type_: str, payload: dict[str, Any], *, generation: int = 1, command_id: str = "x"
) -> Event:
    return Event(
        session_id="s-1",
        run_id="r-1",
        seq=1,
        type=type_,
        payload=payload,
        generation=generation,
        command_id=command_id,
        ts=1,
        tenant_id="acme",
    )


class LoopLag:
    """How late the event loop wakes a 10 ms sleep, at worst, while `watch` runs."""

    def __init__(self) -> None:
        self.worst = 0.0

    async def watch(self) -> None:
        while True:
            t = time.monotonic()
            await asyncio.sleep(0.01)
            self.worst = max(self.worst, time.monotonic() - t - 0.01)


async def until(cond: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def grant(host: Host, lease_ms: int = 3000) -> Event:
    acquire = next(c for c in host.sent if c.type == "lease.acquire")
    return event(
        "run.lease_granted",
        {"worker_id": "w1", "lease_expires_at": 10, "lease_ms": lease_ms},
        command_id=acquire.command_id,
    )


async def _granted_not_taken_in() -> tuple[Host, Execution, asyncio.Task[None], asyncio.Event]:
    """An execution whose grant was handed to it in this turn of the event loop: it has
    not taken it in (its generation is not known yet). `started` is set if the handler
    is ever called."""
    started = asyncio.Event()

    async def handler(ctx: RunContext) -> str:
        started.set()
        return "ran"

    host = Host(handler)
    ex = Execution(host, SPEC)
    task = asyncio.create_task(ex.main())
    await until(lambda: "lease.acquire" in host.types())
    ex.on_event(grant(host))
    return host, ex, task, started


async def test_a_cancel_that_comes_with_the_grant_is_acknowledged_at_once() -> None:
    # the processor decided the grant and the user's abort in one batch: both arrive
    # before the execution had a chance to build its context
    host, ex, task, started = await _granted_not_taken_in()
    ex.on_event(event("run.cancel_requested", {"reason": "user", "cancel_deadline_at": 99}))
    await until(lambda: "cancel.ack" in host.types(), timeout=2.0)
    assert not started.is_set(), "the handler must not start for a cancelled run"
    ex.on_event(event("run.finished", {"terminal_status": "cancelled"}))
    await asyncio.wait_for(task, 5)


async def test_a_worker_stopped_as_its_grant_arrives_runs_nothing() -> None:
    """A shutdown (or a crash in the harness) cancels the execution in the same turn of
    the event loop as the grant arrives: the execution ends cancelled and the handler never
    starts (Python 3.11's `asyncio.wait_for` returned the grant and ran on)."""
    host, ex, task, started = await _granted_not_taken_in()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert ex._handler is None, "a cancelled execution must not make the handler's task"
    assert not started.is_set()
    assert host.types() == ["lease.acquire"]


async def test_a_lease_expired_before_the_grant_was_taken_in_stops_without_a_release() -> None:
    """The grant and the lease's expiry reach the execution before it took the grant in:
    it stops, fenced, sends no `lease.release` (a release names a generation; the
    processor ends the lease itself) and never calls the handler."""
    host, ex, task, started = await _granted_not_taken_in()
    ex.on_event(
        event("run.lease_expired", {"worker_id": "w1", "reason": "lease_expiry"}, generation=2)
    )
    await asyncio.wait_for(task, 5)
    assert ex.fenced is not None and "lease expired" in ex.fenced
    assert not started.is_set()
    assert host.types() == ["lease.acquire"]


async def test_an_unanswered_lease_fences_the_run_before_it_ends() -> None:
    signals: list[Any] = []

    async def handler(ctx: RunContext) -> str:
        async with ctx.tool("search") as signal:
            signals.append(signal)
            await signal.wait()
        return "stopped"

    host = Host(handler, lease_ms=600)
    ex = Execution(host, SPEC)
    # when the worker gave up, against the lease it held (both on the monotonic clock the
    # execution uses), and whether the tool was aborted by then
    fenced_at: list[tuple[float, float, bool]] = []
    fence = ex.self_fence

    def recording_fence(why: str) -> None:
        now = time.monotonic()
        fence(why)
        assert ex.lease_until is not None
        fenced_at.append((now, ex.lease_until, bool(signals) and signals[0].aborted))

    ex.self_fence = recording_fence  # type: ignore[method-assign]
    lag = LoopLag()
    probe = asyncio.create_task(lag.watch())
    task = asyncio.create_task(ex.main())
    await until(lambda: "lease.acquire" in host.types())
    ex.on_event(grant(host, lease_ms=600))
    # no renewal is ever answered (the processor cannot be reached)
    await until(lambda: bool(fenced_at), timeout=5)
    probe.cancel()
    now, lease_until, aborted = fenced_at[0]
    assert aborted, "the running tool is aborted when the worker gives the run up"
    # the heartbeat aims at the lease's end minus a margin; a loaded machine may wake it
    # late, by as much as the event loop was late anywhere (measured alongside)
    assert now < lease_until + lag.worst, (
        f"gave up {now - lease_until:.3f}s after its lease ended "
        f"(the loop was at most {lag.worst:.3f}s late)"
    )
    assert ex.fenced is not None and "self-fenced" in ex.fenced
    assert host.types()[-1] == "lease.release", "the worker says why it stopped"
    await asyncio.wait_for(task, 5)
    assert host.forgotten


@pytest.mark.parametrize("answered", [True, False])
async def test_no_action_starts_once_the_lease_may_have_passed(answered: bool) -> None:
    ran: list[str] = []

    async def handler(ctx: RunContext) -> str:
        from sessionstream.runtimes.worker._signal import RunFenced

        await asyncio.sleep(0.35)  # past a 300 ms lease, when nothing renewed it
        try:
            await ctx.action("email", "k-1", lambda a: _record(ran))
        except RunFenced:
            ran.append("fenced")
        return "ok"

    host = Host(handler, lease_ms=300 if not answered else 30_000)
    ex = Execution(host, SPEC)
    task = asyncio.create_task(ex.main())
    await until(lambda: "lease.acquire" in host.types())
    ex.on_event(grant(host, lease_ms=300 if not answered else 30_000))
    if answered:
        await until(lambda: "action.request" in host.types())
        req = next(c for c in host.sent if c.type == "action.request")
        ex.on_event(
            event(
                "action.approved",
                {"idempotency_key": "k-1", "kind": "email"},
                command_id=req.command_id,
            )
        )
        # a valid lease lets it through to the executor (none is configured: it fails there)
        await until(lambda: "run.fail" in host.types())
        assert "no action executor" in str(host.sent[-1].payload)
    else:
        # the lease ran out unanswered during the sleep: the run stopped before it could
        # even ask for the action
        await until(lambda: ex.done.is_set(), timeout=3)
        assert "action.request" not in host.types() and "run.fail" not in host.types()
    assert "email" not in ran
    ex._stop("test over", fenced=False)
    await asyncio.wait_for(task, 5)


async def _record(ran: list[str]) -> str:
    ran.append("email")
    return "sent"


async def test_a_model_call_whose_caller_is_cancelled_takes_the_request_with_it() -> None:
    from sessionstream.runtimes.worker._signal import AbortSignal
    from sessionstream.runtimes.worker.context import ModelCall

    seen: list[str] = []

    class Slow:
        async def complete(self, prompt: str, *, signal: AbortSignal) -> str:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                seen.append("request cancelled")
                raise
            return "late"

    loop = asyncio.get_running_loop()
    unretrieved: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: unretrieved.append(ctx))
    try:
        call = asyncio.create_task(ModelCall(Slow(), AbortSignal()).complete("hi"))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await until(lambda: bool(seen))
        assert seen == ["request cancelled"]
    finally:
        loop.set_exception_handler(None)
    assert not unretrieved, unretrieved


# -- what the processor refuses for its content must not leave the run waiting ------------------
def _rejected(cmd: Command, reason: str, detail: str | None = None) -> Event:
    return Event(
        session_id="s-1",
        run_id=SESSION_LOG,
        seq=1,
        type="command.rejected",
        payload={"reason": reason, "command_type": cmd.type, "detail": detail},
        generation=1,
        command_id=cmd.command_id,
        ts=1,
        tenant_id="acme",
    )


async def _granted(host: Host) -> tuple[Execution, asyncio.Task[None]]:
    ex = Execution(host, SPEC)
    task = asyncio.create_task(ex.main())
    await until(lambda: "lease.acquire" in host.types())
    ex.on_event(grant(host, lease_ms=30_000))
    return ex, task


async def test_a_result_over_the_payload_limit_fails_the_run_at_once_saying_why() -> None:
    async def handler(ctx: RunContext) -> str:
        return "x" * 300_000

    host = Host(handler)
    ex, task = await _granted(host)
    await until(lambda: "run.fail" in host.types())
    assert "run.complete" not in host.types()
    error = str(host.sent[-1].payload.model_dump()["error"])
    assert "too large" in error and "262144" in error, error
    ex.on_event(event("run.finished", {"terminal_status": "failed"}))
    await asyncio.wait_for(task, 5)


async def test_a_completion_the_processor_refuses_fails_the_run_rather_than_wait() -> None:
    """The processor's limit may be lower than the worker's own (another configuration),
    or it refuses the completion for another reason that is no fencing: no event would
    ever answer it, and the run used to wait for its deadline (10 min by default)."""

    async def handler(ctx: RunContext) -> str:
        return "a result"

    host = Host(handler)
    ex, task = await _granted(host)
    await until(lambda: "run.complete" in host.types())
    complete = host.sent[-1]
    ex.on_event(_rejected(complete, "payload_too_large", "300000 bytes > 1000"))
    await until(lambda: "run.fail" in host.types())
    error = str(host.sent[-1].payload.model_dump()["error"])
    assert error == "run.complete rejected: payload_too_large: 300000 bytes > 1000"
    ex.on_event(event("run.finished", {"terminal_status": "failed"}))
    await asyncio.wait_for(task, 5)
    assert ex.fenced is None


async def test_an_action_request_the_processor_refuses_is_a_denial_with_its_reason() -> None:
    decided: list[object] = []

    async def handler(ctx: RunContext) -> str:
        from sessionstream.runtimes.worker.context import ActionDenied

        try:
            await ctx.action("email", "k-1", lambda a: _record([]), detail="d" * 10)
        except ActionDenied as e:
            decided.append(str(e))
        return "went on"

    host = Host(handler)
    ex, task = await _granted(host)
    await until(lambda: "action.request" in host.types())
    ex.on_event(_rejected(host.sent[-1], "payload_too_large"))
    await until(lambda: "run.complete" in host.types())
    assert decided and "payload_too_large" in str(decided[0])
    ex.on_event(event("run.finished", {"terminal_status": "completed"}))
    await asyncio.wait_for(task, 5)


async def test_a_result_no_command_may_carry_fails_the_run_saying_why() -> None:
    async def handler(ctx: RunContext) -> str:
        return "a\x00b"  # PostgreSQL stores no NUL: the processor would dead-letter it

    host = Host(handler)
    ex, task = await _granted(host)
    await until(lambda: "run.fail" in host.types())
    assert "run.complete" not in host.types()
    error = str(host.sent[-1].payload.model_dump()["error"])
    assert error.startswith("the result cannot be recorded") and "NUL" in error, error
    ex.on_event(event("run.finished", {"terminal_status": "failed"}))
    await asyncio.wait_for(task, 5)


# -- every way a handler can go wrong ends the run once, saying why ----------------------------
async def _ended(host: Host, ex: Execution, task: asyncio.Task[None], status: str) -> None:
    """The processor's answer to the worker's last word; the execution then ends."""
    ex.on_event(event("run.finished", {"terminal_status": status}))
    await asyncio.wait_for(task, 5)
    assert host.forgotten


def _error(host: Host) -> str:
    fails = [c for c in host.sent if c.type == "run.fail"]
    assert len(fails) == 1, host.types()
    return str(fails[0].payload.model_dump()["error"])


async def test_a_plain_def_handler_that_slips_past_the_worker_fails_the_run_once() -> None:
    """`Worker` refuses a plain `def` (test_handler_contract); one that reaches an
    execution anyway (a callable that returns no awaitable) fails its run, once, saying
    what to write. It used to escape the execution: a traceback in the log, no `run.fail`,
    the lease left to expire and the run taken again and again until its deadline."""

    def handler(ctx: RunContext) -> str:
        return "done, synchronously"

    host = Host(handler)
    ex, task = await _granted(host)
    await until(lambda: "run.fail" in host.types())
    error = _error(host)
    assert "not an awaitable" in error and "async def" in error, error
    assert "run.complete" not in host.types() and "lease.release" not in host.types()
    assert not task.done(), "the execution waits for the run's end, renewing its lease"
    await _ended(host, ex, task, "failed")


async def test_a_plain_def_handler_that_raises_fails_the_run_with_its_error() -> None:
    def handler(ctx: RunContext) -> str:
        raise ValueError("bad prompt")

    host = Host(handler)
    ex, task = await _granted(host)
    await until(lambda: "run.fail" in host.types())
    assert _error(host) == "ValueError('bad prompt')"
    await _ended(host, ex, task, "failed")


@pytest.mark.parametrize("raised", ["run_cancelled", "cancelled_error"])
async def test_a_handler_that_says_cancelled_when_nothing_cancelled_the_run_fails_it(
    raised: str,
) -> None:
    """Nothing asked the run to stop: left as it was, the run held its lease (renewed)
    with no handler running, until its deadline."""
    from sessionstream.runtimes.worker._signal import RunCancelled

    async def handler(ctx: RunContext) -> str:
        if raised == "run_cancelled":
            raise RunCancelled("gave up")
        raise asyncio.CancelledError

    host = Host(handler)
    ex, task = await _granted(host)
    await until(lambda: "run.fail" in host.types())
    assert "but the run was not cancelled" in _error(host)
    await _ended(host, ex, task, "failed")


async def test_a_fence_the_handler_meets_first_gives_the_run_up_without_failing_it() -> None:
    """An action refused by a newer generation's token (RunFenced) means another worker
    holds the run: this one says so with a release of its generation, and does not fail a
    run that is no longer its own."""
    from sessionstream.runtimes.worker._signal import RunFenced

    async def handler(ctx: RunContext) -> str:
        raise RunFenced("generation 1 is fenced: generation 2 holds run r-1")

    host = Host(handler)
    ex, task = await _granted(host)
    await asyncio.wait_for(task, 5)
    assert "run.fail" not in host.types()
    assert host.types()[-1] == "lease.release"
    assert ex.fenced is not None and "generation 2 holds" in ex.fenced


async def test_an_error_of_the_worker_after_the_handler_returned_fails_the_run_once() -> None:
    """Not the handler's fault: the command that records its result cannot be produced.
    The run fails once, retryable, rather than be left to its lease."""

    class Refusing(Host):
        def produce(self, cmd: Command) -> None:
            if cmd.type == "run.complete":
                raise RuntimeError("cannot encode this command")
            super().produce(cmd)

    async def handler(ctx: RunContext) -> str:
        return "fine"

    host = Refusing(handler)
    _, task = await _granted(host)
    await asyncio.wait_for(task, 5)
    fail = next(c for c in host.sent if c.type == "run.fail").payload.model_dump()
    assert "the worker failed executing the run" in fail["error"]
    assert "cannot encode this command" in fail["error"]
    assert fail["retryable"] is True
    assert host.types().count("run.fail") == 1 and host.forgotten


# -- the result: a str, or any JSON value as its JSON text -------------------------------------
@pytest.mark.parametrize(
    ("returned", "recorded"),
    [
        ({"answer": "42", "sources": ["a", "b"]}, '{"answer":"42","sources":["a","b"]}'),
        ([1, 2.5, None, True], "[1,2.5,null,true]"),
        (7, "7"),
        (False, "false"),
        ("plain text", "plain text"),
        ({"naïve": "日本"}, '{"naïve":"日本"}'),
        (None, None),
    ],
)
async def test_a_json_result_completes_the_run_as_its_json_text(
    returned: object, recorded: str | None
) -> None:
    async def handler(ctx: RunContext) -> object:
        return returned

    host = Host(handler)
    ex, task = await _granted(host)
    await until(lambda: "run.complete" in host.types())
    assert "run.fail" not in host.types()
    assert host.sent[-1].payload.model_dump()["result"] == recorded
    await _ended(host, ex, task, "completed")


@pytest.mark.parametrize(
    ("returned", "named"),
    [({1, 2}, "set"), (b"bytes", "bytes"), (float("nan"), "float"), (object(), "object")],
)
async def test_a_result_that_is_not_json_fails_the_run_naming_its_type(
    returned: object, named: str
) -> None:
    async def handler(ctx: RunContext) -> object:
        return returned

    host = Host(handler)
    ex, task = await _granted(host)
    await until(lambda: "run.fail" in host.types())
    error = _error(host)
    assert error.startswith("the result cannot be recorded: the handler returned"), error
    assert f"of type {named}, which is not JSON" in error, error
    assert "run.complete" not in host.types()
    await _ended(host, ex, task, "failed")


async def test_a_json_result_over_the_payload_limit_fails_the_run_at_once_saying_why() -> None:
    async def handler(ctx: RunContext) -> object:
        return {"rows": ["x" * 1000] * 300}

    host = Host(handler)
    ex, task = await _granted(host)
    await until(lambda: "run.fail" in host.types())
    error = _error(host)
    assert "the result is too large to record" in error and "262144" in error, error
    assert "run.complete" not in host.types()
    await _ended(host, ex, task, "failed")
