"""The model seam: anything with `complete(prompt, signal=...)` plugs in as the run's LLM;
a model that also has `chat(messages, tools=..., output=..., signal=...)` (a `ChatModel`)
takes conversations, tool definitions and structured output (chat.py).

No network here. A real LLM client implements `Model.complete` (streaming or not) and
stops its HTTP request when `signal` is aborted — typically by racing the request task
against `signal.wait()`, which is what `RunContext.model` does around any Model anyway.
A model that streams may also take `on_delta` (`complete(prompt, signal=..., on_delta=f)`)
and call `f(text)` with each piece of its answer as it arrives: the worker publishes those
as token deltas (`streams_deltas` says whether a model takes them).
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from sessionstream.runtimes.worker._signal import AbortSignal
from sessionstream.runtimes.worker.chat import Message, ToolCall

__all__ = [
    "ChatModel",
    "Completion",
    "DeltaCallback",
    "FakeModel",
    "Model",
    "example_of",
    "streams_deltas",
]

#: what a streaming model calls with each piece of its answer
DeltaCallback = Callable[[str], None]


class Completion(str):
    """A model's reply (the text itself: a `str`) with what the provider said about the
    request: the model that answered, tokens in and out, the time to the first token, why
    it stopped, its cost. A `Model` may return one instead of a plain `str`; the worker
    records these on `model.request.finished`."""

    model: str | None
    input_tokens: int | None
    output_tokens: int | None
    first_token_ms: int | None
    finish_reason: str | None
    cost_usd: float | None
    #: the tools the model asks to call (a chat reply; the text may then be empty)
    tool_calls: tuple[ToolCall, ...]
    #: the structured output, when the call asked for one (`ModelCall.chat(output=...)`)
    parsed: Any

    def __new__(
        cls,
        text: str,
        *,
        model: str | None = None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        first_token_ms: int | None = None,
        finish_reason: str | None = None,
        cost_usd: float | None = None,
        tool_calls: Iterable[ToolCall] = (),
        parsed: Any = None,
    ) -> Completion:
        self = super().__new__(cls, text)
        self.model, self.first_token_ms, self.finish_reason = model, first_token_ms, finish_reason
        self.input_tokens, self.output_tokens, self.cost_usd = input_tokens, output_tokens, cost_usd
        self.tool_calls, self.parsed = tuple(tool_calls), parsed
        return self

    @property
    def text(self) -> str:
        return str.__str__(self)

    def message(self) -> Message:
        """The reply as the assistant's message, to append to the conversation."""
        return Message.assistant(self.text or None, self.tool_calls)

    def to_step(self) -> dict[str, Any]:
        """What a durable chat step records: the text, the tool calls, why it stopped."""
        out: dict[str, Any] = {"text": self.text}
        if self.tool_calls:
            out["toolCalls"] = [c.to_json() for c in self.tool_calls]
        if self.finish_reason is not None:
            out["finishReason"] = self.finish_reason
        if self.model is not None:
            out["model"] = self.model
        return out

    @classmethod
    def from_step(cls, value: Any) -> Completion:
        """A recorded chat step's reply (a recorded `complete` step is its text)."""
        if isinstance(value, str):
            return cls(value)
        if not isinstance(value, Mapping):
            return cls(json.dumps(value))
        return cls(
            str(value.get("text") or ""),
            model=value.get("model"),
            finish_reason=value.get("finishReason"),
            tool_calls=[ToolCall.from_json(c) for c in value.get("toolCalls") or ()],
        )


@runtime_checkable
class Model(Protocol):
    """An LLM. `signal` is aborted when the run is cancelled; stop work when it is."""

    name: str

    async def complete(self, prompt: str, *, signal: AbortSignal) -> str: ...


@runtime_checkable
class ChatModel(Model, Protocol):
    """An LLM that takes a conversation. `messages` are chat-completions dicts (role,
    content, tool_calls, tool_call_id); `tools` are function definitions as the API takes
    them; `output` is `{"name", "schema"}` when the reply must be JSON of that schema. It
    returns a `Completion` whose `tool_calls` are the calls the model asks for."""

    async def chat(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        signal: AbortSignal,
        tools: Sequence[dict[str, Any]] = (),
        output: dict[str, Any] | None = None,
        on_delta: DeltaCallback | None = None,
    ) -> Completion: ...


def streams_deltas(model: object, method: str = "complete") -> bool:
    """Whether `model.<method>` takes `on_delta` (by name, or as any keyword)."""
    complete = getattr(model, method, None)
    if complete is None:
        return False
    try:
        params = inspect.signature(complete).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "on_delta" or p.kind is p.VAR_KEYWORD for p in params)


