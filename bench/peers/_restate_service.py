"""The session state machine as a Restate virtual object (one per session), served by
hypercorn in this process: `python -m bench.peers._restate_service PORT`.

prompt: an active run -> rejected `session_busy`; else a run starts (its id from
`ctx.uuid()`, deterministic on replay). abort naming the active run -> the run ends
cancelled (no worker holds it: at once); otherwise rejected `run_not_active`. Restate runs
the handlers of one key one at a time (exclusive handlers), which is its single writer.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import hypercorn.asyncio
import hypercorn.config
import restate

session = restate.VirtualObject("Session")


@session.handler()
async def prompt(ctx: restate.ObjectContext, req: dict[str, Any]) -> dict[str, Any]:
    run = await ctx.get("run", type_hint=str)
    if run is not None:
        return {"status": "rejected", "reason": "session_busy", "runId": None}
    run = str(ctx.uuid())
    ctx.set("run", run)
    return {"status": "accepted", "runId": run}


@session.handler()
async def abort(ctx: restate.ObjectContext, req: dict[str, Any]) -> dict[str, Any]:
    run = await ctx.get("run", type_hint=str)
    if run is None or (req.get("runId") and req["runId"] != run):
        return {"status": "rejected", "reason": "run_not_active", "runId": None}
    ctx.clear("run")
    return {"status": "accepted", "runId": run, "terminalStatus": "cancelled"}


app = restate.app([session])


def main() -> None:
    config = hypercorn.config.Config()
    config.bind = [f"127.0.0.1:{int(sys.argv[1])}"]
    config.accesslog = None
    asyncio.run(hypercorn.asyncio.serve(app, config))


if __name__ == "__main__":
    main()
