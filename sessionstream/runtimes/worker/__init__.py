"""Run workers: lease + generation, heartbeats, a cancel that reaches model, tools, actions.

The runtime behind the agent SDK: agent authors import these names from
`sessionstream.agent`, write `async def run(ctx: RunContext) -> str | None` and start
`Worker(settings, run, worker_id).run()` (or `sessionstream worker --agent module:run`).
See docs/workers.md.
"""

from sessionstream.runtimes.worker._handler import Handler, RunResult
from sessionstream.runtimes.worker._signal import AbortSignal, RunAborted, RunCancelled, RunFenced
from sessionstream.runtimes.worker._steps import StepStore
from sessionstream.runtimes.worker.chat import (
    Message,
    ModelOutputInvalid,
    Tool,
    ToolCall,
    ToolSpec,
    tool,
)
from sessionstream.runtimes.worker.context import (
    ActionDenied,
    CancelReport,
    FollowUp,
    ModelCall,
    QuestionClosed,
    RunContext,
)
from sessionstream.runtimes.worker.executor import ActionExecutor, ActionFn, ActionRun
from sessionstream.runtimes.worker.model import ChatModel, Completion, FakeModel, Model
from sessionstream.runtimes.worker.openai_model import OpenAIChatModel
from sessionstream.runtimes.worker.runtime import Worker, default_worker_id
from sessionstream.runtimes.worker.sql_tool import run_query

__all__ = [
    "AbortSignal",
    "ActionDenied",
    "ActionExecutor",
    "ActionFn",
    "ActionRun",
    "CancelReport",
    "ChatModel",
    "Completion",
    "FakeModel",
    "FollowUp",
    "Handler",
    "Message",
    "Model",
    "ModelCall",
    "ModelOutputInvalid",
    "OpenAIChatModel",
    "QuestionClosed",
    "RunAborted",
    "RunCancelled",
    "RunContext",
    "RunFenced",
    "RunResult",
    "StepStore",
    "Tool",
    "ToolCall",
    "ToolSpec",
    "Worker",
    "default_worker_id",
    "run_query",
    "tool",
]
