"""Versioned migrations: `sessionstream/adapters/postgres/migrations/NNNN_name.sql`, each applied
once, in order.

`schema_migrations` records what ran; an advisory lock makes concurrent `migrate` calls
(several sinks starting at once) safe; each file runs in its own transaction.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from importlib import resources

import psycopg

from sessionstream.adapters.postgres.datastore import connect_kwargs, translated

__all__ = ["Migration", "applied_versions", "migrate", "migrations"]

_LOCK = 0x5E5510  # pg_advisory_xact_lock key of sessionstream's migrations
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    """Every migration shipped with the package, by version."""
    out = []
    for entry in (resources.files("sessionstream.adapters.postgres") / "migrations").iterdir():
        m = _NAME.match(entry.name)
        if m:
            out.append(Migration(int(m.group(1)), m.group(2), entry.read_text()))
    out.sort(key=lambda m: m.version)
    versions = [m.version for m in out]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"duplicate migration versions: {versions}")
    return out


def _ensure_table(conn: psycopg.Connection) -> None:
    # `create ... if not exists` needs CREATE on the schema even when the table exists; a
    # role that may not create tables (the sink's, the workers') checks without it
    if conn.execute("select to_regclass('schema_migrations')").fetchone() != (None,):
        return
    conn.execute(
        "create table if not exists schema_migrations ("
        " version integer primary key, name text not null,"
        " applied_at timestamptz not null default now())"
    )


def applied_versions(conn: psycopg.Connection) -> set[int]:
    _ensure_table(conn)
    return {row[0] for row in conn.execute("select version from schema_migrations")}


def migrate(
    conninfo: str,
    *,
    schema: str | None = None,
    progress: Callable[[Migration], None] | None = None,
    skip: Collection[int] = (),
) -> list[Migration]:
    """Apply what is missing, but the versions in `skip` (an upgrade taken in two steps);
    returns what was applied (empty when up to date). A database that cannot be reached (or
    is lost meanwhile) is `DatabaseUnavailable`."""
    with translated(conninfo):
        return _migrate(conninfo, schema, progress, skip)


def _migrate(
    conninfo: str,
    schema: str | None,
    progress: Callable[[Migration], None] | None,
    skip: Collection[int] = (),
) -> list[Migration]:
    done: list[Migration] = []
    with psycopg.connect(conninfo, autocommit=True, **connect_kwargs(None)) as conn:
        if schema:
            # two processes creating the same schema at once race inside PostgreSQL
            # (`if not exists` is checked before the insert): the lock serializes them
            with conn.transaction():
                conn.execute("select pg_advisory_xact_lock(%s)", (_LOCK,))
                conn.execute(f'create schema if not exists "{schema}"')
            conn.execute(f'set search_path to "{schema}"')
        for m in migrations():
            if m.version in skip:
                continue
            with conn.transaction():
                conn.execute("select pg_advisory_xact_lock(%s)", (_LOCK,))
                if m.version in applied_versions(conn):
                    continue
                conn.execute(m.sql.encode())
                conn.execute(
                    "insert into schema_migrations (version, name) values (%s, %s)",
                    (m.version, m.name),
                )
            done.append(m)
            if progress:
                progress(m)
    return done
