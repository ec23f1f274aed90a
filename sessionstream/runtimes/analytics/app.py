"""`sessionstream analytics`: the fold as a faust-streaming app, its stats as JSON pages.

faust is the runtime only: it owns the consumer group, the table's changelog topic
(`{analytics_app_id}-analytics-changelog`), recovery and the web server. What is stored
and why a restart neither double counts nor loses is `sessionstream.runtimes.analytics.fold`'s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import faust
import httpx
from faust.exceptions import ConsumerNotStarted

from sessionstream.adapters.registry import reader_codec
from sessionstream.runtimes.analytics import shares, stats
from sessionstream.runtimes.analytics._transport import transport_class
from sessionstream.runtimes.analytics.facts import Rejection, RunFacts
from sessionstream.runtimes.analytics.fold import Folder
from sessionstream.settings import Settings

__all__ = ["TABLE_NAME", "build_app", "run_analytics", "state_dir"]

log = logging.getLogger("sessionstream.analytics")

TABLE_NAME = "analytics"
_DEFAULT_MINUTES = 60
#: how long a page waits for another instance's share
_PEER_TIMEOUT_S = 5.0
_R = TypeVar("_R", RunFacts, Rejection)


def state_dir(settings: Settings) -> Path:
    """faust's data directory (the memory store keeps nothing there but faust's own files)."""
    if settings.analytics_state_dir:
        return Path(settings.analytics_state_dir)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "sessionstream" / "analytics" / settings.analytics_app_id


def build_app(settings: Settings) -> tuple[Any, Folder]:
    """The faust App and the Folder it drives."""
    folder = Folder(
        retention_ms=settings.analytics_retention_minutes * 60_000,
        codec=reader_codec(settings),
    )
    app = faust.App(
        settings.analytics_app_id,
        broker=f"kafka://{settings.kafka_bootstrap}",
        processing_guarantee="at_least_once",
        store="memory://",
        datadir=str(state_dir(settings)),
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        topic_allow_declare=True,
        consumer_auto_offset_reset="earliest",
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=True,
        web_bind=settings.analytics_host,
        web_host=settings.analytics_host,
        web_port=settings.analytics_port,
        broker_session_timeout=6,
        broker_heartbeat_interval=1,
    )
    app.transport = transport_class(settings.events_topic, folder.resume_offset)(
        app.conf.broker_consumer, app
    )
    events = app.topic(
        settings.events_topic,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=settings.partitions,
    )
    table = app.Table(TABLE_NAME, key_type=bytes, value_type=bytes, partitions=settings.partitions)

    @table.on_recover
    async def _recovered() -> None:
        # runs before faust resumes the source partitions, so they are seeked to their
        # cursors while still paused and no record from another position slips in
        assigned = {
            tp.partition for tp in app.consumer.assignment() if tp.topic == settings.events_topic
        }
        try:
            folder.recovered(assigned, ((k.decode(), v) for k, v in table.items()))
        except Exception as e:
            # faust runs this callback in a task whose outcome it never reads: without this
            # the error vanished, no partition counted as owned, every event was skipped as
            # `unowned` and the stats read zero. A changelog this version cannot read (a
            # newer version's facts) stops the app, loudly, for a supervisor to see
            log.critical("analytics: the table's changelog cannot be recovered: %r", e)
            await app.crash(e)
            return
        consumer: Any = app.consumer  # the AnalyticsConsumer of transport_class
        await consumer.resume_source()
        log.info(
            "analytics: partitions %s, %d records, cursors %s",
            sorted(assigned),
            len(folder),
            {p: c.next_offset for p, c in sorted(folder.cursors().items())},
        )

    @app.agent(events)
    async def fold(stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            for key, value in folder.fold(msg.partition, msg.offset, msg.value):
                if value is None:
                    table.pop(key.encode(), None)
                else:
                    table[key.encode()] = value

    _pages(app, folder, settings)
    return app, folder


def _window(request: Any) -> stats.Window:
    q = request.query
    now = int(time.time() * 1000)
    until = int(q["until"]) if "until" in q else stats.minute_of(now) + stats.MINUTE_MS
    if "since" in q:
        since = int(q["since"])
    else:
        since = until - int(q.get("minutes", _DEFAULT_MINUTES)) * stats.MINUTE_MS
    return stats.Window(since=since, until=until, tenant=q.get("tenant"))


class _Peers:
    """This instance's share of a page and the shares of the app's other instances.

    The other instances are the members of the last rebalance as faust's assignor tells
    every member (`external_topics_metadata`: canonical URL -> partitions), asked over
    HTTP at `/stats/local`. A member that does not answer is left out; if that leaves a
    partition unserved, `shares.merge` says so instead of answering short.
    """

    def __init__(self, app: Any, folder: Folder, settings: Settings) -> None:
        self.app = app
        self.folder = folder
        self.settings = settings

    @property
    def url(self) -> str:
        return str(self.app.conf.canonical_url)

    def members(self) -> list[str]:
        """Canonical URLs of the group's members at the last rebalance, this one first."""
        assignor = self.app.assignor
        known = set(assignor.external_topics_metadata()) | set(assignor.tables_metadata())
        return [self.url, *sorted(known - {self.url})]

    def local(self, kind: shares.Kind, w: stats.Window) -> shares.Share:
        """The records of the partitions folded here and still assigned here (a revoked
        partition's records linger until the next recovery: they are not ours to serve)."""
        try:
            assigned = {
                tp.partition
                for tp in self.app.consumer.assignment()
                if tp.topic == self.settings.events_topic
            }
        except ConsumerNotStarted:
            assigned = set()
        served = self.folder.owned() & assigned
        cursors = self.folder.cursors()
        records = shares.select(kind, self.folder.runs(), self.folder.rejections(), w)
        return shares.Share(
            url=self.url,
            partitions={p: cursors[p].next_offset if p in cursors else 0 for p in served},
            records=[r for r in records if r.partition in served],
        )

    async def _ask(
        self, client: httpx.AsyncClient, url: str, kind: shares.Kind, w: stats.Window
    ) -> shares.Share | None:
        params = {"kind": kind, "since": str(w.since), "until": str(w.until)}
        if w.tenant is not None:
            params["tenant"] = w.tenant
        try:
            r = await client.get(f"{url}/stats/local", params=params)
            r.raise_for_status()
            return shares.Share.from_json(r.json())
        except (httpx.HTTPError, KeyError, TypeError, ValueError) as e:
            # down (killed, restarting) or a version this one cannot read: its partitions
            # are then unserved unless another member holds them
            log.info("analytics: peer %s not asked: %r", url, e)
            return None

    async def records(self, kind: shares.Kind, w: stats.Window) -> list[shares.Record]:
        """Every partition's records for a page (`shares.Incomplete` if one is unserved)."""
        others = self.members()[1:]
        got: list[shares.Share | None] = []
        if others:
            async with httpx.AsyncClient(timeout=_PEER_TIMEOUT_S, trust_env=False) as client:
                got = await asyncio.gather(*(self._ask(client, u, kind, w) for u in others))
        answered = [self.local(kind, w), *(g for g in got if g is not None)]
        return shares.merge(answered, self.settings.partitions)


