"""Run workers: lease + generation, heartbeats, a cancel that reaches model, tools, actions.

The runtime behind the agent SDK: agent authors import these names from
`sessionstream.agent`, write `async def run(ctx: RunContext) -> str | None` and start
`Worker(settings, run, worker_id).run()` (or `sessionstream worker --agent module:run`).
See docs/workers.md.
"""

from consumers.worker._handler import Handler, RunResult
from consumers.worker._signal import AbortSignal, RunAborted, RunCancelled, RunFenced
from consumers.worker._steps import StepStore
from consumers.worker.context import ActionDenied, CancelReport, FollowUp, ModelCall, RunContext
from consumers.worker.executor import ActionExecutor, ActionFn, ActionRun
from consumers.worker.model import FakeModel, Model
from consumers.worker.openai_model import OpenAIChatModel
from consumers.worker.runtime import Worker, default_worker_id
from consumers.worker.sql_tool import run_query

__all__ = [
    "AbortSignal",
    "ActionDenied",
    "ActionExecutor",
    "ActionFn",
    "ActionRun",
    "CancelReport",
    "FakeModel",
    "FollowUp",
    "Handler",
    "Model",
    "ModelCall",
    "OpenAIChatModel",
    "RunAborted",
    "RunCancelled",
    "RunContext",
    "RunFenced",
    "RunResult",
    "StepStore",
    "Worker",
    "default_worker_id",
    "run_query",
]
