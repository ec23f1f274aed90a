"""A PostgreSQL round trip with psycopg 3 against the configured database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import psycopg
import pytest
from psycopg.types.json import Jsonb

pytestmark = pytest.mark.integration


def test_insert_commit_select_roundtrip(pg_conn: psycopg.Connection[tuple[object, ...]]) -> None:
    table = f"it_roundtrip_{uuid.uuid4().hex[:12]}"
    row_id, at = uuid.uuid4(), datetime(2026, 1, 2, 3, 4, 5, 600000, tzinfo=UTC)
    payload = {"sessionId": "s-1", "seq": 7, "text": "héllo"}
    try:
        pg_conn.execute(
            f"create table {table} (id uuid primary key, at timestamptz not null, payload jsonb)"
        )
        pg_conn.execute(f"insert into {table} values (%s, %s, %s)", (row_id, at, Jsonb(payload)))
        pg_conn.commit()

        # A second connection sees the committed row: it really is in the database.
        with psycopg.connect(pg_conn.info.dsn, password=pg_conn.info.password) as other:
            row = other.execute(f"select id, at, payload from {table}").fetchone()
        assert row == (row_id, at, payload)

        # Uncommitted work rolls back; a duplicate key is the database's conflict error.
        pg_conn.execute(f"insert into {table} values (%s, %s, null)", (uuid.uuid4(), at))
        pg_conn.rollback()
        with pytest.raises(psycopg.errors.UniqueViolation):
            pg_conn.execute(f"insert into {table} values (%s, %s, null)", (row_id, at))
        pg_conn.rollback()
        count = pg_conn.execute(f"select count(*) from {table}").fetchone()
        assert count == (1,)
    finally:
        pg_conn.rollback()
        pg_conn.execute(f"drop table if exists {table}")
        pg_conn.commit()
