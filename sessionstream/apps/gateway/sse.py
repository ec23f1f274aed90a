"""``GET /v1/sessions/{sessionId}/events``: the session's events as Server-Sent Events.

Each event: ``id:`` its offset in `session.events` (a session lives on one partition, so
the offset alone orders and resumes it), ``event:`` its type, ``data:`` its JSON (the
seed's camelCase form). Live from the gateway's one `read_committed` tail; with
``Last-Event-ID: N`` (or ``?lastEventId=N``, for clients that cannot set headers) the
events after offset N are read first, then the live ones, without gap or repeat.

What one client may hold, so one tenant never slows another:
- a catch-up is read a page at a time (`gateway_catch_up_page_bytes`) on the catch-up
  threads; a thread is held only while it reads a page, and one tenant reads at most
  `gateway_catch_up_per_tenant` pages at once (`CatchUpSlots`);
- a client that takes nothing for `gateway_sse_send_timeout_s` is closed (one write waits
  that long on its full socket); it resumes with its last id;
- the live buffer is bounded by `gateway_sse_queue` events and `gateway_sse_queue_bytes`:
  a client that falls behind is sent ``event: overflow`` and closed;
- open streams are counted per key and per tenant (`StreamCounts`, in `limits`).

Token deltas of the session's streaming model calls come as ``event: model.delta`` with
no ``id:`` (`runId`, `callId`, `seq`, `text`): a view of the answer being written, live
only (never replayed on resume) and dropped first for a client that falls behind; the
finished step and ``model.request.finished`` hold the whole answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.sse import SendTimeoutError
from starlette.types import Receive, Scope, Send

from sessionstream.apps.gateway.errors import ApiError
from sessionstream.apps.gateway.fanout import Delta, EventFanout, Item, Overflow, Stopped
from sessionstream.apps.gateway.protocol import ABORT_EXTENSION
from sessionstream.errors import KafkaUnavailable
from sessionstream.schemas.sessions import local_session_id

__all__ = ["CatchUpSlots", "StreamLimits", "event_stream", "parse_last_event_id"]

log = logging.getLogger("sessionstream.apps.gateway")

#: an offset as the stream sent it: digits (at most 19, an int64), or -1 for "from the start"
_LAST_ID = re.compile(r"-1|[0-9]{1,19}")


def parse_last_event_id(header: str | None, query: str | None) -> int | None:
    raw = header if header is not None else query
    if raw is None or raw == "":
        return None
    if not _LAST_ID.fullmatch(raw):
        raise ApiError(
            400,
            "invalid_last_event_id",
            f"Last-Event-ID must be an event's id (digits) or -1, not {raw[:40]!r}",
        )
    return int(raw)


class CatchUpSlots:
    """At most `per_tenant` catch-up pages of one tenant being read at once. A slot is
    given back when the page's read ends on its thread (not when the stream that asked
    leaves: a client that reconnects in a loop cannot pile reads onto the threads)."""

    def __init__(self, per_tenant: int) -> None:
        self.per_tenant = per_tenant
        self._sems: dict[str, asyncio.Semaphore] = {}
        self._users: dict[str, int] = {}

    async def read(
        self, tenant_id: str, fanout: EventFanout, session_id: str, start: int, end: int, size: int
    ) -> tuple[list[Item], int]:
        loop = asyncio.get_running_loop()
        sem = self._sems.get(tenant_id)
        if sem is None:
            sem = self._sems[tenant_id] = asyncio.Semaphore(self.per_tenant)
        self._users[tenant_id] = self._users.get(tenant_id, 0) + 1
        try:
            await sem.acquire()
        except BaseException:
            self._leave(tenant_id)
            raise
        try:
            job = fanout.catch_up_threads.submit(
                fanout.read_page, session_id, tenant_id, start, end, size
            )
        except BaseException:
            sem.release()
            self._leave(tenant_id)
            raise

        def done(_: object) -> None:
            sem.release()
            self._leave(tenant_id)

        job.add_done_callback(lambda f: loop.call_soon_threadsafe(done, f))
        return await asyncio.wrap_future(job)

    def _leave(self, tenant_id: str) -> None:
        n = self._users[tenant_id] - 1
        if n:
            self._users[tenant_id] = n
        else:  # no reader of this tenant left: forget it (tenants are not kept forever)
            del self._users[tenant_id]
            del self._sems[tenant_id]


@dataclass
class StreamLimits:
    """How a stream behaves towards its client (from the settings)."""

    ping_s: float
    send_timeout_s: float
    page_bytes: int
    recheck_s: float = 5.0


async def _catch_up(
    fanout: EventFanout,
    slots: CatchUpSlots,
    session_id: str,
    tenant_id: str,
    start: int,
    end: int,
    page_bytes: int,
) -> AsyncIterator[Item]:
    """The session's events in `[start, end)`, a page at a time."""
    pos = start
    while pos < end:
        items, pos = await slots.read(tenant_id, fanout, session_id, pos, end, page_bytes)
        for item in items:
            yield item


