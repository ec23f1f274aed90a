"""An agent for the approval tests: it asks to pay (`ctx.action(kind="payment")`, key
`pay-{run id}`, arguments `{"amount": N}`) and writes each execution of the payment to a
file (`calls=PATH` in the prompt), one line each, so a test counts the payments made across
worker processes, a killed one included.

    calls=PATH amount=42

The run's result says what became of it: `{"paid": ...}` or `{"denied": reason}`.
"""

from __future__ import annotations

import os

from sessionstream.runtimes.worker._approval import ActionDenied
from sessionstream.runtimes.worker.context import RunContext
from sessionstream.runtimes.worker.executor import ActionRun

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
    path, amount = words["calls"], int(words.get("amount", "42"))
    key = f"pay-{ctx.run_id}"
    _note(path, f"asked {ctx.worker_id}/{ctx.generation} {key}")

    async def pay(_run: ActionRun) -> str:
        _note(path, f"paid {ctx.worker_id}/{ctx.generation} {key}")
        return f"paid {amount}"

    try:
        result = await ctx.action(
            "payment", key, pay, detail=f"EUR {amount}", arguments={"amount": amount}
        )
    except ActionDenied as e:
        return {"denied": e.reason}
    return {"paid": result}
