"""faust's aiokafka transport with the three changes analytics needs.

1. `read_committed`: faust reads `read_uncommitted` unless `processing_guarantee` is
   `exactly_once` (`AIOKafkaConsumerThread._create_worker_consumer`), and
   `session.events` is written in transactions.
2. Resume each source partition at the cursor recovered from the analytics table, never at
   the group's committed offset: faust may commit an offset before the table writes of
   the records below it reached Kafka (docs/decisions/0002-analytics.md). The app seeks
   in its recovery callback, while the partitions are paused, and again in faust's
   `perform_seek` (which would otherwise seek them to the committed offsets).
3. When faust drops a batch fetched during a rebalance, the changelog partitions recovery
   reads are fetched again from where recovery stands (faust leaves them past the dropped
   records, and recovery then waits for those forever).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from aiokafka import TopicPartition
from faust.transport.drivers import aiokafka as faust_aiokafka

__all__ = ["ResumeFn", "changelog_positions", "transport_class"]

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
        if not self.flow_active:
            await self._reread_changelogs()
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

    async def _reread_changelogs(self) -> None:
        """Put each changelog partition faust's recovery reads back where its reader stands.

        faust's `Consumer.getmany` drops a batch fetched while the flow is stopped and calls
        `perform_seek` to have it fetched again, but aiokafka's `seek_to_committed` leaves a
        partition without a committed offset where it is: past the dropped records. A
        changelog partition never has one, so when the dropped batch held the last records
        below the highwater, recovery waited for them forever (seen in CI after a kill -9:
        "No event received for active tp ... since recovery start", every partition
        unserved for minutes)."""
        recovery: Any = self.app.tables.recovery  # type: ignore[attr-defined]
        where = changelog_positions(
            set(self.assignment()),
            {tp: recovery.active_offsets[tp] for tp in recovery.active_tps},
            {tp: recovery.standby_offsets[tp] for tp in recovery.standby_tps},
        )
        if where:
            log.info(
                "analytics: a batch fetched during the rebalance was dropped; changelog "
                "partitions re-read from %s",
                {f"{tp.topic}[{tp.partition}]": o for tp, o in sorted(where.items())},
            )
            await self.seek_wait(where)


def changelog_positions(
    assigned: set[Any], actives: Mapping[Any, int | None], standbys: Mapping[Any, int | None]
) -> dict[Any, int]:
    """The offset to fetch each assigned changelog partition from again: the last offset
    recovery read, as faust's `Recovery._seek_offsets` seeks (one record read twice, which
    a table's changelog applies idempotently); -1 or None (nothing read) is the start."""
    out: dict[Any, int] = {}
    for offsets in (actives, standbys):
        for tp, offset in offsets.items():
            if tp in assigned:
                at = max(offset or 0, 0)
                # listed by both readers (a standby promoted): the earlier, never past one
                out[tp] = min(out.get(tp, at), at)
    return out


def transport_class(source_topic: str, resume_at: ResumeFn) -> type[Any]:
    """A faust Transport whose consumer reads committed and resumes `source_topic` at
    `resume_at(partition)` instead of the group's committed offsets."""
    consumer = type(
        "AnalyticsConsumer",
        (_Consumer,),
        {"source_topic": source_topic, "resume_at": staticmethod(resume_at)},
    )
    return type("AnalyticsTransport", (faust_aiokafka.Transport,), {"Consumer": consumer})
