"""An agent for the durable-steps tests: every model call and tool call it makes is written
to a file (`calls=PATH` in the prompt), one line each, so a test counts the calls made
across worker processes, a killed one included.

    calls=PATH t1=200 t2=4000 hold=model-1

It calls the model once (`model-1`), then the tool "search" twice (`tool:search-1`, waiting
`t1` ms, and `tool:search-2`, waiting `t2` ms), checkpointing between the two. `hold=model-1`
makes the first holder wait inside the model step after the model answered and before the
step is recorded (the step ends when its block does): a kill -9 there lands between "step
finished" and "step recorded". `big=N` adds N characters to the first search's hits: a
result over the log's inline bound, stored in PostgreSQL (`step_results`) by pointer.
"""

from __future__ import annotations

import asyncio
import os

from sessionstream.runtimes.worker._signal import AbortSignal, RunCancelled
from sessionstream.runtimes.worker.context import RunContext
from sessionstream.runtimes.worker.model import Model

__all__ = ["run"]


def _note(path: str, line: str) -> None:
    """Append one line, durably, before the call goes on (a kill -9 may come next)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class CountedModel(Model):
    name = "counted"

    def __init__(self, path: str, who: str) -> None:
        self.path = path
        self.who = who

    async def complete(self, prompt: str, *, signal: AbortSignal) -> str:
        _note(self.path, f"model {self.who}")
        return f"plan for {prompt.split()[0]}"


async def run(ctx: RunContext) -> dict[str, object]:
    words = dict(w.split("=", 1) for w in ctx.prompt.split() if "=" in w)
    path = words["calls"]
    who = f"{ctx.worker_id}/{ctx.generation}"

    def search(ms: int, big: int = 0):  # type: ignore[no-untyped-def]
        async def call(signal: AbortSignal, idempotency_id: str) -> list[str]:
            _note(path, f"tool-start {who} {idempotency_id}")
            if not await signal.sleep(ms / 1000):
                raise RunCancelled(signal.reason or "aborted")
            _note(path, f"tool-done {who} {idempotency_id}")
            return [f"hit after {ms} ms", *(["x" * big] if big else [])]

        return call

    async with ctx.model(CountedModel(path, who)) as m:
        plan = await m.complete(ctx.prompt)
        if words.get("hold") == "model-1" and ctx.generation == 1:
            _note(path, f"holding {who} model-1")
            await asyncio.sleep(600)  # killed here: answered, not recorded
    t1, big = int(words.get("t1", "200")), int(words.get("big", "0"))
    first = await ctx.call_tool("search", search(t1, big), input={"q": plan})
    await ctx.compact(f"s3://ckpt/{ctx.run_id}/1")
    second = await ctx.call_tool("search", search(int(words.get("t2", "200"))), input={"q": 2})
    return {"plan": plan, "hits": [*first, *second], "contextRef": ctx.context_ref}
