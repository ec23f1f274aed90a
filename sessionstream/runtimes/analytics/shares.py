"""Several `sessionstream analytics` instances, one answer: each instance's share of the
records, and their merge by partition.

faust splits the events partitions between the instances of one app id (one consumer
group), so each instance folds, and holds, only its partitions' records. A page asked of
any instance gathers every instance's `Share` (the records of the partitions it serves,
already cut to the page's window) and aggregates their merge with the same functions a
single instance uses (`sessionstream.runtimes.analytics.stats`), so percentiles stay exact.

The merge takes each partition from exactly one share, so a partition two instances both
hold for a moment (one has it revoked, the other has recovered it) is never counted twice;
the holder that folded further wins. A partition no share holds (an instance killed and its
partitions not taken over yet, or still recovering) makes the merge `Incomplete`: a page
then answers 503 rather than totals that are silently short.

Pure: no I/O, no faust.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from sessionstream.errors import SessionstreamError
from sessionstream.runtimes.analytics.facts import Rejection, RunFacts, fact_from_json, fact_to_json
from sessionstream.runtimes.analytics.stats import Window

__all__ = ["KINDS", "Incomplete", "Kind", "Share", "merge", "select"]

#: which records a page needs: runs started or finished in the window (`runs`), runs
#: finished in it (`finished`: latencies, durations), runs active now (`active`), and
#: rejections made in it (`rejections`)
Kind = Literal["runs", "finished", "active", "rejections"]
KINDS: Final[frozenset[str]] = frozenset({"runs", "finished", "active", "rejections"})

Record = RunFacts | Rejection


class Incomplete(SessionstreamError):
    """No share holds these partitions: an answer from the others would be short."""

    def __init__(self, missing: Sequence[int], asked: Sequence[str]) -> None:
        self.missing = sorted(missing)
        self.asked = list(asked)
        super().__init__(
            f"events partitions {self.missing} are served by no analytics instance that "
            f"answered ({', '.join(self.asked) or 'none'}); retry after the rebalance"
        )


@dataclass(frozen=True)
class Share:
    """One instance's answer: the partitions it serves (-> next offset folded) and their
    records that a page of `kind` needs."""

    url: str
    partitions: dict[int, int]
    records: list[Record]

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "partitions": {str(p): n for p, n in sorted(self.partitions.items())},
            "records": [fact_to_json(r) for r in self.records],
        }

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Share:
        """KeyError, TypeError or ValueError for a body this version cannot read."""
        records: list[Record] = []
        for item in body["records"]:
            fact = fact_from_json(item)
            if not isinstance(fact, (RunFacts, Rejection)):
                raise TypeError(f"not a run or a rejection: {fact!r}")
            records.append(fact)
        partitions = {int(p): int(n) for p, n in body["partitions"].items()}
        return cls(url=str(body["url"]), partitions=partitions, records=records)


def select(
    kind: Kind, runs: Iterable[RunFacts], rejections: Iterable[Rejection], w: Window
) -> list[Record]:
    """The records a page of `kind` over `w` reads (`active` ignores the window's times)."""
    if kind == "rejections":
        return [x for x in rejections if w.holds(x.at, x.tenant_id)]
    if kind == "active":
        return [r for r in runs if r.active and (w.tenant is None or r.tenant_id == w.tenant)]
    if kind == "finished":
        return [r for r in runs if w.holds(r.finished_at, r.tenant_id)]
    return [
        r for r in runs if w.holds(r.started_at, r.tenant_id) or w.holds(r.finished_at, r.tenant_id)
    ]


def merge(shares: Iterable[Share], partitions: int) -> list[Record]:
    """The records of partitions `0..partitions-1`, each partition from one share: the one
    that folded it furthest (ties: the first). Raises `Incomplete` if any is held by none."""
    shares = list(shares)
    owner: dict[int, tuple[int, int]] = {}  # partition -> (next offset, share index)
    for i, share in enumerate(shares):
        for p, next_offset in share.partitions.items():
            if p not in owner or next_offset > owner[p][0]:
                owner[p] = (next_offset, i)
    missing = [p for p in range(partitions) if p not in owner]
    if missing:
        raise Incomplete(missing, [s.url for s in shares])
    return [
        r
        for i, share in enumerate(shares)
        for r in share.records
        if owner.get(r.partition, (0, -1))[1] == i
    ]
