"""What is done on one partition of the events topic, and what may be committed.

Events finish out of order (another session's event, another endpoint, one waiting to be
retried), so the offset committed is the first event not done for every endpoint it was
for; nothing below it is ever read again. What is done above it rides along in the
commit's metadata (Kafka keeps a string with each committed offset), so the next owner of
the partition — this process restarted, or another instance after a rebalance — skips it:
an endpoint that answered 2xx before a clean stop, or before its partition moved, is not
sent the event again. After a kill -9 the last commit (a second old at most) is what the
next owner reads: events done since are sent again (at least once).

The metadata is a compact JSON object: ``r``, ranges of offsets (relative to the committed
one) done for every endpoint, and ``p``, offsets done for some endpoints (indexes into
``s``, the subscription ids). It is cut to fit the broker's limit (4096 bytes by default):
what does not fit is sent again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["MAX_METADATA", "Done", "Ledger", "parse_metadata"]

#: bytes of metadata a commit carries at most (the broker's offset.metadata.max.bytes
#: defaults to 4096)
MAX_METADATA: Final = 3800


@dataclass(frozen=True)
class Done:
    """What a previous owner finished above its committed offset: ranges of offsets done
    for every endpoint (`all`, inclusive), and offsets done for some (`some`: offset ->
    subscription ids)."""

    all: tuple[tuple[int, int], ...] = ()
    some: dict[int, frozenset[str]] = field(default_factory=dict)

    def finished(self, offset: int) -> frozenset[str] | None:
        """The subscriptions `offset` is done for; None: done for every one."""
        if any(a <= offset <= b for a, b in self.all):
            return None
        return self.some.get(offset, frozenset())


def parse_metadata(committed: int, text: str | None) -> Done:
    """The `Done` of a committed offset's metadata (empty when it is not ours)."""
    if not text or not text.startswith("{"):
        return Done()
    try:
        raw = json.loads(text)
        subs = [str(s) for s in raw.get("s", [])]
        ranges = tuple((committed + int(a), committed + int(b)) for a, b in raw.get("r", []))
        some = {
            committed + int(o): frozenset(subs[int(i)] for i in idx)
            for o, idx in raw.get("p", {}).items()
        }
    except (ValueError, TypeError, IndexError, AttributeError):
        return Done()  # someone else's metadata, or cut badly: it only costs re-sends
    return Done(ranges, some)


class _Entry:
    """An event with deliveries (`pending`, then `done`), or once every delivery is done a
    run of finished offsets up to `last` (the events without any delivery after it join
    it, so a partition held up by one retrying event keeps one entry per event that had
    deliveries, not one per event read)."""

    __slots__ = ("done", "last", "offset", "pending")

    def __init__(self, offset: int, pending: set[str]) -> None:
        self.offset = self.last = offset
        self.pending = pending
        self.done: set[str] = set()


class Ledger:
    """The events of one partition read so far and not yet below the committable offset."""

    def __init__(self, start: int | None = None) -> None:
        #: the committable offset (None until the first record, when nothing was committed)
        self.start = start
        self._entries: dict[int, _Entry] = {}  # by first offset, in offset order

    def add(self, offset: int, pending: set[str]) -> None:
        """An event read at `offset`, to be delivered to `pending` (may be empty)."""
        if self.start is None:
            self.start = offset
        if not pending:
            if not self._entries:
                self.start = offset + 1  # nothing open below it: past it at once
                return
            last = next(reversed(self._entries.values()))
            if not last.pending:
                last.last = offset
                return
        self._entries[offset] = _Entry(offset, set(pending))

    def done(self, offset: int, subscription_id: str) -> None:
        """The event at `offset` is finished for this subscription (delivered, dead-lettered
        or dropped with its subscription)."""
        entry = self._entries.get(offset)
        if entry is None or subscription_id not in entry.pending:
            return
        entry.pending.discard(subscription_id)
        entry.done.add(subscription_id)
        self._advance()

    def _advance(self) -> None:
        while self._entries:
            first = next(iter(self._entries.values()))
            if first.pending:
                return
            del self._entries[first.offset]
            self.start = first.last + 1

    @property
    def open(self) -> int:
        """Events read and not finished for every endpoint."""
        return sum(1 for e in self._entries.values() if e.pending)

    def position(self) -> tuple[int, str] | None:
        """The offset to commit and its metadata; None before the first record."""
        if self.start is None:
            return None
        return self.start, self._metadata(self.start)

    def _metadata(self, base: int) -> str:
        # in offset order: runs done for every endpoint are ranges (offsets between them
        # that compaction removed are never read, so a range may cover them); an event
        # done for some endpoints lists them; one done for none only breaks a range
        items: list[tuple[int, int, tuple[str, ...] | None]] = []
        for e in self._entries.values():
            done = None if not e.pending else tuple(sorted(e.done))
            items.append((e.offset - base, e.last - base, done))
        text = _encode(items)
        if len(text) <= MAX_METADATA:
            return text
        low, high = 0, len(items)  # the longest prefix that fits: the rest is sent again
        while low < high:
            mid = (low + high + 1) // 2
            if len(_encode(items[:mid])) <= MAX_METADATA:
                low = mid
            else:
                high = mid - 1
        return _encode(items[:low])


def _encode(items: list[tuple[int, int, tuple[str, ...] | None]]) -> str:
    subs: dict[str, int] = {}
    ranges: list[list[int]] = []
    some: dict[str, list[int]] = {}
    extend = False
    for first, last, done in items:
        if done is None:
            if extend:
                ranges[-1][1] = last
            else:
                ranges.append([first, last])
            extend = True
            continue
        extend = False
        if done:
            some[str(first)] = [subs.setdefault(s, len(subs)) for s in done]
    if not ranges and not some:
        return ""
    body: dict[str, Any] = {}
    if ranges:
        body["r"] = ranges
    if some:
        body["s"] = list(subs)
        body["p"] = some
    return json.dumps(body, separators=(",", ":"))
