"""Abort signals: how a cancel (or a lost lease, or a deadline) reaches running code."""

from __future__ import annotations

import asyncio
import time

from sessionstream.errors import SessionstreamError

__all__ = ["AbortSignal", "RunAborted", "RunCancelled", "RunFenced"]


class RunAborted(SessionstreamError):
    """The run must stop: cancelled, fenced or finished elsewhere. `reason` says which."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RunCancelled(RunAborted):
    """The run is cancelling: new actions are refused, tools are signalled."""


class RunFenced(RunAborted):
    """This worker's generation is stale (lease lost) or the run already finished."""


class AbortSignal:
    """Set once; tools check `aborted`, `await wait()` or call `raise_if_aborted()`."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.reason: str | None = None
        #: time.time() when the abort was signalled (for latency measurements)
        self.aborted_at: float | None = None

    @property
    def aborted(self) -> bool:
        return self._event.is_set()

    def abort(self, reason: str) -> None:
        if not self._event.is_set():
            self.reason = reason
            self.aborted_at = time.time()
            self._event.set()

    async def wait(self) -> str:
        """Return the reason once aborted."""
        await self._event.wait()
        return self.reason or "aborted"

    async def sleep(self, seconds: float) -> bool:
        """Sleep unless aborted first; True if the full time passed."""
        try:
            # not `asyncio.wait_for`, which on Python 3.11 swallows a cancel that comes
            # in the same turn as the abort
            async with asyncio.timeout(seconds):
                await self._event.wait()
        except TimeoutError:
            return True
        return False

    def raise_if_aborted(self) -> None:
        if self.aborted:
            raise RunCancelled(self.reason or "aborted")
