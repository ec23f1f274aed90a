"""Isolated worlds for integration tests and benchmarks: topics, a processor group, a store
directory and a PostgreSQL schema of their own, so runs never see each other's data.

Test tooling, so it lives beside the tests and not in the installed package; benchmarks
import it from here.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from sessionstream.settings import Settings
from stack.worlds import TOPIC_FIELDS, delete_world

__all__ = ["ISOLATED", "isolated_settings", "isolated_world", "remove_isolated"]


def isolated_settings(
    base: Settings, tag: str, *, prefix: str = "it", partitions: int = 4, schema: bool = True
) -> Settings:
    """`base` with topics, a processor group and (with `schema`) a PostgreSQL schema of its
    own, named `{prefix}.{kind}.{tag}-{random}`: tests and benchmarks never see each other's
    data. The topics are created here; removing them is the caller's (`isolated_world`,
    `delete_world`)."""
    from sessionstream.adapters.topics import ensure_topics

    suffix = f"{tag}-{uuid.uuid4().hex[:8]}"
    update: dict[str, object] = {
        f: f"{prefix}.{f.removesuffix('_topic').replace('_', '-')}.{suffix}" for f in TOPIC_FIELDS
    }
    update["processor_group"] = f"{prefix}-processor-{suffix}"
    update["partitions"] = partitions
    # the processors' local stores: the world's own, removed with it
    update["store_dir"] = Path(tempfile.mkdtemp(prefix=f"ss-store-{suffix}-"))
    if schema:
        update["database_schema"] = f"{prefix}_{suffix.replace('-', '_').replace('.', '_').lower()}"
    s = base.model_copy(update=update)
    ensure_topics(s)
    return s


#: every world `isolated_world` made in this process and not yet removed (the tests'
#: conftest removes them at the session's end; a stack profile removes its own before it
#: stops)
ISOLATED: list[Settings] = []


def remove_isolated() -> None:
    """Delete the isolated topics, groups and PostgreSQL schemas, so reruns do not pile them
    up."""
    delete_world(ISOLATED)
    ISOLATED.clear()


@contextmanager
def isolated_world(
    base: Settings, tag: str, *, partitions: int = 4, migrated: bool = False
) -> Iterator[Settings]:
    """An isolated world for the block (`isolated_settings`, prefix `it`): its schema
    (migrated first with `migrated`) is dropped when the block ends; its topics and groups
    at the session's end (`remove_isolated`), when its processes' groups have emptied."""
    s = isolated_settings(base, tag, partitions=partitions)
    ISOLATED.append(s)
    if migrated:
        from sessionstream.adapters.postgres.migrate import migrate

        migrate(s.database_conninfo, schema=s.database_schema)
    try:
        yield s
    finally:
        with psycopg.connect(s.database_conninfo, autocommit=True) as conn:
            conn.execute(f'drop schema if exists "{s.database_schema}" cascade')
