"""The reference agent: a model, a "search" tool, a SQL tool, an "email" action.

Used by the tests, the benchmark and the demo. Its behaviour is set by `key=value` words in
the prompt, so a test can ask for exactly the run it needs:

    steps=2 tool_ms=3000 model_ms=50 sql_ms=0 email=end|start|no to=ops@example.com
    subtask_ms=0 email_ms=0 compact=1

Each step: read steering, call the model (the steer text is in its prompt), call the
"search" tool (which waits `tool_ms` unless aborted). Both are durable steps: a new holder
after a takeover, or a later round, gets their recorded results back instead of calling
them again. After the steps the "sql" tool asks
the worker's database how many emails the run has sent, in a query that first sleeps
`sql_ms` in the server (`pg_sleep`), so a test can cancel a query mid-flight. `email`
sends one email (a row in `agent_outbox`) through the action gate with the key
`{run_id}:email:{where}`. A round after follow-ups were delivered answers each of them
with one model call.

The model is the worker's (`OpenAIChatModel` when SESSIONSTREAM_MODEL_BASE_URL is set; the
demo's local server also reads `model_ms`), else a FakeModel that takes `model_ms`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sessionstream.runtimes.worker._signal import AbortSignal, RunCancelled
from sessionstream.runtimes.worker.context import RunContext
from sessionstream.runtimes.worker.executor import ActionRun
from sessionstream.runtimes.worker.model import FakeModel, Model
from sessionstream.runtimes.worker.sql_tool import run_query

__all__ = ["AgentConfig", "reference_agent"]


@dataclass(frozen=True)
class AgentConfig:
    steps: int = 1
    tool_ms: int = 200
    model_ms: int = 50
    sql_ms: int = 0
    email: str = "end"
    to: str = "user@example.com"
    subtask_ms: int = 0
    #: how long sending the email takes (inside its transaction)
    email_ms: int = 0
    compact: bool = False

    @classmethod
    def parse(cls, prompt: str) -> AgentConfig:
        words = dict(w.split("=", 1) for w in prompt.split() if "=" in w)
        return cls(
            steps=int(words.get("steps", cls.steps)),
            tool_ms=int(words.get("tool_ms", cls.tool_ms)),
            model_ms=int(words.get("model_ms", cls.model_ms)),
            sql_ms=int(words.get("sql_ms", cls.sql_ms)),
            email=words.get("email", cls.email),
            to=words.get("to", cls.to),
            subtask_ms=int(words.get("subtask_ms", cls.subtask_ms)),
            email_ms=int(words.get("email_ms", cls.email_ms)),
            compact=words.get("compact", "0") == "1",
        )


async def send_email(ctx: RunContext, cfg: AgentConfig, where: str, body: str) -> str | None:
    async def write(a: ActionRun) -> str:
        assert a.conn is not None
        if cfg.email_ms:
            # a slow mail server: the action is underway when a cancel may come
            await a.conn.execute("select pg_sleep(%s)", (cfg.email_ms / 1000,))
        await a.conn.execute(
            "insert into agent_outbox (idempotency_key, session_id, run_id, recipient, subject,"
            " body) values (%s, %s, %s, %s, %s, %s)",
            (a.idempotency_key, a.session_id, a.run_id, cfg.to, f"task {where}", body),
        )
        return f"email to {cfg.to}"

    return await ctx.action("email", f"{ctx.run_id}:email:{where}", write, detail=cfg.to)


# one round trip, plus a server-side wait that only a cancel in the server cuts short
_SENT = "select (select count(*) from agent_outbox where run_id = %s) from pg_sleep(%s)"


def _model_for(ctx: RunContext, cfg: AgentConfig) -> Model:
    """The worker's model if it has a real one, else a FakeModel as slow as `model_ms`."""
    if isinstance(ctx.default_model, FakeModel):
        return FakeModel(latency_s=cfg.model_ms / 1000)
    return ctx.default_model


def _search(cfg: AgentConfig) -> Callable[[AbortSignal, str], Awaitable[str]]:
    """The "search" tool: waits `tool_ms` unless aborted."""

    async def search(signal: AbortSignal, idempotency_id: str) -> str:
        if not await signal.sleep(cfg.tool_ms / 1000):
            raise RunCancelled(signal.reason or "aborted")
        return f"searched ({idempotency_id})"

    return search


async def _emails_sent(ctx: RunContext, cfg: AgentConfig) -> int | None:
    """The "sql" tool: this run's rows in agent_outbox (None without a database)."""
    if ctx.database is None:
        return None
    async with ctx.tool("sql", "sql-outbox") as signal:
        rows = await run_query(
            ctx.database,
            _SENT,
            (ctx.run_id, cfg.sql_ms / 1000),
            signal=signal,
            application_name=f"sql tool {ctx.run_id}",
        )
    return int(rows[0][0])


async def reference_agent(ctx: RunContext) -> str:
    """The agent's `run(ctx)`."""
    cfg = AgentConfig.parse(ctx.prompt)
    model = _model_for(ctx, cfg)
    if ctx.round > 0:
        answers = []
        for f in ctx.follow_ups():
            async with ctx.model(model, detail=f"follow-up: {f.text}") as m:
                answers.append(await m.complete(f"follow-up: {f.text}"))
        return f"follow-ups handled: {len(answers)}"
    if cfg.email == "start":
        await send_email(ctx, cfg, "start", "task started")
    side = None
    if cfg.subtask_ms:
        side = ctx.subtask(asyncio.sleep(cfg.subtask_ms / 1000), name="background-index")
    answer = ""
    for step in range(cfg.steps):
        steers = ctx.steering()
        prompt = f"step {step}: {ctx.prompt}"
        if steers:
            prompt += " | steer: " + "; ".join(steers)
        async with ctx.model(model, detail=prompt) as m:
            answer = await m.complete(prompt)
        await ctx.call_tool("search", _search(cfg), {"step": step}, step=f"search-{step}")
    sent = await _emails_sent(ctx, cfg)
    if side is not None:
        await side
    if cfg.compact:
        await ctx.compact(f"mem://checkpoints/{ctx.run_id}/{ctx.generation}", tokens=1000)
    steers = ctx.steering()
    if steers:
        async with ctx.model(model, detail="steer: " + "; ".join(steers)) as m:
            answer = await m.complete("; ".join(steers))
    if cfg.email == "end":
        body = f"task complete: {answer}"
        if sent:
            body += f" ({sent} earlier email(s) of this run)"
        await send_email(ctx, cfg, "end", body)
    return f"done: {answer}"
