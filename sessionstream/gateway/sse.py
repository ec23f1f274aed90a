"""``GET /v1/sessions/{sessionId}/events``: the session's events as Server-Sent Events.

Each event: ``id:`` its offset in `session.events` (a session lives on one partition, so
the offset alone orders and resumes it), ``event:`` its type, ``data:`` its JSON (the
seed's camelCase form). Live from the gateway's one `read_committed` tail; with
``Last-Event-ID: N`` (or ``?lastEventId=N``, for clients that cannot set headers) the
events after offset N are read first, then the live ones, without gap or repeat. A
client whose buffer of `gateway_sse_queue` events fills is sent ``event: overflow`` and
disconnected: it resumes with its last id.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent

from sessionstream.gateway.errors import ApiError
from sessionstream.gateway.fanout import EventFanout, Item, Overflow, Stopped

__all__ = ["event_stream", "parse_last_event_id"]

_DONE = object()


def parse_last_event_id(header: str | None, query: str | None) -> int | None:
    raw = header if header is not None else query
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(
            400, "invalid_last_event_id", f"Last-Event-ID must be an offset, not {raw!r}"
        ) from None
    if value < -1:
        raise ApiError(400, "invalid_last_event_id", "Last-Event-ID must be -1 or more")
    return value


def _unauthorized() -> ServerSentEvent:
    body = {"error": {"code": "unauthorized", "message": "the API key was revoked"}}
    return ServerSentEvent(data=json.dumps(body), event="unauthorized")


def _overflow(sent: int) -> ServerSentEvent:
    return ServerSentEvent(data=json.dumps({"lastEventId": sent}), event="overflow", id=str(sent))


def _sse(item: Item) -> ServerSentEvent:
    return ServerSentEvent(
        data=json.dumps(item.event.model_dump(by_alias=True, mode="json")),
        event=item.event.type,
        id=str(item.offset),
    )


#: a catch-up whose client takes nothing for this long is given up: its thread is freed and
#: the stream ends with ``event: overflow`` (the client resumes from its last id)
STALL_S = 30.0


async def _catch_up(
    fanout: EventFanout, session_id: str, tenant_id: str, start: int, end: int
) -> AsyncIterator[Item | Overflow]:
    """`fanout.catch_up` (a blocking read) on the fanout's catch-up threads, as an async
    iterator. A client that stops taking events holds the read for `STALL_S` at most; the
    iterator then ends with `Overflow`, never with a gap before the live part."""
    q: asyncio.Queue[object] = asyncio.Queue(256)
    loop = asyncio.get_running_loop()
    gone = threading.Event()

    def put(x: object) -> bool:
        fut = asyncio.run_coroutine_threadsafe(q.put(x), loop)
        waited = 0.0
        while True:
            try:
                fut.result(0.5)
                return True
            except concurrent.futures.TimeoutError:
                waited += 0.5
                # the client left, or takes nothing: nobody will take it
                if gone.is_set() or waited >= STALL_S:
                    fut.cancel()
                    return False

    def read() -> None:
        for item in fanout.catch_up(session_id, tenant_id, start, end):
            if not put(item):
                return
        put(_DONE)

    task = loop.run_in_executor(fanout.catch_up_threads, read)
    getter: asyncio.Future[object] | None = None
    try:
        while True:
            if q.empty() and task.done():
                break  # the read ended without its last mark taken: given up, or failed
            getter = asyncio.ensure_future(q.get())
            both: set[asyncio.Future[Any]] = {getter, task}
            done, _ = await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                continue
            got = getter.result()
            if got is _DONE:
                await task
                return
            assert isinstance(got, Item)
            yield got
        await task  # re-raises a failed read
        yield Overflow()
    finally:
        gone.set()
        if getter is not None and not getter.done():  # the client left while it waited
            getter.cancel()


def event_stream(
    fanout: EventFanout,
    session_id: str,
    tenant_id: str,
    last_id: int | None,
    ping_s: float,
    still_valid: Callable[[], Awaitable[bool]] | None = None,
    recheck_s: float = 5.0,
) -> EventSourceResponse:
    """The stream; `still_valid` is asked every `recheck_s` whether the caller's key is
    still live: once it is not (revoked), the stream ends with ``event: unauthorized``."""
    if not fanout.alive:
        raise ApiError(503, "events_unavailable", "the gateway's events tail has stopped")
    checked = [time.monotonic()]
    recheck = max(recheck_s, 0.5)  # a cache of 0 s: asked every half second, not in a spin

    async def revoked() -> bool:
        if still_valid is None or time.monotonic() - checked[0] < recheck:
            return False
        checked[0] = time.monotonic()
        return not await still_valid()

    async def events() -> AsyncIterator[ServerSentEvent]:
        sub, position = fanout.subscribe(session_id, tenant_id)
        sent = -1 if last_id is None else last_id
        try:
            if last_id is not None and last_id + 1 < position:
                async for item in _catch_up(fanout, session_id, tenant_id, last_id + 1, position):
                    if isinstance(item, Overflow):  # given up: the client resumes from `sent`
                        yield _overflow(sent)
                        return
                    if await revoked():
                        yield _unauthorized()
                        return
                    sent = item.offset
                    yield _sse(item)
            # tell the client where the live part starts (a comment, no event)
            yield ServerSentEvent(comment=f"live from offset {max(position, sent + 1)}")
            while True:
                got: Item | Overflow | Stopped | None
                try:
                    got = sub.queue.get_nowait()  # no timer when events are waiting
                except asyncio.QueueEmpty:
                    try:
                        got = await asyncio.wait_for(sub.queue.get(), recheck)
                    except TimeoutError:
                        got = None
                if await revoked():
                    yield _unauthorized()
                    return
                if got is None:
                    continue
                if isinstance(got, Stopped):
                    return
                if isinstance(got, Overflow):
                    yield _overflow(sent)
                    return
                if got.offset <= sent:
                    continue
                sent = got.offset
                yield _sse(got)
        finally:
            fanout.unsubscribe(sub)

    return EventSourceResponse(
        events(),
        ping=ping_s,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
