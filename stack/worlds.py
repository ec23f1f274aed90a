"""Isolated worlds for the tests and the benchmarks: their topics, consumer groups and
PostgreSQL schemas, found and deleted; a process's CPU time. Tooling of this repository,
not installed with the package."""

from __future__ import annotations

import shutil
import time
from typing import Any

from sessionstream.settings import Settings

__all__ = [
    "OLDER_TOPIC_FIELDS",
    "STATIC_MEMBER_PATIENCE_S",
    "TOPIC_FIELDS",
    "delete_groups",
    "delete_world",
    "world_topics",
]

#: every topic the settings name (commands, events, state, ...): a world names each its own
TOPIC_FIELDS = tuple(f for f in Settings.model_fields if f.endswith("_topic"))
#: topics named but no longer created: an older version's, read while they exist
OLDER_TOPIC_FIELDS = ("dedup_topic",)
#: how long `delete_world` asks again for a group a stopped static member still holds: the
#: processors' session timeout (6 s, `sessionstream.adapters.kafka.config`) and some
STATIC_MEMBER_PATIENCE_S = 10.0


def world_topics(s: Settings) -> list[str]:
    """The topics a world has once `topics create` ran."""
    return [getattr(s, f) for f in TOPIC_FIELDS if f not in OLDER_TOPIC_FIELDS]


def delete_groups(admin: Any, groups: list[str], *, patience_s: float = 0.0) -> list[str]:
    """Delete these consumer groups (best effort); returns the failures, a group that does
    not exist (one that never committed) not being one. A group that still has members
    (a stopped static member stays until its session times out) is asked again every
    0.5 s for up to `patience_s`."""
    from confluent_kafka import KafkaError, KafkaException

    deadline = time.monotonic() + patience_s
    failed: list[str] = []
    while groups:
        busy: dict[str, str] = {}
        for name, fut in admin.delete_consumer_groups(groups, request_timeout=30).items():
            try:
                fut.result(timeout=30)
            except KafkaException as e:
                code = e.args[0].code()
                if code == KafkaError.NON_EMPTY_GROUP:
                    busy[name] = f"{name}: {e.args[0]}"
                elif code != KafkaError.GROUP_ID_NOT_FOUND:
                    failed.append(f"{name}: {e.args[0]}")
            except Exception as e:  # the broker is down: nothing to keep
                failed.append(f"{name}: {e}")
        if busy and time.monotonic() >= deadline:
            return failed + list(busy.values())
        groups = list(busy)
        if groups:
            time.sleep(0.5)
    return failed


def delete_world(worlds: list[Settings], *, schemas: bool = True) -> list[str]:
    """Best effort: delete the worlds' topics, processor groups, registry subjects and
    (with `schemas`) their PostgreSQL schemas. Returns what could not be deleted."""
    import psycopg

    from sessionstream.adapters.kafka import new_admin

    if not worlds:
        return []
    # worlds on several brokers or databases (a secured or clustered stack beside the
    # default one): each set through its own clients, never all through the first's
    places: dict[tuple[str, str, str], list[Settings]] = {}
    for w in worlds:
        key = (w.kafka_bootstrap, w.kafka_security_protocol, w.database_url)
        places.setdefault(key, []).append(w)
    if len(places) > 1:
        return [f for same in places.values() for f in delete_world(same, schemas=schemas)]
    failed: list[str] = []
    admin = new_admin(worlds[0]).driver  # the driver: a best-effort sweep of many topics
    topics = [t for s in worlds for t in world_topics(s)]
    # an older version's topics too, where a world made one (an upgrade's test)
    older = {getattr(s, f) for s in worlds for f in OLDER_TOPIC_FIELDS}
    for name, fut in admin.delete_topics([*topics, *older], operation_timeout=30).items():
        try:
            fut.result(timeout=60)
        except Exception as e:  # already gone, or the broker is down: nothing to keep
            if name not in older:
                failed.append(f"{name}: {e}")
    for s in worlds:
        if s.store_dir is not None:
            shutil.rmtree(s.store_dir, ignore_errors=True)
    groups = [
        g
        for s in worlds
        for g in (
            s.processor_group,
            f"{s.processor_group}-restore",
            f"{s.processor_group}-sink",
            # the webhook deliverers' group of a test's world (tests/integration/webhook_world)
            f"{s.processor_group}-webhooks",
        )
    ]
    # a world's own analytics app (never the deployment's default one)
    default_app = Settings.model_fields["analytics_app_id"].default
    groups += [s.analytics_app_id for s in worlds if s.analytics_app_id != default_app]
    # best effort; a stopped processor is a static member of its group until its session
    # times out (6 s), so its group is asked again for a while
    delete_groups(admin, groups, patience_s=STATIC_MEMBER_PATIENCE_S)
    # their registry subjects (the schemas stay: ids are shared by content)
    from sessionstream.adapters.registry import SchemaRegistry

    for s in worlds:
        if not s.schema_registry_url:
            continue
        try:
            SchemaRegistry(s).delete_subjects()
        except Exception as e:  # the registry is down: its subjects are a few rows
            failed.append(f"subjects of {s.events_topic}: {e}")
    if schemas:
        try:
            with psycopg.connect(worlds[0].database_url, autocommit=True) as conn:
                for s in worlds:
                    conn.execute(f'drop schema if exists "{s.database_schema}" cascade')
        except psycopg.Error as e:
            failed.append(f"schemas: {e}")
    return failed