def example_of(schema: Mapping[str, Any], text: str = "answer", _defs: Any = None) -> Any:
    """A small value of JSON schema `schema` (what the fake models answer when asked for
    structured output, or give a tool as arguments): strings are `text`, numbers 1, an
    object has its required properties (all when it names none as required)."""
    defs = _defs if _defs is not None else schema.get("$defs") or schema.get("definitions") or {}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.rsplit("/", 1)[-1] in defs:
        return example_of(defs[ref.rsplit("/", 1)[-1]], text, defs)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return example_of(schema[key][0], text, defs)
    kind = schema.get("type", "object")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if kind == "string":
        return text
    if kind in ("integer", "number"):
        return 1
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    if kind == "array":
        items = schema.get("items")
        return [example_of(items, text, defs)] if isinstance(items, Mapping) else []
    props: Mapping[str, Any] = schema.get("properties") or {}
    wanted = schema.get("required", list(props))
    return {k: example_of(props[k], text, defs) for k in wanted if k in props}


def _answer(prompt: str) -> str:
    digest = hashlib.sha256(prompt.encode()).hexdigest()[:12]
    return f"answer[{digest}] to: {prompt[:80]}"


def fake_chat_reply(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] = (),
    output: Mapping[str, Any] | None = None,
) -> tuple[str, list[ToolCall]]:
    """What the fake models (FakeModel, the shipped model server) answer a conversation.
    The last user message's words steer it: `call=NAME` asks for tool NAME once (its
    arguments an `example_of` its schema) until a tool result follows that message. A call
    asking for structured output gets `example_of` its schema; otherwise the answer is the
    one `complete` gives the last user message, plus a digest of the tool results after it."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    prompt = str(messages[last].get("content") or "") if last >= 0 else ""
    after = [m for m in messages[last + 1 :] if m.get("role") == "tool"]
    words = dict(w.split("=", 1) for w in prompt.split() if "=" in w)
    by_name = {str((t.get("function") or {}).get("name")): t for t in tools}
    wanted = words.get("call")
    if wanted in by_name and not after:
        params = (by_name[wanted].get("function") or {}).get("parameters") or {}
        args = json.dumps(example_of(params, prompt[:40]), separators=(",", ":"))
        n = sum(1 for m in messages if m.get("role") == "assistant") + 1
        return "", [ToolCall(f"call_{n}", wanted, args)]
    if output is not None:
        value = example_of(output.get("schema") or {}, _answer(prompt))
        return json.dumps(value, separators=(",", ":")), []
    if after:
        seen = "".join(str(m.get("content")) for m in after)
        return f"{_answer(prompt)} with {hashlib.sha256(seen.encode()).hexdigest()[:8]}", []
    return _answer(prompt), []


class FakeModel:
    """Deterministic: the answer is a digest of the prompt, after `latency_s` (abortable).
    Asked for deltas, it hands out its answer in `pieces` parts over that time. `chat`
    answers as `fake_chat_reply` says. `replies` script it: each call (`complete` or
    `chat`) takes the next one (a str, or a Completion with tool calls) until none is left.
    `calls` counts the calls made."""

    def __init__(
        self,
        name: str = "fake-1",
        latency_s: float = 0.05,
        pieces: int = 4,
        replies: Iterable[str | Completion] = (),
    ) -> None:
        self.name = name
        self.latency_s = latency_s
        self.pieces = max(1, pieces)
        self.replies: deque[str | Completion] = deque(replies)
        self.calls = 0
        #: the messages of each `chat` call, in order (what a test asserts on)
        self.conversations: list[list[dict[str, Any]]] = []

    async def complete(
        self, prompt: str, *, signal: AbortSignal, on_delta: DeltaCallback | None = None
    ) -> str:
        return await self._give(_answer(prompt), signal, on_delta)

    async def chat(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        signal: AbortSignal,
        tools: Sequence[dict[str, Any]] = (),
        output: dict[str, Any] | None = None,
        on_delta: DeltaCallback | None = None,
    ) -> Completion:
        self.conversations.append([dict(m) for m in messages])
        text, calls = fake_chat_reply(messages, tools, output)
        reason = "tool_calls" if calls else "stop"
        made = Completion(text, model=self.name, tool_calls=calls, finish_reason=reason)
        reply = await self._give(made, signal, on_delta)
        return reply if isinstance(reply, Completion) else Completion(reply)

    async def _give(self, answer: str, signal: AbortSignal, on_delta: DeltaCallback | None) -> str:
        self.calls += 1
        reply = self.replies.popleft() if self.replies else answer
        text = str.__str__(reply)
        if on_delta is None or not text:
            await signal.sleep(self.latency_s)
            signal.raise_if_aborted()
            return reply
        size = -(-len(text) // self.pieces)
        for i in range(0, len(text), size):
            await signal.sleep(self.latency_s / self.pieces)
            signal.raise_if_aborted()
            on_delta(text[i : i + size])
        return reply
