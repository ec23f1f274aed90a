"""The reference agent: deterministic fake model, fake tools, an "email" action.

Used by the tests, the benchmark and the demo. Its behaviour is set by `key=value` words in
the prompt, so a test can ask for exactly the run it needs:

    steps=2 tool_ms=3000 model_ms=50 email=end|start|no to=ops@example.com subtask_ms=0
    compact=1

Each step: read steering, call the model (the steer text is in its prompt), call the
"search" tool (which waits `tool_ms` unless aborted). `email` sends one email (a row in
`agent_outbox`) through the action gate with the key `{run_id}:email:{where}`. A round
after follow-ups were delivered answers each of them with one model call.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from consumers.worker._signal import RunCancelled
from consumers.worker.context import RunContext
from consumers.worker.executor import ActionRun
from consumers.worker.model import FakeModel

__all__ = ["AgentConfig", "reference_agent"]


@dataclass(frozen=True)
class AgentConfig:
    steps: int = 1
    tool_ms: int = 200
    model_ms: int = 50
    email: str = "end"
    to: str = "user@example.com"
    subtask_ms: int = 0
    compact: bool = False

    @classmethod
    def parse(cls, prompt: str) -> AgentConfig:
        words = dict(w.split("=", 1) for w in prompt.split() if "=" in w)
        return cls(
            steps=int(words.get("steps", cls.steps)),
            tool_ms=int(words.get("tool_ms", cls.tool_ms)),
            model_ms=int(words.get("model_ms", cls.model_ms)),
            email=words.get("email", cls.email),
            to=words.get("to", cls.to),
            subtask_ms=int(words.get("subtask_ms", cls.subtask_ms)),
            compact=words.get("compact", "0") == "1",
        )


async def send_email(ctx: RunContext, cfg: AgentConfig, where: str, body: str) -> str | None:
    async def write(a: ActionRun) -> str:
        assert a.conn is not None
        await a.conn.execute(
            "insert into agent_outbox (idempotency_key, session_id, run_id, recipient, subject,"
            " body) values (%s, %s, %s, %s, %s, %s)",
            (a.idempotency_key, a.session_id, a.run_id, cfg.to, f"task {where}", body),
        )
        return f"email to {cfg.to}"

    return await ctx.action("email", f"{ctx.run_id}:email:{where}", write, detail=cfg.to)


async def reference_agent(ctx: RunContext) -> str:
    """The agent's `run(ctx)`."""
    cfg = AgentConfig.parse(ctx.prompt)
    model = FakeModel(latency_s=cfg.model_ms / 1000)
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
        async with ctx.tool("search", f"search-{step}") as signal:
            if not await signal.sleep(cfg.tool_ms / 1000):
                raise RunCancelled(signal.reason or "aborted")
    if side is not None:
        await side
    if cfg.compact:
        await ctx.compact(f"mem://checkpoints/{ctx.run_id}/{ctx.generation}", tokens=1000)
    steers = ctx.steering()
    if steers:
        async with ctx.model(model, detail="steer: " + "; ".join(steers)) as m:
            answer = await m.complete("; ".join(steers))
    if cfg.email == "end":
        await send_email(ctx, cfg, "end", f"task complete: {answer}")
    return f"done: {answer}"
