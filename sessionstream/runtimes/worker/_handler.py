"""What the runtime asks of an agent's handler, what it hands it, and what becomes of what it
returns.

A handler is `async def run(ctx)`: everything it calls on `ctx` (model, tools, actions,
compaction) is awaited, so a plain `def` could not use the run at all. It may declare the
type of the prompt's input as a second parameter, `async def run(ctx, order: Order)`, with
any type pydantic's `TypeAdapter` takes (a model, a dataclass, a TypedDict, `list[int]`,
...): the input is validated against it before the handler is called, and a run whose input
does not fit fails at once, before any model call, tool or action. Both are checked when the
worker is built, not discovered on the first run.

The run's result is a string on the wire (`run.complete {result: string | null}`). A
handler may return a str (sent as it is), None, or any other JSON value (dict, list, int,
float, bool) or a pydantic model or dataclass (at any depth), sent as its JSON text.
Anything else is refused with its type named.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import re
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, cast

from pydantic import BaseModel, TypeAdapter, ValidationError

from sessionstream.errors import ConfigurationError, SessionstreamError
from sessionstream.runtimes.worker.context import RunContext
from sessionstream.schemas._json import dump_model

__all__ = [
    "Handler",
    "InputParameter",
    "InputRefused",
    "ResultRefused",
    "RunResult",
    "call_handler",
    "check_handler",
    "first_error",
    "input_parameter",
    "result_text",
    "storable",
]

#: what a handler may return: a str, None, a JSON value or a pydantic model (sent as its
#: JSON text; a dataclass is too, though no type says so)
RunResult = str | int | float | bool | list[Any] | dict[str, Any] | BaseModel | None

#: `async def run(ctx)`, or `async def run(ctx, input: T)` with T the input's type
Handler = (
    Callable[[RunContext], Awaitable[RunResult]] | Callable[[RunContext, Any], Awaitable[RunResult]]
)

_WRITE_IT: Final = (
    "write `async def run(ctx: RunContext)`, or `async def run(ctx: RunContext, order: Order)` "
    "with the input's type"
)


class ResultRefused(SessionstreamError):
    """A handler returned a value the run's result cannot carry; `type_name` is its type."""

    def __init__(self, message: str, type_name: str) -> None:
        super().__init__(message)
        self.type_name = type_name


class InputRefused(SessionstreamError):
    """The run's input does not fit the type the handler declares (the message says how):
    the run fails before the handler is called."""


@dataclass(frozen=True)
class InputParameter:
    """The handler's second parameter: the prompt's input, validated against `adapter`."""

    name: str
    #: the type as the author wrote it (`Order`, `list[int]`), for messages
    type_name: str
    adapter: TypeAdapter[Any]
    #: no default: a run without input fails, unless the type takes None
    required: bool


#: what `check_handler` found of each handler's input parameter (None: it takes none)
_PARAMETERS: weakref.WeakKeyDictionary[Any, InputParameter | None] = weakref.WeakKeyDictionary()


def _is_async(fn: Callable[..., object]) -> bool:
    # a function (or functools.partial of one), or an instance whose __call__ is async
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def check_handler(handler: object, name: str | None = None) -> Handler:
    """`handler` if it is an `async def` taking the context (and, optionally, an input of a
    type pydantic validates); ConfigurationError otherwise, saying how to write it."""
    what = name or getattr(handler, "__qualname__", None) or repr(handler)
    if not callable(handler):
        raise ConfigurationError(
            f"agent {what!r} is not callable ({type(handler).__name__}): "
            "write `async def run(ctx: RunContext)`"
        )
    if not _is_async(handler):
        raise ConfigurationError(
            f"agent {what!r} is not a coroutine function: write it `async def run(ctx)` "
            "(a decorator around it must be an `async def` wrapper too). The context's model, "
            "tool, action and compact calls are awaited, so a plain `def` cannot use them; "
            "blocking code inside belongs in `await asyncio.to_thread(...)`"
        )
    found = _inspect(handler, what)
    with contextlib.suppress(TypeError):  # an object no weak reference can name
        _PARAMETERS[handler] = found
    return cast(Handler, handler)


def input_parameter(handler: object) -> InputParameter | None:
    """The handler's input parameter, as `check_handler` found it (inspected now for a
    handler that never went through it); ConfigurationError for one it would refuse."""
    try:
        return _PARAMETERS[handler]
    except (KeyError, TypeError):  # not checked, or not weakly referable
        found = _inspect(handler, getattr(handler, "__qualname__", None) or repr(handler))
    with contextlib.suppress(TypeError):
        _PARAMETERS[handler] = found
    return found


def _namespace(handler: object) -> dict[str, Any]:
    """The globals the handler's annotations were written in (for `from __future__ import
    annotations`, where they are strings)."""
    fn: Any = handler
    while isinstance(fn, functools.partial):
        fn = fn.func
    if not (inspect.isfunction(fn) or inspect.ismethod(fn)):
        fn = type(fn).__call__
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    return dict(getattr(fn, "__globals__", {}))


