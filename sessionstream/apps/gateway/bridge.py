"""Commands from asyncio to Kafka and their outcomes back, through one `SessionClient`.

`SessionClient` is synchronous and not thread-safe: one thread owns it (its producer, its
tail of `session.events`, its reads of the processor's position). Requests hand commands
to that thread through a queue; each round it sends everything queued with
`submit_many` and asks `collect` which outcomes are now known, and resolves the waiting
requests' futures on their event loop (`call_soon_threadsafe`). So a gateway has one
producer and one tail consumer however many requests wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from sessionstream.client import CommandHandle, Outcome, SessionClient
from sessionstream.errors import SessionstreamError
from sessionstream.schemas.commands import Command
from sessionstream.settings import Settings

__all__ = ["CommandBridge", "InFlight"]

log = logging.getLogger("sessionstream.apps.gateway")

#: what a future resolves to: the outcome, None (no outcome within its wait), or the error
Result = Outcome | SessionstreamError | None
#: pause before a new client replaces one whose round failed
RESTART_S = 1.0


class InFlight(SessionstreamError):
    """Another request with the same session and command id, but other content, waits."""


@dataclass
class _Waiter:
    command: Command
    deadline: float
    futures: list[asyncio.Future[Result]] = field(default_factory=list)
    handle: CommandHandle | None = None
    queued_at: float = field(default_factory=time.monotonic)
    sent_at: float = 0.0


class CommandBridge:
    """Send commands and await their outcomes from asyncio; one thread does the Kafka work."""

    def __init__(self, settings: Settings, *, round_s: float = 0.001) -> None:
        self.settings = settings
        #: longest a round waits for outcomes; a request arriving meanwhile is sent at the
        #: next round (librdkafka's poll cannot be woken): 5 ms rounds were ~8 ms of the
        #: HTTP p50 at 100/s, 1 ms rounds cost a few % of a core while requests wait
        self.round_s = round_s
        self._inbox: queue.SimpleQueue[_Waiter] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gateway-commands", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        # (session, command id) -> waiter; touched by the event loop only
        self._by_key: dict[tuple[str, str], _Waiter] = {}
        self.sent = 0
        #: clients replaced after a failed round
        self.restarts = 0
        #: (queued -> produced, produced -> outcome) in seconds, the latest few thousand
        self._timings: deque[tuple[float, float]] = deque(maxlen=5000)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread.start()

    @property
    def alive(self) -> bool:
        """The commands thread runs (it stops only on `close` or a failure)."""
        return self._thread.is_alive()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    async def execute(self, command: Command, wait_s: float) -> Result:
        """Send `command` and return its outcome, or None if none came within `wait_s`.

        A second request for the same session and command id while the first waits shares
        its outcome if it is the same command (a client's retry), and raises `InFlight`
        otherwise."""
        if not self.alive:  # closed: no round would ever resolve it
            return SessionstreamError("the gateway's commands thread has stopped")
        loop = asyncio.get_running_loop()
        key = (command.session_id, command.command_id)
        fut: asyncio.Future[Result] = loop.create_future()
        same = self._by_key.get(key)
        if same is not None:
            if _content(same.command) != _content(command):
                raise InFlight(f"command {command.command_id} is in flight with other content")
            same.futures.append(fut)
        else:
            w = _Waiter(command, time.monotonic() + wait_s, [fut])
            self._by_key[key] = w
            self._inbox.put(w)
        return await fut

    # -- the Kafka thread -------------------------------------------------------------------
    def timings(self) -> dict[str, Any]:
        """Percentiles (ms) of the recent commands' time in the gateway before they were
        produced, and from produced to their outcome."""
        samples = list(self._timings)
        out: dict[str, Any] = {"samples": len(samples)}
        for i, name in enumerate(("queuedToProducedMs", "producedToOutcomeMs")):
            values = sorted(x[i] for x in samples)
            out[name] = (
                {
                    f"p{q}": round(
                        values[min(len(values) - 1, int(len(values) * q / 100))] * 1000, 1
                    )
                    for q in (50, 99)
                }
                if values
                else None
            )
        return out

    def _run(self) -> None:
        """Until `close`: rounds of sending what is queued and resolving what is known. A
        round that fails (Kafka gone past the SDK's own deadlines, anything unexpected)
        fails the requests waiting then with the error, and a new `SessionClient` takes
        over after `RESTART_S`: one bad round never leaves the gateway without commands."""
        waiting: list[_Waiter] = []
        while not self._stop.is_set():
            # its tail's fetches wait at the broker as the SDK's do (LIVE_FETCH_WAIT_MS):
            # a commit answers a parked fetch at once, so 5 ms brought no outcome sooner
            # and cost the broker ~170 fetches a second while the gateway idled
            client = SessionClient("gateway", self.settings)
            failed = False
            try:
                try:
                    client.prepare()
                except SessionstreamError as e:
                    log.warning("gateway: Kafka not ready (%s); retried per request", e)
                self._rounds(client, waiting)
            except Exception as e:
                log.exception(
                    "gateway: a round of the commands thread failed; a new client follows"
                )
                error = (
                    e
                    if isinstance(e, SessionstreamError)
                    else SessionstreamError(f"the gateway's Kafka thread failed: {e!r}")
                )
                for w in waiting:
                    self._resolve(w, error)
                waiting.clear()
                self.restarts += 1
                failed = True
            finally:
                with contextlib.suppress(Exception):
                    client.close()
            if failed:
                self._stop.wait(RESTART_S)
        # stopping: nothing is left waiting for a round that will not come
        stopping = SessionstreamError("the gateway is stopping")
        with contextlib.suppress(RuntimeError):  # the event loop already closed
            for w in waiting + self._take(block=False):
                self._resolve(w, stopping)

    def _rounds(self, client: SessionClient, waiting: list[_Waiter]) -> None:
        """Rounds until `close`; `waiting` (kept in place) holds the requests sent and not
        yet resolved, so a round that raises leaves them to `_run` to fail."""
        while not self._stop.is_set():
            new = self._take(block=not waiting)
            if new:
                self._send(client, new)
                waiting.extend(w for w in new if w.handle is not None)
            if not waiting:
                continue
            by_handle = {id(w.handle): w for w in waiting}
            for handle, result in client.collect(
                [w.handle for w in waiting if w.handle is not None], self.round_s
            ):
                w = by_handle.pop(id(handle))
                self._resolve(w, result)
            now = time.monotonic()
            for w in list(by_handle.values()):
                if now > w.deadline:
                    assert w.handle is not None
                    client.release(w.handle)
                    by_handle.pop(id(w.handle))
                    self._resolve(w, None)
            waiting[:] = by_handle.values()

    def _take(self, *, block: bool) -> list[_Waiter]:
        out: list[_Waiter] = []
        try:
            out.append(self._inbox.get(timeout=0.05) if block else self._inbox.get_nowait())
            while len(out) < 1000:
                out.append(self._inbox.get_nowait())
        except queue.Empty:
            pass
        return out

    def _send(self, client: SessionClient, new: list[_Waiter]) -> None:
        try:
            handles = client.submit_many([w.command for w in new])
        except SessionstreamError as e:
            for w in new:
                self._resolve(w, e)
            return
        except Exception as e:  # not the SDK's: these fail, and the round with them
            for w in new:
                self._resolve(w, SessionstreamError(f"the gateway's Kafka thread failed: {e!r}"))
            raise
        now = time.monotonic()
        for w, h in zip(new, handles, strict=True):
            w.handle = h
            w.sent_at = now
        self.sent += len(new)

    def _resolve(self, w: _Waiter, result: Result) -> None:
        assert self._loop is not None
        if w.sent_at and isinstance(result, Outcome):
            self._timings.append((w.sent_at - w.queued_at, time.monotonic() - w.sent_at))
        self._loop.call_soon_threadsafe(self._settle, w, result)

    def _settle(self, w: _Waiter, result: Result) -> None:
        # on the event loop: no request can join `w` after this
        key = (w.command.session_id, w.command.command_id)
        if self._by_key.get(key) is w:
            del self._by_key[key]
        for fut in w.futures:
            if not fut.done():  # the request may have gone (client disconnected)
                fut.set_result(result)


def _content(c: Command) -> tuple[object, ...]:
    return (c.type, c.run_id, c.tenant_id, c.actor, c.payload.model_dump())
