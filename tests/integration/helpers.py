"""Polling helpers for integration tests: wait for a condition with a deadline, no blind sleeps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from sessionstream.adapters.registry import reader_codec
from sessionstream.core import log_check
from sessionstream.core.log_check import LogReport, Record
from sessionstream.core.state import SessionState
from sessionstream.schemas.codec import Codec
from sessionstream.settings import get_settings

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T | None],
    *,
    timeout: float = 30.0,
    interval: float = 0.1,
    what: str | Callable[[], str],
) -> T:
    """Call ``condition`` until it returns something truthy and return it; fail at the deadline.

    ``what`` names the condition in the failure; a callable is asked then, so the message can
    say how far the wait got (what was read, what is still missing)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {_say(what)}")
        time.sleep(interval)


async def await_until(
    condition: Callable[[], Awaitable[T | None]],
    *,
    timeout: float = 30.0,
    interval: float = 0.1,
    what: str | Callable[[], str],
) -> T:
    """Async twin of :func:`wait_until`."""
    deadline = time.monotonic() + timeout
    while True:
        value = await condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {_say(what)}")
        await asyncio.sleep(interval)


def _say(what: str | Callable[[], str]) -> str:
    return what() if callable(what) else what


def check_log(records: Iterable[Record], codec: Codec | None = None, limit: int = 50) -> LogReport:
    """`sessionstream.core.log_check.check_log` with a codec that reads registry-framed events."""
    return log_check.check_log(records, codec or reader_codec(get_settings()), limit)


def fold_log(records: Iterable[Record], codec: Codec | None = None) -> dict[str, SessionState]:
    """`sessionstream.core.log_check.fold_log` with a codec that reads registry-framed events."""
    return log_check.fold_log(records, codec or reader_codec(get_settings()))
