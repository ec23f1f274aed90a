"""faust's aiokafka transport with the two changes analytics needs.

1. `read_committed`: faust reads `read_uncommitted` unless `processing_guarantee` is
   `exactly_once` (`AIOKafkaConsumerThread._create_worker_consumer`), and
   `session.events` is written in transactions.
2. Resume each source partition at the cursor recovered from the analytics table, not at
   faust's committed offset: faust may commit an offset before the table writes of the
   records below it reached Kafka (docs/decisions/0002-analytics.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from faust.transport.drivers import aiokafka as faust_aiokafka

__all__ = ["ResumeFn", "transport_class"]

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

    async def seek_to_committed(self) -> Mapping[Any, int]:
        # faust calls this after table recovery (Recovery.on_recovery_completed ->
        # perform_seek), so the recovered cursors are known by now
        offsets: dict[Any, Any] = dict(await super().seek_to_committed())
        resume_at = type(self).resume_at
        if resume_at is None:
            return offsets
        for tp in self.assignment():
            if tp.topic != self.source_topic:
                continue  # the table's changelog: faust's recovery owns it
            where = resume_at(tp.partition)
            if where is None:
                earliest = await self.earliest_offsets(tp)
                where = int(earliest.get(tp) or 0)
            await self.seek(tp, where)
            offsets[tp] = where
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