def _unauthorized() -> ServerSentEvent:
    body = {"error": {"code": "unauthorized", "message": "the API key was revoked"}}
    return ServerSentEvent(data=json.dumps(body), event="unauthorized")


def _overflow(sent: int) -> ServerSentEvent:
    return ServerSentEvent(data=json.dumps({"lastEventId": sent}), event="overflow", id=str(sent))


def _delta(delta: Delta) -> ServerSentEvent:
    """A token delta: its own event type and no id (a view: never resumed)."""
    data = dict(delta.data)
    data["sessionId"] = local_session_id(str(data.get("tenantId")), str(data.get("sessionId")))
    return ServerSentEvent(data=json.dumps(data), event="model.delta")


def _sse(item: Item) -> ServerSentEvent:
    data = item.event.model_dump(by_alias=True, mode="json")
    # the id the tenant knows the session by (sessionstream.schemas.sessions)
    data["sessionId"] = local_session_id(item.event.tenant_id, item.event.session_id)
    return ServerSentEvent(data=json.dumps(data), event=item.event.type, id=str(item.offset))


class _Stream(EventSourceResponse):
    """An event stream that calls `on_close` once it is over, however it ends (also when
    its body never started: the client left before)."""

    def __init__(self, *args: object, on_close: Callable[[], None], **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except SendTimeoutError:
            log.info(
                "gateway: an event stream's client took nothing for %g s: closed "
                "(it resumes with its last id)",
                self.send_timeout,
            )
            abort = scope.get("extensions", {}).get(ABORT_EXTENSION)
            if abort is not None:  # our protocol: drop the socket (its buffer stays full)
                abort()
        finally:
            self._on_close()


def event_stream(
    fanout: EventFanout,
    slots: CatchUpSlots,
    session_id: str,
    tenant_id: str,
    last_id: int | None,
    limits: StreamLimits,
    *,
    still_valid: Callable[[], Awaitable[bool]] | None = None,
    on_close: Callable[[], None] = lambda: None,
) -> EventSourceResponse:
    """The stream of the session whose full id is `session_id`; `still_valid` is asked
    every `limits.recheck_s` whether the caller's key is still live: once it is not
    (revoked), the stream ends with ``event: unauthorized``. `on_close` runs once when
    the stream is over (the caller counted it open)."""
    if not fanout.alive:
        on_close()
        raise ApiError(503, "events_unavailable", "the gateway's events tail has stopped")
    checked = [time.monotonic()]
    page_bytes = limits.page_bytes
    recheck = max(limits.recheck_s, 0.5)  # a cache of 0 s: asked every half second

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
                try:
                    async for item in _catch_up(
                        fanout, slots, session_id, tenant_id, last_id + 1, position, page_bytes
                    ):
                        if await revoked():
                            yield _unauthorized()
                            return
                        sent = item.offset
                        yield _sse(item)
                except KafkaUnavailable as e:
                    # the stream ends where it got to; the client resumes from there
                    log.warning("gateway: a catch-up of %s failed: %s", session_id, e)
                    return
            # tell the client where the live part starts (a comment, no event)
            yield ServerSentEvent(comment=f"live from offset {max(position, sent + 1)}")
            while True:
                got: Item | Delta | Overflow | Stopped | None
                try:
                    got = sub.taken(sub.queue.get_nowait())  # no timer when events wait
                except asyncio.QueueEmpty:
                    try:
                        got = sub.taken(await asyncio.wait_for(sub.queue.get(), recheck))
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
                if isinstance(got, Delta):
                    yield _delta(got)
                    continue
                if got.offset <= sent:
                    continue
                sent = got.offset
                yield _sse(got)
        finally:
            fanout.unsubscribe(sub)

    return _Stream(
        events(),
        ping=limits.ping_s,
        send_timeout=limits.send_timeout_s,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        on_close=on_close,
    )
