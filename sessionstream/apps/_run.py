"""Running the long-lived processes until SIGTERM/SIGINT, with clear errors on the way."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

from sessionstream.adapters._gc import settle_collector
from sessionstream.errors import SessionstreamError, SingleWriterViolation
from sessionstream.settings import settings_for

__all__ = ["run_processor", "run_sink", "stop_on_signals"]

log = logging.getLogger("sessionstream")


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT, so loops end between batches."""
    stop = threading.Event()

    def handler(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %s: stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def run_processor(instance: str | None) -> int:
    settings = settings_for("processor")
    from sessionstream.adapters.kafka.transactions import Stopping
    from sessionstream.runtimes.processor import TransactionalProcessor

    proc = TransactionalProcessor(settings, instance_id=instance)
    stop = stop_on_signals()
    try:
        try:
            proc.start(stop)
        except Stopping as e:
            log.info("processor stopped before it started: %s", e)
            return 0
        # started (topics checked, producers ready, group joined): a backlog allocates
        # ~100 tracked objects per command, and at CPython's thresholds the collections
        # rescanning what the process holds took 13 % of its CPU (decision 0005)
        frozen = settle_collector()
        log.info("garbage collector settled: %s start-up objects frozen", frozen)
        log.info(
            "processor %s consuming %s",
            proc.instance_id,
            ", ".join(
                (settings.commands_topic, settings.worker_commands_topic, settings.timers_topic)
            ),
        )
        proc.run(stop)
    except SessionstreamError as e:
        log.error("%s", e)
        return 2
    log.info("processor stopped: %s", proc.stats)
    return 0


def run_sink(batch_size: int, linger_ms: int, mode: str) -> int:
    from sessionstream.runtimes.sink.sink import Sink

    settings = settings_for("sink")
    sink = Sink(settings, batch_size=batch_size, linger_ms=linger_ms, mode=mode)  # type: ignore[arg-type]
    stop = stop_on_signals()
    try:
        sink.start()
        log.info("sink writing %s into PostgreSQL (%s mode)", settings.events_topic, mode)
        sink.run(stop)
    except SingleWriterViolation as e:
        log.critical("SINGLE-WRITER VIOLATION: %s", e)
        return 3
    except SessionstreamError as e:
        log.error("%s", e)
        return 2
    log.info("sink stopped: %s batches, %s events", sink.stats.batches, sink.stats.events)
    return 0
