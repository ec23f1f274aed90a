"""Read-side aggregation: per-minute and per-tenant numbers from the folded records.

Pure functions over `RunFacts` / `Rejection` records, computed when asked. Minutes are
buckets of event time (`ts // 60000`), named by their start in epoch ms. The JSON shapes
are documented in docs/analytics.md.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from sessionstream.runtimes.analytics.facts import Rejection, RunFacts
from sessionstream.schemas.events import TERMINAL_STATUSES

__all__ = [
    "STATUS_FIELDS",
    "Window",
    "active_runs",
    "cancel_latency",
    "durations",
    "percentile",
    "rejections",
    "runs",
]

MINUTE_MS: Final = 60_000
#: terminal status -> its field in the JSON rows
STATUS_FIELDS: Final = {s: "timedOut" if s == "timed_out" else s for s in sorted(TERMINAL_STATUSES)}


@dataclass(frozen=True)
class Window:
    """Event-time range `[since, until)` in epoch ms, optionally one tenant."""

    since: int
    until: int
    tenant: str | None = None

    def holds(self, ts: int | None, tenant: str) -> bool:
        return (
            ts is not None
            and self.since <= ts < self.until
            and (self.tenant is None or tenant == self.tenant)
        )

    def to_json(self) -> dict[str, Any]:
        return {"since": self.since, "until": self.until, "tenantId": self.tenant}


def minute_of(ts: int) -> int:
    return ts - ts % MINUTE_MS


def percentile(sorted_values: list[int], p: float) -> int | None:
    """Nearest-rank percentile (an observed value, exact on small samples)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def _summary(values: list[int]) -> dict[str, Any]:
    values = sorted(values)
    return {
        "count": len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": values[-1] if values else None,
    }


def _run_row() -> dict[str, int]:
    return {"started": 0, **{f: 0 for f in STATUS_FIELDS.values()}}


def runs(records: Iterable[RunFacts], w: Window) -> dict[str, Any]:
    """Runs started and finished (by terminal status), per minute and tenant."""
    rows: dict[tuple[int, str], dict[str, int]] = defaultdict(_run_row)
    totals: dict[str, dict[str, int]] = defaultdict(_run_row)
    for r in records:
        if w.holds(r.started_at, r.tenant_id):
            assert r.started_at is not None
            rows[(minute_of(r.started_at), r.tenant_id)]["started"] += 1
            totals[r.tenant_id]["started"] += 1
        if r.terminal_status in STATUS_FIELDS and w.holds(r.finished_at, r.tenant_id):
            assert r.finished_at is not None
            field = STATUS_FIELDS[r.terminal_status]
            rows[(minute_of(r.finished_at), r.tenant_id)][field] += 1
            totals[r.tenant_id][field] += 1
    return {
        "window": w.to_json(),
        "minutes": [{"minute": m, "tenantId": t, **row} for (m, t), row in sorted(rows.items())],
        "totals": dict(sorted(totals.items())),
    }


def rejections(records: Iterable[Rejection], w: Window) -> dict[str, Any]:
    """`command.rejected` events by reason, per minute and tenant."""
    rows: Counter[tuple[int, str, str]] = Counter()
    totals: dict[str, Counter[str]] = defaultdict(Counter)
    for x in records:
        if w.holds(x.at, x.tenant_id):
            rows[(minute_of(x.at), x.tenant_id, x.reason)] += 1
            totals[x.tenant_id][x.reason] += 1
    return {
        "window": w.to_json(),
        "minutes": [
            {"minute": m, "tenantId": t, "reason": r, "count": n}
            for (m, t, r), n in sorted(rows.items())
        ],
        "totals": {t: dict(sorted(c.items())) for t, c in sorted(totals.items())},
    }


def _spread(w: Window, samples: Iterable[tuple[RunFacts, int]]) -> dict[str, Any]:
    """Summaries of one value per finished run (ms): overall, per minute of the finish and
    per tenant."""
    everything: list[int] = []
    by_minute: dict[int, list[int]] = defaultdict(list)
    by_tenant: dict[str, list[int]] = defaultdict(list)
    for r, value in samples:
        assert r.finished_at is not None
        everything.append(value)
        by_minute[minute_of(r.finished_at)].append(value)
        by_tenant[r.tenant_id].append(value)
    return {
        "window": w.to_json(),
        "unit": "ms",
        "overall": _summary(everything),
        "minutes": [{"minute": m, **_summary(v)} for m, v in sorted(by_minute.items())],
        "tenants": {t: _summary(v) for t, v in sorted(by_tenant.items())},
    }


def cancel_latency(records: Iterable[RunFacts], w: Window) -> dict[str, Any]:
    """`run.cancel_requested` -> `run.finished {cancelled}` in ms, bucketed by the finish."""
    return _spread(
        w,
        (
            (r, r.cancel_latency_ms)
            for r in records
            if r.cancel_latency_ms is not None and w.holds(r.finished_at, r.tenant_id)
        ),
    )


def durations(records: Iterable[RunFacts], w: Window) -> dict[str, Any]:
    """`run.started` -> `run.finished` in ms of event time, bucketed by the finish, per
    terminal status (`byStatus`) and tenant."""
    finished = [
        (r, max(0, r.finished_at - r.started_at))
        for r in records
        if r.started_at is not None
        and r.finished_at is not None
        and r.terminal_status is not None
        and w.holds(r.finished_at, r.tenant_id)
    ]
    by_status: dict[str, list[int]] = defaultdict(list)
    for r, d in finished:
        assert r.terminal_status is not None
        by_status[STATUS_FIELDS.get(r.terminal_status, r.terminal_status)].append(d)
    return {
        **_spread(w, finished),
        "byStatus": {st: _summary(v) for st, v in sorted(by_status.items())},
    }


def active_runs(records: Iterable[RunFacts], tenant: str | None = None) -> dict[str, Any]:
    """Runs started and not finished, now, per tenant."""
    counts: Counter[str] = Counter(
        r.tenant_id for r in records if r.active and (tenant is None or r.tenant_id == tenant)
    )
    return {"total": sum(counts.values()), "tenants": dict(sorted(counts.items()))}
