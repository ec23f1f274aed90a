"""The agent SDK, under the one public import root: what an agent author imports.

    from sessionstream.agent import RunContext, RunCancelled, Worker

    async def run(ctx: RunContext) -> str | None: ...

Run it with `sessionstream worker --agent mypkg.agent:run`, or from Python with
`await Worker(settings, run, worker_id).run(stop)`. The runtime behind these names is the
worker runtime (lease, generation fencing, cancel propagation; docs/workers.md).
"""

from consumers.worker import (
    AbortSignal,
    ActionDenied,
    ActionExecutor,
    ActionFn,
    ActionRun,
    CancelReport,
    FakeModel,
    FollowUp,
    Model,
    ModelCall,
    OpenAIChatModel,
    RunAborted,
    RunCancelled,
    RunContext,
    RunFenced,
    Worker,
    default_worker_id,
    run_query,
)

__all__ = [
    "AbortSignal",
    "ActionDenied",
    "ActionExecutor",
    "ActionFn",
    "ActionRun",
    "CancelReport",
    "FakeModel",
    "FollowUp",
    "Model",
    "ModelCall",
    "OpenAIChatModel",
    "RunAborted",
    "RunCancelled",
    "RunContext",
    "RunFenced",
    "Worker",
    "default_worker_id",
    "run_query",
]
