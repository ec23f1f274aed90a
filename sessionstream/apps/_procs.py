"""Start and stop sessionstream's own processes (used by the demo)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from sessionstream.settings import Settings

__all__ = [
    "TOPIC_FIELDS",
    "Service",
    "cpu_seconds",
    "delete_groups",
    "delete_world",
    "settings_env",
    "world_topics",
]

#: every topic the settings name (commands, events, state, ...)
TOPIC_FIELDS = tuple(f for f in Settings.model_fields if f.endswith("_topic"))
_TICKS = os.sysconf("SC_CLK_TCK")
#: how long `delete_world` asks again for a group a stopped static member still holds: the
#: processors' session timeout (6 s, `sessionstream.adapters.kafka.config`) and some
STATIC_MEMBER_PATIENCE_S = 10.0


def world_topics(s: Settings) -> list[str]:
    return [getattr(s, f) for f in TOPIC_FIELDS]


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
    admin = new_admin(worlds[0])
    topics = [t for s in worlds for t in world_topics(s)]
    for name, fut in admin.delete_topics(topics, operation_timeout=30).items():
        try:
            fut.result(timeout=60)
        except Exception as e:  # already gone, or the broker is down: nothing to keep
            failed.append(f"{name}: {e}")
    for s in worlds:
        if s.store_dir is not None:
            shutil.rmtree(s.store_dir, ignore_errors=True)
    groups = [
        g
        for s in worlds
        for g in (s.processor_group, f"{s.processor_group}-restore", f"{s.processor_group}-sink")
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


def cpu_seconds(pid: int | None) -> float:
    """user + system CPU seconds of a live process (all its threads); 0 when gone."""
    if pid is None:
        return 0.0
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def settings_env(s: Settings) -> dict[str, str]:
    """The environment that gives a subprocess exactly these settings."""
    env = dict(os.environ)
    for name, value in s.model_dump().items():
        key = f"SESSIONSTREAM_{name.upper()}"
        if value is None:
            env.pop(key, None)
        elif isinstance(value, SecretStr):
            # str() of a SecretStr is its mask; the child needs the password itself
            env[key] = value.get_secret_value()
        else:
            env[key] = str(value)
    return env


class Service:
    """One `sessionstream ARGS` subprocess, its output in `log`."""

    def __init__(self, name: str, settings: Settings, args: list[str], log_dir: Path) -> None:
        self.name = name
        self.settings = settings
        self.args = args
        self.log = log_dir / f"{name}.log"
        self.cwd: Path | None = None
        self.popen: subprocess.Popen[bytes] | None = None
        #: the `sessionstream` executable (default: this interpreter's); a benchmark points
        #: it at another checkout's to compare versions on one load
        self.exe: Path | None = None

    def start(self) -> Service:
        exe = self.exe or Path(sys.executable).with_name("sessionstream")
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                [str(exe), *self.args],
                env=settings_env(self.settings),
                cwd=self.cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def cpu(self) -> float:
        return cpu_seconds(self.popen.pid if self.popen else None)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def wait_for(self, needle: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text():
            if not self.alive():
                raise RuntimeError(f"{self.name} exited; last lines:\n{self.text()[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: no {needle!r} within {timeout}s (log {self.log})")
            time.sleep(0.1)

    def kill9(self) -> None:
        if self.alive():
            assert self.popen is not None
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then SIGKILL after `timeout`; the exit code (0 if never started)."""
        if self.popen is None:
            return 0
        if self.popen.poll() is not None:
            return self.popen.returncode
        self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait(10)
