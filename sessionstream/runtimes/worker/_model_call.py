"""`ModelCall`: one `ctx.model()` block's model requests, each a durable step, each aborted
when the run is cancelled."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from sessionstream.errors import ConfigurationError
from sessionstream.runtimes.worker._signal import AbortSignal, RunCancelled
from sessionstream.runtimes.worker._steps import StepBook
from sessionstream.runtimes.worker.chat import (
    Message,
    Output,
    Tool,
    ToolSpec,
    message_json,
    output_spec,
)
from sessionstream.runtimes.worker.model import Completion, DeltaCallback, Model, streams_deltas

__all__ = ["ModelCall"]

T = TypeVar("T")


def _observe(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _parsed(reply: Completion, out: Output | None) -> Completion:
    if out is not None:
        reply.parsed = out.read(reply.text)
    return reply


def _transcript(messages: list[dict[str, Any]]) -> str:
    """A conversation as one prompt, for a model that only completes: a lone user message
    as it is, otherwise each message on its own lines after its role."""
    if len(messages) == 1 and messages[0]["role"] == "user":
        return str(messages[0]["content"] or "")
    return "\n\n".join(f"{m['role']}: {m['content'] or ''}" for m in messages)


class ModelCall:
    """One model request; `complete` is aborted (RunCancelled) when the run is cancelled.
    Each `complete` is a durable step: a recorded one returns its recorded reply without
    calling the model (and without progress events)."""

    def __init__(
        self,
        model: Model,
        signal: AbortSignal,
        *,
        step_id: str | None = None,
        book: StepBook | None = None,
        on_call: Callable[[str], None] | None = None,
        on_delta: DeltaCallback | None = None,
    ) -> None:
        self.model = model
        self.signal = signal
        self.step_id = step_id
        self._book = book
        self._on_call = on_call
        #: given to a model that streams (`streams_deltas`): each piece of its answer
        self._on_delta = on_delta
        self._calls = 0
        #: (step id, input, result) of each answered call, recorded when the block ends
        self.answered: list[tuple[str, Any, Any]] = []
        #: what the block's model calls reported (camelCase, as `model.request.finished`
        #: carries it): tokens and cost summed, the first call's time to its first token
        self.usage: dict[str, Any] = {}

    def _next_step(self) -> str | None:
        self._calls += 1
        if self.step_id is None or self._calls == 1:
            return self.step_id
        return f"{self.step_id}.{self._calls}"  # a second call in one block: a step of its own

    async def complete(self, prompt: str) -> str:
        step_id = self._next_step()
        if self._book is not None and step_id is not None:
            step_id, rec = self._book.lookup(step_id, self._book.digest(prompt)[1])
            if rec is not None:
                return str(await self._book.value(rec))
        if self._on_call is not None:
            self._on_call(step_id or "")
        reply = await self._call(lambda on_delta: self._complete(prompt, on_delta), "complete")
        if step_id is not None:
            self.answered.append((step_id, prompt, reply))
        return reply

    async def chat(
        self,
        messages: Sequence[Message | Mapping[str, Any]],
        *,
        tools: Sequence[Tool | ToolSpec] = (),
        output: type[Any] | Mapping[str, Any] | Output | None = None,
    ) -> Completion:
        """The model's reply to a conversation: text, or the `tool_calls` it asks for; with
        `output` (a pydantic model, a type, or a JSON schema) its JSON as `reply.parsed`
        (ModelOutputInvalid when it does not match). A durable step whose input is the
        messages, the tools' specs and the schema: a recorded one is returned as recorded.
        A model without `chat` takes a plain conversation as one prompt."""
        wire = [message_json(m) for m in messages]
        specs = [(t.spec if isinstance(t, Tool) else t).to_json() for t in tools]
        out = output_spec(output) if output is not None else None
        given = {"messages": wire, "tools": specs, "output": out.to_json() if out else None}
        step_id = self._next_step()
        if self._book is not None and step_id is not None:
            step_id, rec = self._book.lookup(step_id, self._book.digest(given)[1])
            if rec is not None:
                return _parsed(Completion.from_step(await self._book.value(rec)), out)
        if self._on_call is not None:
            self._on_call(step_id or "")
        if not hasattr(self.model, "chat"):
            if specs or out is not None:
                raise ConfigurationError(
                    f"model {self.model.name!r} has no chat(): tools and structured output "
                    "need a chat model (OpenAIChatModel, FakeModel, or one with chat())"
                )
            prompt = _transcript(wire)
            text = await self._call(lambda on_delta: self._complete(prompt, on_delta), "complete")
            reply = text if isinstance(text, Completion) else Completion(text)
        else:
            reply = await self._call(
                lambda on_delta: self._chat(wire, specs, out, on_delta), "chat"
            )
        reply = _parsed(reply, out)  # a reply that does not match is not recorded
        if step_id is not None:
            self.answered.append((step_id, given, reply.to_step()))
        return reply

    def _complete(self, prompt: str, on_delta: DeltaCallback | None) -> Awaitable[str]:
        if on_delta is not None:
            return self.model.complete(prompt, signal=self.signal, on_delta=on_delta)  # type: ignore[call-arg]
        return self.model.complete(prompt, signal=self.signal)

    def _chat(
        self,
        wire: list[dict[str, Any]],
        specs: list[dict[str, Any]],
        out: Output | None,
        on_delta: DeltaCallback | None,
    ) -> Awaitable[Completion]:
        kwargs: dict[str, Any] = {"signal": self.signal}
        if specs:
            kwargs["tools"] = specs
        if out is not None:
            kwargs["output"] = out.to_json()
        if on_delta is not None:
            kwargs["on_delta"] = on_delta
        reply: Awaitable[Completion] = self.model.chat(wire, **kwargs)  # type: ignore[attr-defined]
        return reply

    async def _call(
        self, request: Callable[[DeltaCallback | None], Awaitable[T]], method: str
    ) -> T:
        t0 = time.monotonic()
        on_delta = self._on_delta if streams_deltas(self.model, method) else None
        reply = await self._race(request(on_delta))
        u = self.usage
        u["durationMs"] = u.get("durationMs", 0) + int((time.monotonic() - t0) * 1000)
        if isinstance(reply, Completion):
            for key, value in (
                ("inputTokens", reply.input_tokens),
                ("outputTokens", reply.output_tokens),
                ("costUsd", reply.cost_usd),
            ):
                if value is not None:
                    u[key] = u.get(key, 0) + value
            if reply.first_token_ms is not None:
                u.setdefault("firstTokenMs", reply.first_token_ms)
            if reply.model is not None:
                u["model"] = reply.model[:200]
            if reply.finish_reason is not None:
                u["finishReason"] = reply.finish_reason[:64]
        return reply

    async def _race(self, request: Awaitable[T]) -> T:
        task = asyncio.ensure_future(request)
        # a request given up on (our caller cancelled) ends on its own: its error is
        # observed here, not reported by asyncio as "never retrieved"
        task.add_done_callback(_observe)
        waiter = asyncio.ensure_future(self.signal.wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()  # our caller was cancelled: the request goes with it
            raise
        finally:
            waiter.cancel()
        if not task.done():
            task.cancel()  # the request itself is torn down, not just ignored
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            raise RunCancelled(self.signal.reason or "aborted")
        return task.result()
