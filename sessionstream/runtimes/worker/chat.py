"""Chat-shaped model calls: messages, tool definitions, tool calls, structured output.

A conversation is a list of `Message`s (system, user, assistant, tool) in the shape of
OpenAI's chat-completions API, which most providers and local servers speak. The model may
answer with text, with `ToolCall`s (a name and its arguments as JSON text), or — when the
call asks for structured output — with JSON that matches a schema. A `Tool` is what the
model may call: a name, a description, the JSON schema of its arguments and the async
function that runs it; `tool(fn)` builds one from a function's signature and docstring.

    @tool
    async def search(q: str, limit: int = 5) -> list[str]:
        "Search the invoices."

    messages = [Message.system("You answer from the invoices."), Message.user(ctx.prompt)]
    while True:
        async with ctx.model() as m:
            reply = await m.chat(messages, tools=[search])
        messages.append(reply.message())
        if not reply.tool_calls:
            return str(reply)
        messages += await ctx.call_tools(reply, [search])

Every `chat` is a durable step (its messages, tools and schema are the step's input; the
reply with its tool calls is the result) and every tool call one too, so a takeover or a
later round gets both back instead of asking again (docs/workers.md#chat).
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast, get_type_hints

from pydantic import BaseModel, TypeAdapter, ValidationError, create_model

from sessionstream.errors import ConfigurationError, SessionstreamError
from sessionstream.runtimes.worker._signal import AbortSignal

__all__ = [
    "Message",
    "ModelOutputInvalid",
    "Output",
    "Role",
    "Tool",
    "ToolCall",
    "ToolSpec",
    "message_json",
    "output_spec",
    "tool",
]

Role = Literal["system", "user", "assistant", "tool"]

#: a tool's or a schema's name as providers accept it (OpenAI: ^[a-zA-Z0-9_-]{1,64}$)
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ModelOutputInvalid(SessionstreamError):
    """A reply asked for as structured output is not JSON of the asked-for schema."""

    def __init__(self, message: str, *, text: str, schema_name: str) -> None:
        super().__init__(message)
        #: the reply as the model wrote it (for a log, or to ask again with the error)
        self.text = text
        self.schema_name = schema_name


@dataclass(frozen=True)
class ToolCall:
    """The model asks for tool `name` with `arguments` (JSON text, as the model wrote it:
    `args()` parses it). `id` pairs the call with its result message."""

    id: str
    name: str
    arguments: str = "{}"

    def args(self) -> dict[str, Any]:
        """The arguments as an object; ValueError when the model wrote anything else."""
        value = json.loads(self.arguments or "{}")
        if not isinstance(value, dict):
            raise ValueError(
                f"arguments of {self.name!r} are {type(value).__name__}, not an object"
            )
        return value

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ToolCall:
        fn = d.get("function") or {}
        return cls(
            str(d.get("id") or ""), str(fn.get("name") or ""), str(fn.get("arguments") or "")
        )


@dataclass(frozen=True)
class Message:
    """One message of a conversation. `tool_calls` only on an assistant's, `tool_call_id`
    only on a tool result's (the call it answers)."""

    role: Role
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    @classmethod
    def system(cls, content: str) -> Message:
        return cls("system", content)

    @classmethod
    def user(cls, content: str) -> Message:
        return cls("user", content)

    @classmethod
    def assistant(cls, content: str | None, tool_calls: Sequence[ToolCall] = ()) -> Message:
        return cls("assistant", content, tuple(tool_calls))

    @classmethod
    def tool(cls, call: ToolCall | str, content: str) -> Message:
        """A tool's result, answering `call` (or the call's id)."""
        call_id = call.id if isinstance(call, ToolCall) else call
        return cls("tool", content, tool_call_id=call_id)

    def to_json(self) -> dict[str, Any]:
        """The message as chat-completions APIs take it."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.to_json() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Message:
        role = d.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            raise ValueError(f"a message's role is system, user, assistant or tool, not {role!r}")
        content = d.get("content")
        return cls(
            cast(Role, role),
            None if content is None else str(content),
            tuple(ToolCall.from_json(c) for c in d.get("tool_calls") or ()),
            d.get("tool_call_id"),
            d.get("name"),
        )


def message_json(m: Message | Mapping[str, Any]) -> dict[str, Any]:
    """A `Message`, or a dict in the API's shape (checked), as the API's dict."""
    return m.to_json() if isinstance(m, Message) else Message.from_json(m).to_json()


@dataclass(frozen=True)
class ToolSpec:
    """What the model is told of a tool: its name, what it does, its arguments' schema."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ConfigurationError(
                f"tool name {self.name!r}: 1-64 letters, digits, '_' or '-' "
                "(providers refuse others)"
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }


#: the names a tool function may take besides its arguments: given by the runtime
_INJECTED = ("signal", "idempotency_id")