def _inspect(handler: object, what: str) -> InputParameter | None:
    try:
        signature = inspect.signature(cast(Callable[..., object], handler))
    except (TypeError, ValueError):
        return None  # no signature to read (a builtin): called with the context alone
    params = list(signature.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    takes_more = any(p.kind == p.VAR_POSITIONAL for p in params)
    required = [
        p.name
        for p in params
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if not positional and not takes_more:
        raise ConfigurationError(f"agent {what!r} takes no parameter for the context: {_WRITE_IT}")
    if len(required) > 2 or any(p.kind == p.KEYWORD_ONLY and p.default is p.empty for p in params):
        raise ConfigurationError(
            f"agent {what!r} requires the parameters {', '.join(required)}: a handler is "
            f"given the run's context and, if it declares one, the prompt's input: {_WRITE_IT}"
        )
    if len(positional) < 2:
        return None
    param = positional[1]
    annotation = param.annotation
    if annotation is param.empty:
        raise ConfigurationError(
            f"agent {what!r}: its second parameter `{param.name}` has no type. It is given "
            "the prompt's input, validated against its annotation: annotate it with a "
            "pydantic model (or any type pydantic's TypeAdapter takes), "
            f"`async def run(ctx: RunContext, {param.name}: Order)`"
        )
    if isinstance(annotation, str):
        try:
            # what `typing.get_type_hints` does, for this one annotation only: the others
            # (the context's, the result's) may name what exists only for type checkers
            annotation = eval(annotation, _namespace(handler))
        except Exception as e:
            raise ConfigurationError(
                f"agent {what!r}: the type of its input parameter `{param.name}: "
                f"{param.annotation}` cannot be resolved ({type(e).__name__}: {e}): define "
                "or import it at the module's top level"
            ) from e
    type_name = _type_name(annotation)
    try:
        adapter: TypeAdapter[Any] = TypeAdapter(annotation)
        # a model that names a type not defined yet is built only when first used: now
        adapter.rebuild(raise_errors=True)
    except Exception as e:  # PydanticSchemaGenerationError, PydanticUserError, TypeError...
        raise ConfigurationError(
            f"agent {what!r}: the type of its input parameter `{param.name}: {type_name}` is "
            f"not one pydantic can validate ({type(e).__name__}: {str(e).splitlines()[0]}): "
            "annotate it with a pydantic model, a dataclass, a TypedDict or another type "
            "pydantic's TypeAdapter takes"
        ) from e
    return InputParameter(param.name, type_name, adapter, param.default is param.empty)


def _type_name(annotation: object) -> str:
    """`Order`, `list[int]`, `Order | None`: the type as written, without module paths."""
    if isinstance(annotation, type) and not getattr(annotation, "__args__", None):
        return annotation.__name__
    return re.sub(r"\b(?:\w+\.)+(\w+)", r"\1", str(annotation))


def first_error(e: ValidationError) -> str:
    """Pydantic's first error, `where: what` (`qty: Input should be a valid integer`)."""
    errors = e.errors(include_url=False)
    if not errors:
        return str(e)
    first = errors[0]
    loc = ".".join(str(x) for x in first["loc"])
    return f"{loc}: {first['msg']}" if loc else str(first["msg"])


#: the parameter's default applies: the input is not passed
_OMIT: Final = object()


def validated_input(param: InputParameter, input_json: str | None) -> object:
    """The value the handler's input parameter is given (or `_OMIT`); InputRefused with
    pydantic's first error when the input does not fit."""
    if input_json is None:
        if not param.required:
            return _OMIT
        try:  # `Order | None` takes the missing input as None
            return param.adapter.validate_python(None)
        except ValidationError:
            raise InputRefused(
                f"the prompt has no input, and the handler's parameter `{param.name}: "
                f"{param.type_name}` needs one (give the prompt an input, or the parameter "
                "a default)"
            ) from None
    try:
        return param.adapter.validate_json(input_json)
    except ValidationError as e:
        raise InputRefused(
            f"the input does not match {param.type_name}: {first_error(e)}"
        ) from None


async def call_handler(handler: Handler, ctx: RunContext, input_json: str | None) -> RunResult:
    """Call the handler for one round: its input validated first (InputRefused), and what
    it returns awaited (a call that returns no awaitable is a TypeError)."""
    param = input_parameter(handler)
    args: tuple[object, ...] = (ctx,)
    if param is not None:
        value = validated_input(param, input_json)
        if value is not _OMIT:
            args = (ctx, value)
    out = cast(Callable[..., object], handler)(*args)
    if not inspect.isawaitable(out):
        raise TypeError(
            f"the handler returned a {type(out).__name__}, not an awaitable: "
            "write it `async def run(ctx)`"
        )
    return cast(RunResult, await out)


def storable(text: str) -> str:
    """`text` with what no command may carry (NUL, lone surrogates) spelled out: a failure's
    reason is sent whatever it holds."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def result_text(value: object) -> str | None:
    """The run's result as the protocol carries it: a str as it is, None as null, any other
    JSON value, pydantic model or dataclass as its JSON text (compact, non-ASCII kept).
    ResultRefused otherwise."""
    if value is None:
        return None
    if isinstance(value, str):
        return str.__str__(value)  # a str subclass (an enum member, say) as plain text
    try:
        return json.dumps(
            value,
            ensure_ascii=False,
            allow_nan=False,
            separators=(",", ":"),
            default=dump_model,
        )
    except (TypeError, ValueError, RecursionError) as e:
        type_name = type(value).__name__
        raise ResultRefused(
            f"the handler returned a value of type {type_name}, which is not JSON ({e}): a "
            "run's result is a str, None, a JSON value (dict, list, int, float, bool) or a "
            "pydantic model",
            type_name,
        ) from e
