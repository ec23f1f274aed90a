"""Commands from asyncio to Kafka and their outcomes back, through one `SessionClient`.

`SessionClient` is synchronous and not thread-safe: one owner drives it (its producer, its
tail of `session.events`, its reads of the processor's position). Here the owner is the
event loop. A request's command is handed to the client at the end of the loop's turn,
with the others of that turn (`submit_many`), and while any request waits, a timer every
`round_s` asks `collect` which outcomes are now known and resolves their futures. Neither
waits on the network: the calls that would (the client's first commands, a partition it has
not read yet, a record whose schema the registry must be asked for) raise `WouldWait` or
leave the records `held`, and are made again on the bridge's helper thread, while the loop
leaves the client alone until that call is done. So a gateway has one producer and one
tail consumer however many requests wait, and a command is produced in the request's own
turn of the loop.

It used to be a thread that owned the client and ran rounds of ``submit_many`` and
``collect(timeout=1 ms)``: every command then crossed two threads, each crossing waited
for the GIL behind the busy event loop (queued -> produced p50 2.2 ms, p99 11-15 ms at 64
requests in flight), and the thread's rounds cost CPU while requests waited
(decision 0003, eighth pass).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sessionstream.client import CommandHandle, Outcome, SessionClient, WouldWait
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


class _Helper(threading.Thread):
    """One daemon thread for the client calls that may wait on the network; each result
    (or exception) goes back to the event loop."""

    def __init__(self) -> None:
        super().__init__(name="gateway-commands", daemon=True)
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def run(self) -> None:
        while (job := self.jobs.get()) is not None:
            fn, loop, done = job
            try:
                got: tuple[bool, Any] = (True, fn())
            except Exception as e:
                got = (False, e)
            try:
                loop.call_soon_threadsafe(done, *got)
            except RuntimeError:  # the event loop is closed: nobody waits any more
                return


class CommandBridge:
    """Send commands and await their outcomes from asyncio (module docstring)."""

    def __init__(self, settings: Settings, *, round_s: float = 0.001) -> None:
        self.settings = settings
        #: how often outcomes are looked for while requests wait (a timer of the loop;
        #: none runs while nothing waits)
        self.round_s = round_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: SessionClient | None = None
        self._helper = _Helper()
        #: the helper thread holds the client: the loop does not touch it meanwhile
        self._busy = False
        self._closed = False
        self._flush_due = False
        self._timer: asyncio.TimerHandle | None = None
        # (session, command id) -> waiter, from the request until its result
        self._by_key: dict[tuple[str, str], _Waiter] = {}
        #: not yet handed to the client
        self._queued: list[_Waiter] = []
        #: handed to the client in a call the helper thread makes
        self._sending: list[_Waiter] = []
        #: sent: id(handle) -> waiter
        self._waiting: dict[int, _Waiter] = {}
        self.sent = 0
        #: clients replaced after a failed round
        self.restarts = 0
        #: (queued -> produced, produced -> outcome) in seconds, the latest few thousand
        self._timings: deque[tuple[float, float]] = deque(maxlen=5000)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._helper.start()
        self._new_client()

    @property
    def alive(self) -> bool:
        """Commands are taken (until `close`; the helper thread runs)."""
        return not self._closed and self._helper.is_alive()

    def close(self) -> None:
        """Fail what waits ("the gateway is stopping"), then close the client on the helper
        thread (at most 10 s for a call it is in)."""
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        stopping = SessionstreamError("the gateway is stopping")
        for w in self._queued + self._sending + list(self._waiting.values()):
            self._settle(w, stopping)
        self._queued, self._sending = [], []
        self._waiting.clear()
        if self._helper.is_alive():
            client = self._client
            if client is not None:
                self._helper.jobs.put((client.close, self._loop, _ignore))
            self._helper.jobs.put(None)
            self._helper.join(10)

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
            self._queued.append(w)
            self._kick()
        return await fut

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

    # -- on the event loop ------------------------------------------------------------------
    def _kick(self) -> None:
        """Hand the queued commands to the client at the end of this turn of the loop."""
        if not self._flush_due and not self._closed:
            assert self._loop is not None
            self._flush_due = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        if self._busy or self._closed or self._client is None:
            return  # the helper's call, or the new client, kicks again when done
        if self._queued:
            self._send(self._client)
        if not self._busy and self._waiting and self._timer is None:
            assert self._loop is not None
            self._timer = self._loop.call_later(self.round_s, self._tick)

    def _send(self, client: SessionClient) -> None:
        new, self._queued = self._queued, []
        commands = [w.command for w in new]
        try:
            handles = client.submit_many(commands, wait=False)
        except WouldWait:
            self._sending = new

            def submit() -> list[CommandHandle] | SessionstreamError:
                try:
                    return client.submit_many(commands)
                except SessionstreamError as e:
                    return e

            self._offload(submit, lambda got: self._sent(new, got))
            return
        except SessionstreamError as e:
            for w in new:
                self._settle(w, e)
            return
        except Exception as e:  # not the SDK's: these fail, and the round with them
            self._sending = new
            self._failed(e)
            return
        self._sent(new, handles)

    def _sent(self, new: list[_Waiter], got: list[CommandHandle] | SessionstreamError) -> None:
        self._sending = []
        if isinstance(got, SessionstreamError):
            for w in new:
                self._settle(w, got)
            return
        now = time.monotonic()
        for w, h in zip(new, got, strict=True):
            w.handle, w.sent_at = h, now
            self._waiting[id(h)] = w
        self.sent += len(new)

    def _tick(self) -> None:
        self._timer = None
        client = self._client
        if self._busy or self._closed or client is None or not self._waiting:
            return
        handles = [w.handle for w in self._waiting.values() if w.handle is not None]
        try:
            got = client.collect(handles, 0, wait=False)
        except Exception as e:
            self._failed(e)
            return
        self._collected(got)
        if client.held:  # records whose schema the registry must be asked for
            handles = [w.handle for w in self._waiting.values() if w.handle is not None]
            self._offload(lambda: client.collect(handles, 0), self._collected)
        elif self._waiting:
            assert self._loop is not None
            self._timer = self._loop.call_later(self.round_s, self._tick)

    def _collected(self, got: list[tuple[CommandHandle, Outcome | SessionstreamError]]) -> None:
        now = time.monotonic()
        for handle, result in got:
            w = self._waiting.pop(id(handle), None)
            if w is None:
                continue
            if isinstance(result, Outcome):
                self._timings.append((w.sent_at - w.queued_at, now - w.sent_at))
            self._settle(w, result)
        assert self._client is not None
        for key, w in list(self._waiting.items()):
            if now > w.deadline:
                assert w.handle is not None
                self._client.release(w.handle)
                del self._waiting[key]
                self._settle(w, None)

    def _offload(self, fn: Callable[[], Any], then: Callable[[Any], None]) -> None:
        """`then(fn())` with `fn` on the helper thread; the loop leaves the client alone
        until it is done. An exception from `fn` fails the round (`_failed`)."""
        assert self._loop is not None
        self._busy = True

        def done(ok: bool, value: Any) -> None:
            self._busy = False
            if self._closed:
                return
            if ok:
                then(value)
            else:
                self._failed(value)
            self._kick()

        self._helper.jobs.put((fn, self._loop, done))

    def _failed(self, e: BaseException) -> None:
        """A round failed (Kafka gone past the SDK's own deadlines, anything unexpected):
        the requests it sent fail with the error, and a new `SessionClient` takes over after
        `RESTART_S`; what is queued meanwhile waits for it. One bad round never leaves the
        gateway without commands."""
        log.error(
            "gateway: a round of the commands failed; a new client follows",
            exc_info=(type(e), e, e.__traceback__),
        )
        error = (
            e
            if isinstance(e, SessionstreamError)
            else SessionstreamError(f"the gateway's Kafka thread failed: {e!r}")
        )
        for w in self._sending + list(self._waiting.values()):
            self._settle(w, error)
        self._sending = []
        self._waiting.clear()
        self.restarts += 1
        old, self._client = self._client, None
        if old is not None:
            self._helper.jobs.put((old.close, self._loop, _ignore))
        assert self._loop is not None
        self._loop.call_later(RESTART_S, self._new_client)

    def _new_client(self) -> None:
        if self._closed:
            return
        client = SessionClient("gateway", self.settings, fetch_wait_ms=5)
        self._client = client

        def prepare() -> None:
            # the tail of outcomes waits 5 ms at the broker, not the SDK's 100 ms: many
            # requests wait on it
            try:
                client.prepare()
            except SessionstreamError as e:
                log.warning("gateway: Kafka not ready (%s); retried per request", e)

        self._offload(prepare, _ignore)

    def _settle(self, w: _Waiter, result: Result) -> None:
        key = (w.command.session_id, w.command.command_id)
        if self._by_key.get(key) is w:
            del self._by_key[key]
        for fut in w.futures:
            if not fut.done():  # the request may have gone (client disconnected)
                fut.set_result(result)


def _ignore(*_: Any) -> None:
    pass


def _content(c: Command) -> tuple[object, ...]:
    return (c.type, c.run_id, c.tenant_id, c.actor, c.payload.model_dump())
