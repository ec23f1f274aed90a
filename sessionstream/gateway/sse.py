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
from collections.abc import AsyncIterator

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


def _sse(item: Item) -> ServerSentEvent:
    return ServerSentEvent(
        data=json.dumps(item.event.model_dump(by_alias=True, mode="json")),
        event=item.event.type,
        id=str(item.offset),
    )


async def _catch_up(
    fanout: EventFanout, session_id: str, tenant_id: str, start: int, end: int
) -> AsyncIterator[Item]:
    """`fanout.catch_up` (a blocking read) from a thread, as an async iterator."""
    q: asyncio.Queue[object] = asyncio.Queue(256)
    loop = asyncio.get_running_loop()
    gone = threading.Event()

    def put(x: object) -> bool:
        fut = asyncio.run_coroutine_threadsafe(q.put(x), loop)
        while True:
            try:
                fut.result(0.5)
                return True
            except concurrent.futures.TimeoutError:
                if gone.is_set():  # the client left: nobody will take it
                    fut.cancel()
                    return False

    def read() -> None:
        try:
            for item in fanout.catch_up(session_id, tenant_id, start, end):
                if not put(item):
                    return
        finally:
            put(_DONE)

    task = asyncio.ensure_future(asyncio.to_thread(read))
    try:
        while True:
            got = await q.get()
            if got is _DONE:
                break
            assert isinstance(got, Item)
            yield got
        await task  # re-raises a failed read
    finally:
        gone.set()


def event_stream(
    fanout: EventFanout, session_id: str, tenant_id: str, last_id: int | None, ping_s: float
) -> EventSourceResponse:
    if not fanout.alive:
        raise ApiError(503, "events_unavailable", "the gateway's events tail has stopped")

    async def events() -> AsyncIterator[ServerSentEvent]:
        sub, position = fanout.subscribe(session_id, tenant_id)
        sent = -1 if last_id is None else last_id
        try:
            if last_id is not None and last_id + 1 < position:
                async for item in _catch_up(fanout, session_id, tenant_id, last_id + 1, position):
                    sent = item.offset
                    yield _sse(item)
            # tell the client where the live part starts (a comment, no event)
            yield ServerSentEvent(comment=f"live from offset {max(position, sent + 1)}")
            while True:
                got = await sub.queue.get()
                if isinstance(got, Stopped):
                    return
                if isinstance(got, Overflow):
                    yield ServerSentEvent(
                        data=json.dumps({"lastEventId": sent}), event="overflow", id=str(sent)
                    )
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
