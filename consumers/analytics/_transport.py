"""faust's aiokafka transport with the two changes analytics needs.

1. `read_committed`: faust reads `read_uncommitted` unless `processing_guarantee` is
   `exactly_once` (`AIOKafkaConsumerThread._create_worker_consumer`), and
   `session.events` is written in transactions.
2. Resume each source partition at the cursor recovered from the analytics table, never at
   the group's committed offset: faust may commit an offset before the table writes of
   the records below it reached Kafka (docs/decisions/0002-analytics.md). The app seeks
   in its recovery callback, while the partitions are paused, and again in faust's
   `perform_seek` (which would otherwise seek them to the committed offsets).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from aiokafka import TopicPartition
from faust.transport.drivers import aiokafka as faust_aiokafka

__all__ = ["ResumeFn", "transport_class"]

log = logging.getLogger("sessionstream.analytics")

#: partition of the source topic -> offset to resume at (None: the partition's beginning)
ResumeFn = Callable[[int], int | None]


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # read by AIOKafkaConsumer.start() when it builds its Fetcher
        consumer._isolation_level = "read_committed"
        return consumer


class _Consumer(faust_aiokafka.Consumer):
    source_topic: str = ""
    resume_at: ResumeFn | None = None

    def _new_consumer_thread(self) -> Any:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def resume_source(self) -> dict[Any, int]:
        """Seek every assigned partition of the source topic to `resume_at(partition)`."""
        resume_at = type(self).resume_at
        assert resume_at is not None
        out: dict[Any, int] = {}
        for tp in self.assignment():
            if tp.topic != self.source_topic:
                continue
            where = resume_at(tp.partition)
            if where is None:
                earliest = await self.earliest_offsets(tp)
                where = int(earliest.get(tp) or 0)
            out[tp] = where
        if out:
            # in the consumer's thread: faust's Consumer.seek changes aiokafka's fetcher from
            # the calling thread, racing its fetch loop (KeyError in fetched_records)
            await self.seek_wait(out)
        return out

    async def seek_to_committed(self) -> Mapping[Any, int]:
        # faust's perform_seek, after recovery and right after it resumed the source
        # partitions: seeking them to the group's committed offsets first would let the
        # fetcher hand over records from there, past a cursor that lags the commit
        if type(self).resume_at is None:
            return dict(await super().seek_to_committed())
        others = [tp for tp in self.assignment() if tp.topic != self.source_topic]
        offsets: dict[Any, Any] = {}
        if others:
            consumer = self._thread._ensure_consumer()
            offsets.update(
                await self._thread.call_thread(
                    consumer.seek_to_committed,
                    *(TopicPartition(tp.topic, tp.partition) for tp in others),
                )
            )
        resumed = await self.resume_source()
        for tp, where in sorted(resumed.items()):
            log.info("analytics: %s[%d] resumes at offset %d", tp.topic, tp.partition, where)
        offsets.update(resumed)
        return offsets


def transport_class(source_topic: str, resume_at: ResumeFn) -> type[Any]:
    """A faust Transport whose consumer reads committed and resumes `source_topic` at
    `resume_at(partition)` instead of the group's committed offsets."""
    consumer = type(
        "AnalyticsConsumer",
        (_Consumer,),
        {"source_topic": source_topic, "resume_at": staticmethod(resume_at)},
    )
    return type("AnalyticsTransport", (faust_aiokafka.Transport,), {"Consumer": consumer})
