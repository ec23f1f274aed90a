"""`sessionstream webhooks redeliver`: send one subscription its events again, from the log.

From chosen offsets (or a time, which the caller turns into offsets) to where each
partition ends when it starts (read_committed), the subscription's tenant's events of
its types are delivered as the deliverer does: in order per session, retried with the
same back-off, buried when the tries run out. The subscription's start offsets do not
apply (redelivery is asked for; history included). An event delivered 2xx has its dead
letter, if it had one, deleted. The running deliverers are not involved: a receiver
dedupes by ``webhook-id`` whatever both send.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass
from typing import Final

from sessionstream.adapters.kafka import LogRecord, log_bounds, read_records
from sessionstream.adapters.postgres import connect
from sessionstream.adapters.registry import reader_codec
from sessionstream.errors import ConfigurationError, IncompatibleEvent
from sessionstream.runtimes.webhooks.backoff import RetryPolicy
from sessionstream.runtimes.webhooks.deliverer import event_body, sealer_of
from sessionstream.runtimes.webhooks.dispatch import DeadLetter, Dispatcher, Job, Outcome, Send
from sessionstream.runtimes.webhooks.dispatch import Target as Endpoint
from sessionstream.runtimes.webhooks.filters import matches
from sessionstream.runtimes.webhooks.guard import AddressPolicy, Resolver
from sessionstream.runtimes.webhooks.ledger import Ledger
from sessionstream.runtimes.webhooks.sender import Sender
from sessionstream.runtimes.webhooks.signing import secret_bytes
from sessionstream.runtimes.webhooks.store import (
    Subscription,
    forget_dead_letters,
    live_subscriptions,
    record_dead_letter,
)
from sessionstream.schemas.codec import Codec
from sessionstream.schemas.errors import DecodeError
from sessionstream.settings import Settings

__all__ = ["RedeliveryReport", "redeliver"]

#: deliveries waiting at most (reading pauses beyond), and records read per batch
_QUEUE: Final = 1000
_BATCH: Final = 500


@dataclass
class RedeliveryReport:
    """What a redelivery read and did."""

    subscription_id: str
    read: int = 0
    matched: int = 0
    delivered: int = 0
    dead_letters: int = 0
    dead_letters_cleared: int = 0
    #: partition -> (first offset read, end offset)
    ranges: dict[int, tuple[int, int]] | None = None


def _load(settings: Settings, subscription_id: str) -> tuple[Subscription, bytes]:
    with connect(settings) as conn:
        for sub, sealed in live_subscriptions(conn):
            if sub.subscription_id == subscription_id:
                return sub, sealed
    raise ConfigurationError(f"no live webhook {subscription_id}")


async def redeliver(
    settings: Settings,
    subscription_id: str,
    starts: dict[int, int],
    *,
    send: Send | None = None,
    resolver: Resolver | None = None,
) -> RedeliveryReport:
    """Deliver `subscription_id` its events from `starts` (partition -> first offset) to
    the partitions' ends now; returns when every one is delivered or buried."""
    sub, sealed = await asyncio.to_thread(_load, settings, subscription_id)
    secret = secret_bytes(sealer_of(settings).open(sealed, subscription_id))
    endpoint = Endpoint(sub.subscription_id, sub.url, secret)
    topic = settings.events_topic
    bounds = await asyncio.to_thread(log_bounds, settings, [(topic, p) for p in starts])
    ranges = {
        p: (max(start, bounds[(topic, p)][0]), bounds[(topic, p)][1]) for p, start in starts.items()
    }
    ranges = {p: r for p, r in ranges.items() if r[0] < r[1]}
    report = RedeliveryReport(subscription_id, ranges=ranges)
    if not ranges:
        return report
    sender = None
    if send is None:
        sender = Sender(AddressPolicy.of(settings), settings.webhooks_timeout_s, resolver=resolver)
        send = sender
    delivered: list[str] = []
    outer = send

    async def counted(target: Endpoint, job: Job) -> Outcome:
        outcome = await outer(target, job)
        if outcome.ok:
            delivered.append(job.event_id)
        return outcome

    async def bury(dead: DeadLetter) -> None:
        report.dead_letters += 1

        def write() -> None:
            with connect(settings) as conn:
                record_dead_letter(conn, dead)

        await asyncio.to_thread(write)

    policy = RetryPolicy(
        settings.webhooks_max_attempts, settings.webhooks_backoff_s, settings.webhooks_backoff_max_s
    )
    # one endpoint: the backlog bounds what is read ahead, never what is buried
    dispatcher = Dispatcher(
        counted, bury, policy, concurrency=settings.webhooks_concurrency, backlog=10 * _QUEUE
    )
    for p, (first, _end) in ranges.items():
        dispatcher.open(p, Ledger(first))
    codec = reader_codec(settings)
    # the reader thread hands batches over a bounded queue: reading waits for delivering
    batches: queue.Queue[list[LogRecord] | None] = queue.Queue(4)
    halt = threading.Event()

    def hand(item: list[LogRecord] | None) -> bool:
        while not halt.is_set():
            try:
                batches.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        batch: list[LogRecord] = []
        try:
            for rec in read_records(
                settings,
                {topic: list(ranges)},
                start={(topic, p): r[0] for p, r in ranges.items()},
                end={(topic, p): r[1] for p, r in ranges.items()},
            ):
                batch.append(rec)
                if len(batch) >= _BATCH and not hand(batch):
                    return
                if len(batch) >= _BATCH:
                    batch = []
            if batch:
                hand(batch)
        finally:
            hand(None)

    reader = asyncio.get_running_loop().run_in_executor(None, read)
    try:
        while (got := await asyncio.to_thread(batches.get)) is not None:
            for rec in got:
                await _submit(rec, codec, sub, endpoint, dispatcher, report)
        await reader
        await dispatcher.drained()
    finally:
        halt.set()
        await dispatcher.stop()
        if sender is not None:
            await sender.aclose()
    report.delivered = len(delivered)

    def clear() -> int:
        with connect(settings) as conn:
            return forget_dead_letters(conn, subscription_id, delivered)

    report.dead_letters_cleared = await asyncio.to_thread(clear)
    return report


async def _submit(
    rec: LogRecord,
    codec: Codec,
    sub: Subscription,
    endpoint: Endpoint,
    dispatcher: Dispatcher,
    report: RedeliveryReport,
) -> None:
    report.read += 1
    if rec.value is None:
        return  # a tombstone: an erased session's event
    try:
        event = codec.decode_event(rec.value or b"")
    except DecodeError as e:
        raise IncompatibleEvent(
            f"undecodable event at {rec.topic}[{rec.partition}]@{rec.offset}: {e}"
        ) from e
    if event.tenant_id != sub.tenant_id or not matches(sub.event_types, event.type):
        return
    report.matched += 1
    while dispatcher.waiting >= _QUEUE:
        await asyncio.sleep(0.02)
    dispatcher.ledger(rec.partition).add(rec.offset, {sub.subscription_id})
    job = Job(
        rec.partition,
        rec.offset,
        event.key,
        event.session_id,
        event.type,
        event_body(event),
        rec.timestamp,
    )
    dispatcher.submit(job, [endpoint])