def _pages(app: Any, folder: Folder, settings: Settings) -> None:
    peers = _Peers(app, folder, settings)

    def unserved(web: Any, e: shares.Incomplete) -> Any:
        body = {"error": {"code": "partitions_unserved", "message": str(e)}, "missing": e.missing}
        return web.json(body, status=503, headers={"Retry-After": "1"})

    async def answer(
        web: Any, kind: shares.Kind, w: stats.Window, page: Callable[[list[shares.Record]], Any]
    ) -> Any:
        """A page over every partition's records of `kind`, or 503 while one is unserved."""
        try:
            records = await peers.records(kind, w)
        except shares.Incomplete as e:
            return unserved(web, e)
        return web.json(page(records))

    @app.page("/stats/runs")  # type: ignore[untyped-decorator]
    async def runs(web: Any, request: Any) -> Any:
        w = _window(request)
        return await answer(web, "runs", w, lambda r: stats.runs(_of(RunFacts, r), w))

    @app.page("/stats/rejections")  # type: ignore[untyped-decorator]
    async def rejections(web: Any, request: Any) -> Any:
        w = _window(request)
        return await answer(web, "rejections", w, lambda r: stats.rejections(_of(Rejection, r), w))

    @app.page("/stats/cancel-latency")  # type: ignore[untyped-decorator]
    async def cancel_latency(web: Any, request: Any) -> Any:
        w = _window(request)
        return await answer(web, "finished", w, lambda r: stats.cancel_latency(_of(RunFacts, r), w))

    @app.page("/stats/durations")  # type: ignore[untyped-decorator]
    async def durations(web: Any, request: Any) -> Any:
        w = _window(request)
        return await answer(web, "finished", w, lambda r: stats.durations(_of(RunFacts, r), w))

    @app.page("/stats/active")  # type: ignore[untyped-decorator]
    async def active(web: Any, request: Any) -> Any:
        tenant = request.query.get("tenant")
        w = stats.Window(0, 0, tenant)
        return await answer(web, "active", w, lambda r: stats.active_runs(_of(RunFacts, r), tenant))

    @app.page("/stats/local")  # type: ignore[untyped-decorator]
    async def local(web: Any, request: Any) -> Any:
        # one instance's share, for the pages of its peers; never asks further
        kind = request.query.get("kind", "")
        if kind not in shares.KINDS:
            return web.json({"error": f"kind must be one of {sorted(shares.KINDS)}"}, status=400)
        return web.json(peers.local(kind, _window(request)).to_json())

    @app.page("/stats/progress")  # type: ignore[untyped-decorator]
    async def progress(web: Any, request: Any) -> Any:
        return web.json(
            {
                "url": peers.url,
                "members": peers.members(),
                "partitions": {
                    str(p): {
                        "nextOffset": c.next_offset,
                        "watermark": c.watermark,
                        "horizon": c.horizon,
                    }
                    for p, c in sorted(folder.cursors().items())
                },
                "records": len(folder),
                "fold": vars(folder.stats),
            }
        )


def _of(cls: type[_R], records: list[shares.Record]) -> list[_R]:
    return [r for r in records if isinstance(r, cls)]


def run_analytics(settings: Settings, log_level: str = "INFO") -> int:
    """Run until SIGTERM/SIGINT."""
    app, _ = build_app(settings)
    state_dir(settings).mkdir(parents=True, exist_ok=True)
    log.info(
        "analytics %s over %s on http://%s:%d/stats/",
        settings.analytics_app_id,
        settings.events_topic,
        settings.analytics_host,
        settings.analytics_port,
    )
    worker = faust.Worker(app, loglevel=log_level, quiet=True)
    worker.execute_from_commandline()
    return 0
