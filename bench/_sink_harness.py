"""Sink benchmark pieces: a realistic event log, private PostgreSQL schemas, the sink as a
subprocess, and a poller that sees when each command's first row became visible.

Topics, the processor, the paced producer and the percentiles come from `bench/_harness.py`.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from typing import Any

import psycopg
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from bench._harness import cpu_seconds
from bench.bench_decider import CYCLE, build
from sessionstream.adapters.kafka import client_config
from sessionstream.adapters.postgres.migrate import migrate
from sessionstream.core.decider import apply
from sessionstream.core.partitioning import partition_for
from sessionstream.runtimes.sink.writer import PendingEvent
from sessionstream.schemas.commands import Command
from sessionstream.settings import Settings
from tests.integration.procs import Proc

__all__ = [
    "RowPoller",
    "SinkProc",
    "connect",
    "count_rows",
    "delete_groups",
    "drop_schemas",
    "event_log",
    "fresh_schema",
    "sink_run",
    "workload",
]


# -- the event log ------------------------------------------------------------------------------
def workload(sessions: int, cycles: int) -> list[Command]:
    """`cycles` full decider-bench cycles per session, round-robin (every run ends terminal,
    so no lease or cancel timer is left to fire later)."""
    return build(sessions * cycles * len(CYCLE), sessions)


def event_log(commands: list[Command], partitions: int = 4) -> list[PendingEvent]:
    """The events `commands` cause, placed as the processor would: the session's partition,
    consecutive offsets per partition, in log order."""
    states: dict[str, object] = {}
    nxt: Counter[int] = Counter()
    out: list[PendingEvent] = []
    for cmd in commands:
        events, states[cmd.session_id] = apply(states.get(cmd.session_id), cmd)  # type: ignore[arg-type]
        p = partition_for(cmd.session_id.encode(), partitions)
        for e in events:
            out.append(PendingEvent(e, "bench.events", p, nxt[p]))
            nxt[p] += 1
    return out


# -- PostgreSQL ---------------------------------------------------------------------------------
def fresh_schema(url: str, prefix: str) -> str:
    """A new migrated schema named `<prefix>_<random>`."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}".lower()
    migrate(url, schema=name)
    return name


def drop_schemas(url: str, prefix: str) -> list[str]:
    """Drop every schema whose name starts with `prefix`; returns their names."""
    with psycopg.connect(url, autocommit=True) as conn:
        names = [
            str(r[0])
            for r in conn.execute(
                "select nspname from pg_namespace where starts_with(nspname, %s)", (prefix,)
            )
        ]
        for name in names:
            conn.execute(f'drop schema if exists "{name}" cascade')
    return names


def connect(url: str, schema: str, **kw: object) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(url, options=f"-c search_path={schema}", **kw)  # type: ignore[arg-type]


def count_rows(url: str, schema: str) -> int:
    """Rows in `agent_run_events` (0 while the schema is not migrated yet)."""
    try:
        with connect(url, schema, connect_timeout=5) as conn:
            row = conn.execute("select count(*) from agent_run_events").fetchone()
            return int(row[0]) if row else 0  # type: ignore[call-overload]
    except psycopg.Error:
        return 0


def delete_groups(s: Settings, groups: list[str], timeout: float = 30.0) -> list[str]:
    """Delete consumer groups; returns those that could not be deleted.

    A stopped processor stays a member (static membership) until its session times out and
    the broker refuses to delete a non-empty group, so this retries until `timeout`.
    """
    admin = AdminClient(client_config(s))
    left, deadline = set(groups), time.monotonic() + timeout
    errors: dict[str, str] = {}
    while left and time.monotonic() < deadline:
        for group, fut in admin.delete_consumer_groups(sorted(left), request_timeout=30).items():
            try:
                fut.result()
                left.discard(group)
            except KafkaException as e:
                if e.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND:  # never committed
                    left.discard(group)
                errors[group] = str(e)
        if left:
            time.sleep(1)
    return [f"{g}: {errors.get(g)}" for g in sorted(left)]


# -- the sink -----------------------------------------------------------------------------------
class SinkProc(Proc):
    """`sessionstream sink --mode M` on its own schema and consumer group.

    The sink's group is `{processor_group}-sink`, so a distinct processor group in the sink's
    environment gives each run a group of its own; the processor is not affected.
    """

    def __init__(self, s: Settings, schema: str, mode: str, *args: str) -> None:
        self.group = f"bench-sink-{uuid.uuid4().hex[:8]}"
        settings = s.model_copy(update={"database_schema": schema, "processor_group": self.group})
        super().__init__(settings, "sink", "--mode", mode, *args)
        self.group += "-sink"
        self.started_at = 0.0

    def start(self) -> SinkProc:
        self.started_at = time.perf_counter()
        super().start()
        return self

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None


class RowPoller(threading.Thread):
    """Polls `agent_run_events` for rows with an id above the last seen, every `interval`;
    per command id, the perf_counter time its first row was seen. One sink writes, so ids
    become visible in increasing order and `id > last` misses nothing."""

    def __init__(self, url: str, schema: str, interval: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.conn = connect(url, schema, autocommit=True)
        row = self.conn.execute("select coalesce(max(id), 0) from agent_run_events").fetchone()
        self.last = int(row[0]) if row else 0  # type: ignore[call-overload]
        self.interval = interval
        self.first_seen: dict[str, float] = {}
        self.polls = 0
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        q = "select id, command_id from agent_run_events where id > %s order by id"
        try:
            while not self.halt.is_set():
                rows = self.conn.execute(q, (self.last,)).fetchall()
                now = time.perf_counter()
                self.polls += 1
                for _id, cid in rows:
                    self.first_seen.setdefault(str(cid), now)
                if rows:
                    self.last = int(rows[-1][0])  # type: ignore[call-overload]
                self.halt.wait(self.interval)
        except BaseException as e:  # surfaced by the main thread
            self.error = e
        finally:
            self.conn.close()

    def stop(self) -> None:
        self.halt.set()
        self.join(10)
        if self.error is not None:
            raise self.error


def sink_run(s: Settings, schema: str, mode: str, n_events: int) -> tuple[SinkProc, dict[str, Any]]:
    """Start a sink on a fresh schema; rows/s from its first batch until every event is in."""
    sink = SinkProc(s, schema, mode).start()
    first: tuple[float, int, float] | None = None
    deadline = time.perf_counter() + 300
    while True:
        sink.assert_alive()
        n, t = count_rows(s.database_url, schema), time.perf_counter()
        if n and first is None:
            first = (t, n, cpu_seconds(sink.pid))
        if n >= n_events:
            break
        if t > deadline:
            raise TimeoutError(f"{mode} sink wrote {n} of {n_events} rows in 300 s")
        time.sleep(0.02)
    assert first is not None and n == n_events, (n, n_events)
    t1, n1, c1 = first
    secs = max(t - t1, 1e-3)
    return sink, {
        "rows": n_events,
        "measured_rows": n_events - n1,
        "seconds": round(secs, 2),
        "rows_per_s": round((n_events - n1) / secs),
        "sink_cores": round((cpu_seconds(sink.pid) - c1) / secs, 2),
        "startup_to_first_batch_s": round(t1 - sink.started_at, 2),
    }
