"""What the runtime asks of an agent's handler, and what becomes of what it returns.

A handler is `async def run(ctx)`: everything it calls on `ctx` (model, tools, actions,
compaction) is awaited, so a plain `def` could not use the run at all. It is refused when
the worker is built, not discovered on the first run.

The run's result is a string on the wire (`run.complete {result: string | null}`). A
handler may return a str (sent as it is), None, or any other JSON value (dict, list, int,
float, bool), which is sent as its JSON text. Anything else is refused with its type named.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from typing import Any

from sessionstream.errors import ConfigurationError, SessionstreamError
from sessionstream.runtimes.worker.context import RunContext

__all__ = ["Handler", "ResultRefused", "RunResult", "check_handler", "result_text"]

#: what a handler may return: a str, None, or a JSON value (sent as its JSON text)
RunResult = str | int | float | bool | list[Any] | dict[str, Any] | None

Handler = Callable[[RunContext], Awaitable[RunResult]]


class ResultRefused(SessionstreamError):
    """A handler returned a value the run's result cannot carry; `type_name` is its type."""

    def __init__(self, message: str, type_name: str) -> None:
        super().__init__(message)
        self.type_name = type_name


def _is_async(fn: Callable[..., object]) -> bool:
    # a function (or functools.partial of one), or an instance whose __call__ is async
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def check_handler(handler: object, name: str | None = None) -> Handler:
    """`handler` if it is an `async def` taking the context; ConfigurationError otherwise,
    saying how to write it."""
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
    return handler


def result_text(value: object) -> str | None:
    """The run's result as the protocol carries it: a str as it is, None as null, any other
    JSON value as its JSON text (compact, non-ASCII kept). ResultRefused otherwise."""
    if value is None:
        return None
    if isinstance(value, str):
        return str.__str__(value)  # a str subclass (an enum member, say) as plain text
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as e:
        type_name = type(value).__name__
        raise ResultRefused(
            f"the handler returned a value of type {type_name}, which is not JSON ({e}): a "
            "run's result is a str, None, or a JSON value (dict, list, int, float, bool)",
            type_name,
        ) from e