@dataclass(frozen=True)
class Tool:
    """A tool the model may call: its spec and `fn(**arguments)` (async). `fn` may also take
    `signal` (the call's AbortSignal) and `idempotency_id` (the same on every attempt of the
    step, on every holder); `validate` turns the model's arguments into `fn`'s keywords."""

    spec: ToolSpec
    fn: Callable[..., Awaitable[Any]]
    validate: Callable[[dict[str, Any]], dict[str, Any]] = dict

    @property
    def name(self) -> str:
        return self.spec.name

    async def __call__(
        self, arguments: dict[str, Any], signal: AbortSignal, idempotency_id: str
    ) -> Any:
        kwargs = self.validate(arguments)
        params = inspect.signature(self.fn).parameters
        if "signal" in params:
            kwargs["signal"] = signal
        if "idempotency_id" in params:
            kwargs["idempotency_id"] = idempotency_id
        return await self.fn(**kwargs)


def tool(
    fn: Callable[..., Awaitable[Any]] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
) -> Any:
    """`@tool` or `@tool(name=..., description=...)` on an `async def`: a `Tool` whose
    arguments' schema comes from the function's annotated parameters (pydantic), whose
    description is its docstring. `signal` and `idempotency_id` are not arguments."""

    def build(f: Callable[..., Awaitable[Any]]) -> Tool:
        if not inspect.iscoroutinefunction(f):
            raise ConfigurationError(f"tool {f.__qualname__!r} must be an `async def`")
        hints = get_type_hints(f)
        fields: dict[str, Any] = {}
        for p in inspect.signature(f).parameters.values():
            if p.name in _INJECTED:
                continue
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise ConfigurationError(
                    f"tool {f.__qualname__!r}: *args/**kwargs cannot be described"
                )
            default = ... if p.default is p.empty else p.default
            fields[p.name] = (hints.get(p.name, Any), default)
        args_model = create_model(f"{f.__name__}_arguments", **fields)
        schema = args_model.model_json_schema()
        schema.pop("title", None)

        def validate(arguments: dict[str, Any]) -> dict[str, Any]:
            parsed = args_model.model_validate(arguments)
            return {k: getattr(parsed, k) for k in fields}

        spec = ToolSpec(name or f.__name__, description or inspect.getdoc(f) or "", schema)
        return Tool(spec, f, validate)

    return build if fn is None else build(fn)


def tool_result_text(value: Any) -> str:
    """A tool's result as the content of its message: a str as it is, else its JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def invalid_arguments_text(call: ToolCall, e: Exception) -> str:
    """What the model is told when its arguments do not fit (so it can call again)."""
    if isinstance(e, ValidationError):
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "arguments"
        why = f"{where}: {first.get('msg')}"
    else:
        why = str(e)
    return json.dumps({"error": f"invalid arguments for {call.name}: {why}"})


@dataclass(frozen=True)
class Output:
    """Structured output asked of a model call: a schema's name, its JSON schema, and how a
    reply's JSON becomes the value (`parse`)."""

    name: str
    schema: Mapping[str, Any]
    parse: Callable[[Any], Any]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "schema": dict(self.schema)}

    def read(self, text: str) -> Any:
        """The reply's value; ModelOutputInvalid when it is not JSON of the schema."""
        try:
            value = json.loads(text)
        except ValueError as e:
            raise ModelOutputInvalid(
                f"the model's reply is not JSON (asked for {self.name}): {text[:200]!r}",
                text=text,
                schema_name=self.name,
            ) from e
        try:
            return self.parse(value)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "value"
            raise ModelOutputInvalid(
                f"the model's reply does not match {self.name}: {where}: {first.get('msg')}",
                text=text,
                schema_name=self.name,
            ) from e


def output_spec(output: type[Any] | Mapping[str, Any] | Output) -> Output:
    """Structured output from a pydantic model (or any type pydantic describes: the value
    is validated into it) or from a JSON schema (the value is the parsed JSON)."""
    if isinstance(output, Output):
        return output
    if isinstance(output, Mapping):
        name = str(output.get("title") or "output")
        name = name if _NAME.match(name) else "output"
        return Output(name, output, lambda v: v)
    if isinstance(output, type) and issubclass(output, BaseModel):
        model = output
        return Output(_schema_name(model.__name__), model.model_json_schema(), model.model_validate)
    try:
        adapter: TypeAdapter[Any] = TypeAdapter(output)
        schema = adapter.json_schema()
    except Exception as e:
        raise ConfigurationError(
            f"output {output!r} is not a type pydantic can describe: {e}"
        ) from e
    return Output(
        _schema_name(getattr(output, "__name__", "output")), schema, adapter.validate_python
    )


def _schema_name(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64]
    return cleaned or "output"
