"""`sessionstream stats`: analytics on the run event stream, straight from PostgreSQL."""

from __future__ import annotations

from typing import Any

import psycopg

__all__ = ["run_stats"]


def _all(conn: psycopg.Connection[Any], sql: str) -> list[tuple[Any, ...]]:
    return conn.execute(sql).fetchall()


def run_stats(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """Runs by terminal status, durations, cancel latency, time-outs, rejections — per tenant."""
    pct = (
        "percentile_cont(0.5) within group (order by {x}) p50,"
        " percentile_cont(0.95) within group (order by {x}) p95,"
        " percentile_cont(0.99) within group (order by {x}) p99"
    )
    dur = "extract(epoch from terminal_at - created_at) * 1000"
    cancel = "extract(epoch from terminal_at - cancel_requested_at) * 1000"
    by_status = _all(
        conn,
        "select tenant_id, coalesce(terminal_status, status), count(*)"
        " from agent_runs group by 1, 2 order by 1, 2",
    )
    durations = _all(
        conn,
        f"select tenant_id, count(*), {pct.format(x=dur)} from agent_runs"
        " where terminal_at is not null group by 1 order by 1",
    )
    cancels = _all(
        conn,
        f"select tenant_id, count(*), {pct.format(x=cancel)} from agent_runs"
        " where status = 'cancelled' and cancel_requested_at is not null"
        " group by 1 order by 1",
    )
    rejections = _all(
        conn,
        "select tenant_id, payload->>'reason', count(*) from agent_run_events"
        " where type = 'command.rejected' group by 1, 2 order by 1, 3 desc",
    )
    conn.rollback()

    def ms(v: Any) -> float | None:
        return None if v is None else round(float(v), 1)

    tenants: dict[str, dict[str, Any]] = {}

    def t(name: str) -> dict[str, Any]:
        return tenants.setdefault(
            name,
            {
                "runs": {},
                "duration_ms": None,
                "cancel_latency_ms": None,
                "timed_out": 0,
                "rejections": {},
            },
        )

    for tenant, status, n in by_status:
        t(tenant)["runs"][status] = n
        if status == "timed_out":
            t(tenant)["timed_out"] = n
    for tenant, n, p50, p95, p99 in durations:
        t(tenant)["duration_ms"] = {"n": n, "p50": ms(p50), "p95": ms(p95), "p99": ms(p99)}
    for tenant, n, p50, p95, p99 in cancels:
        t(tenant)["cancel_latency_ms"] = {"n": n, "p50": ms(p50), "p95": ms(p95), "p99": ms(p99)}
    for tenant, reason, n in rejections:
        t(tenant)["rejections"][reason] = n
    return {"tenants": tenants}
