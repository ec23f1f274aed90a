"""The agent SDK, under the one public import root: everything an agent author imports.

    from sessionstream.agent import RunCancelled, RunContext, Worker

    async def run(ctx: RunContext) -> str | None: ...

Run it with `sessionstream worker --agent mypkg.agent:run`, or from Python with
`await Worker(settings, run, worker_id).run(stop)` (`settings`: a
`sessionstream.settings.Settings`). A handler is a `Handler` returning a `RunResult`. The
errors a handler meets are `RunCancelled` / `RunFenced` / `ActionDenied` /
`QuestionClosed` (`ctx.ask_user`) here, and the
adapters' `ModelError`, `ModelUnavailable`, `QueryFailed` and `DatabaseUnavailable` in
`sessionstream.errors`. The runtime behind these names is the worker runtime (lease,
generation fencing, cancel propagation; docs/workers.md).
"""

from sessionstream.runtimes.worker import (
    AbortSignal,
    ActionDenied,
    ActionExecutor,
    ActionFn,
    ActionRun,
    CancelReport,
    ChatModel,
    Completion,
    FakeModel,
    FollowUp,
    Handler,
    Message,
    Model,
    ModelCall,
    ModelOutputInvalid,
    OpenAIChatModel,
    QuestionClosed,
    RunAborted,
    RunCancelled,
    RunContext,
    RunFenced,
    RunResult,
    StepStore,
    Tool,
    ToolCall,
    ToolSpec,
    Worker,
    default_worker_id,
    run_query,
    tool,
)

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
