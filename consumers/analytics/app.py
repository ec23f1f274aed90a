"""`sessionstream analytics`: the fold as a faust-streaming app, its stats as JSON pages.

faust is the runtime only: it owns the consumer group, the table's changelog topic
(`{analytics_app_id}-analytics-changelog`), recovery and the web server. What is stored
and why a restart neither double counts nor loses is `consumers.analytics.fold`'s.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import faust

from consumers.analytics import stats
from consumers.analytics._transport import transport_class
from consumers.analytics.fold import Folder
from sessionstream.registry import reader_codec
from sessionstream.settings import Settings

__all__ = ["TABLE_NAME", "build_app", "run_analytics", "state_dir"]

log = logging.getLogger("sessionstream.analytics")

TABLE_NAME = "analytics"
_DEFAULT_MINUTES = 60


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

    _pages(app, folder)
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


def _pages(app: Any, folder: Folder) -> None:
    @app.page("/stats/runs")  # type: ignore[untyped-decorator]
    async def runs(web: Any, request: Any) -> Any:
        return web.json(stats.runs(folder.runs(), _window(request)))

    @app.page("/stats/rejections")  # type: ignore[untyped-decorator]
    async def rejections(web: Any, request: Any) -> Any:
        return web.json(stats.rejections(folder.rejections(), _window(request)))

    @app.page("/stats/cancel-latency")  # type: ignore[untyped-decorator]
    async def cancel_latency(web: Any, request: Any) -> Any:
        return web.json(stats.cancel_latency(folder.runs(), _window(request)))

    @app.page("/stats/durations")  # type: ignore[untyped-decorator]
    async def durations(web: Any, request: Any) -> Any:
        return web.json(stats.durations(folder.runs(), _window(request)))

    @app.page("/stats/active")  # type: ignore[untyped-decorator]
    async def active(web: Any, request: Any) -> Any:
        return web.json(stats.active_runs(folder.runs(), request.query.get("tenant")))

    @app.page("/stats/progress")  # type: ignore[untyped-decorator]
    async def progress(web: Any, request: Any) -> Any:
        return web.json(
            {
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
