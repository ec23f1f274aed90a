"""The session state machine as a Temporal workflow (one per session) with two updates,
and its worker: `python -m bench.peers._temporal_worker ADDRESS TASK_QUEUE`.

prompt: an active run -> rejected `session_busy`; else a run starts (id from
`workflow.uuid4()`, deterministic). abort naming the active run -> it ends cancelled;
otherwise rejected `run_not_active`. Updates of one workflow are applied in order by its
one workflow task at a time, which is Temporal's single writer.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Worker


@workflow.defn(name="Session", sandboxed=False)
class Session:
    def __init__(self) -> None:
        self.active: str | None = None
        self.closed = False

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self.closed)

    @workflow.update
    def prompt(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.active is not None:
            return {"status": "rejected", "reason": "session_busy", "runId": None}
        self.active = str(workflow.uuid4())
        return {"status": "accepted", "runId": self.active}

    @workflow.update
    def abort(self, req: dict[str, Any]) -> dict[str, Any]:
        run = self.active
        if run is None or (req.get("runId") and req["runId"] != run):
            return {"status": "rejected", "reason": "run_not_active", "runId": None}
        self.active = None
        return {"status": "accepted", "runId": run, "terminalStatus": "cancelled"}

    @workflow.signal
    def close(self) -> None:
        self.closed = True


async def main(address: str, task_queue: str) -> None:
    client = await Client.connect(address)
    worker = Worker(client, task_queue=task_queue, workflows=[Session])
    print("worker started", flush=True)
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
