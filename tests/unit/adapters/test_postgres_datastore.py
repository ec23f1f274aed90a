"""The PostgreSQL datastore: the driver's connection errors become `DatabaseUnavailable`
once, at the adapter, naming the database without its password; SQL errors pass through;
`Reconnecting` retries a lost database and gives up when told to stop. No database needed:
a refused port is the lost database."""

from __future__ import annotations

import socket
import threading

import psycopg
import pytest

from sessionstream.adapters.postgres import Reconnecting, connect, connect_kwargs, translated
from sessionstream.errors import DatabaseUnavailable
from sessionstream.settings import Settings


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends: refused


def _nowhere() -> Settings:
    url = f"postgresql://someone:s3cret-pw@127.0.0.1:{_closed_port()}/db"
    return Settings(database_url=url, database_schema="tenant_a")


def test_an_unreachable_database_is_database_unavailable_without_the_password() -> None:
    with pytest.raises(DatabaseUnavailable) as info:
        connect(_nowhere(), timeout_s=2)
    assert "s3cret-pw" not in str(info.value)
    assert "someone@127.0.0.1" in info.value.url
    assert isinstance(info.value.__cause__, psycopg.OperationalError)


def test_sql_errors_are_not_translated() -> None:
    with pytest.raises(psycopg.errors.UndefinedTable), translated("postgresql://u:pw@h/db"):
        raise psycopg.errors.UndefinedTable("no such table")


def test_the_schema_goes_first_on_the_search_path_and_the_connect_is_bounded() -> None:
    assert connect_kwargs("tenant_a") == {
        "connect_timeout": 5,
        "options": "-c search_path=tenant_a",
    }
    assert connect_kwargs(None, timeout_s=2) == {"connect_timeout": 2}


def test_reconnecting_retries_a_lost_database_until_stopped() -> None:
    heard: list[tuple[str, float]] = []
    stop = threading.Event()

    def retried(what: str, _reason: str, delay: float) -> None:
        heard.append((what, delay))
        if len(heard) == 3:
            stop.set()

    db = Reconnecting(_nowhere(), max_backoff_s=0.4, on_retry=retried)
    with pytest.raises(DatabaseUnavailable):
        db.run("reading", lambda conn: conn.execute("select 1"), stop)
    assert [d for _, d in heard] == [0.2, 0.4, 0.4]  # doubling, capped
    assert {w for w, _ in heard} == {"reading"}
