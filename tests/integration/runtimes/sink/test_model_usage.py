"""Model usage summed per run, session and tenant by PostgreSQL's views over the stored
`model.request.finished` events (migration 0008), on the real database. Expected sums are
worked out here from the events written, not read back from the views' own SQL."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal

import psycopg
import pytest
from psycopg.types.json import Jsonb

from sessionstream.adapters.postgres import connect
from sessionstream.adapters.postgres.migrate import migrate
from sessionstream.settings import get_settings

pytestmark = pytest.mark.integration


def _event(
    session: str, run: str, seq: int, type_: str, tenant: str, **payload: object
) -> tuple[object, ...]:
    body = {"workerId": "w-1", "name": "m", "callId": f"c{seq}", "detail": "ok", **payload}
    at = datetime(2026, 12, 6, 12, 0, seq, tzinfo=UTC)
    return (session, run, seq, type_, Jsonb(body), 1, f"cmd-{run}-{seq}", tenant, at, 0, seq)


def test_usage_is_summed_per_run_session_and_tenant() -> None:
    settings = get_settings()
    schema = f"it_usage_{uuid.uuid4().hex[:10]}"
    migrate(settings.database_conninfo, schema=schema)
    fin = "model.request.finished"
    rows = [
        # run r1 (session s1, tenant acme): two requests with usage, one without cost
        _event(
            "s1", "r1", 1, fin, "acme", inputTokens=10, outputTokens=5, costUsd=0.25, durationMs=100
        ),
        _event("s1", "r1", 2, fin, "acme", inputTokens=1, outputTokens=2, durationMs=50),
        # a request's start and a tool carry no usage and count for nothing
        _event("s1", "r1", 3, "model.request.started", "acme"),
        _event("s1", "r1", 4, "tool.finished", "acme", inputTokens=999),
        # run r2 of the same session: a model that reported nothing but its time
        _event("s1", "r2", 1, fin, "acme", durationMs=7),
        # another tenant's run
        _event("s9", "r9", 1, fin, "other", inputTokens=4, outputTokens=4, costUsd=1.5),
    ]
    try:
        with connect(settings, schema) as conn:
            conn.cursor().executemany(
                "insert into agent_run_events (session_id, run_id, seq, type, payload,"
                " generation, command_id, tenant_id, ts, kafka_partition, kafka_offset)"
                " values (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                rows,
            )
            conn.commit()
            runs = conn.execute(
                "select run_id, model_requests, input_tokens, output_tokens, cost_usd, model_ms"
                " from run_model_usage order by run_id"
            ).fetchall()
            sessions = conn.execute(
                "select session_id, runs, model_requests, input_tokens, output_tokens, cost_usd"
                " from session_model_usage order by session_id"
            ).fetchall()
            tenants = conn.execute(
                "select tenant_id, sessions, runs, input_tokens, output_tokens, cost_usd"
                " from tenant_model_usage order by tenant_id"
            ).fetchall()
    finally:
        with psycopg.connect(settings.database_conninfo, autocommit=True) as conn:
            conn.execute(f'drop schema "{schema}" cascade')
    assert runs == [
        ("r1", 2, 11, 7, Decimal("0.25"), 150),
        ("r2", 1, 0, 0, None, 7),
        ("r9", 1, 4, 4, Decimal("1.5"), 0),
    ]
    assert sessions == [("s1", 2, 3, 11, 7, Decimal("0.25")), ("s9", 1, 1, 4, 4, Decimal("1.5"))]
    assert tenants == [
        ("acme", 1, 2, 11, 7, Decimal("0.25")),
        ("other", 1, 1, 4, 4, Decimal("1.5")),
    ]
