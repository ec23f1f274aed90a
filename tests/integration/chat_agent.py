"""A chat agent for the durable-steps tests: a tool loop against the worker's model (the
OpenAI-compatible adapter, pointed at the local model server), its one tool writing each
call to a file (`calls=PATH` in the prompt), so a test counts the calls made across worker
processes, a killed one included.

    call=lookup calls=PATH hold=tool

`call=lookup` makes the model server ask for the tool once; `hold=tool` makes the first
holder wait after the tool's result was recorded and before it asks the model again: a
kill -9 there lands between two chat steps.
"""

from __future__ import annotations

import asyncio
import os

from sessionstream.agent import Message, RunContext, tool

__all__ = ["run"]


def _note(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


async def run(ctx: RunContext) -> dict[str, object]:
    words = dict(w.split("=", 1) for w in ctx.prompt.split() if "=" in w)

    @tool
    async def lookup(order: str, *, idempotency_id: str) -> dict[str, str]:
        """Where an order is."""
        _note(words["calls"], f"tool {ctx.generation} {idempotency_id}")
        return {"order": order, "status": "in transit"}

    messages = [Message.system("You track orders."), Message.user(ctx.prompt)]
    for turn in range(4):
        async with ctx.model() as m:
            reply = await m.chat(messages, tools=[lookup])
        messages.append(reply.message())
        if not reply.tool_calls:
            return {"answer": str(reply), "turns": turn + 1}
        messages += await ctx.call_tools(reply, [lookup])
        if words.get("hold") == "tool" and ctx.generation == 1:
            _note(words["calls"], f"holding {ctx.generation}")
            await asyncio.sleep(600)  # killed here: the tool's result is recorded
    return {"answer": None, "turns": 4}
