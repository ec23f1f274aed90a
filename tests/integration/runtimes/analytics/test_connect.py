"""Kafka Connect lands the run stream in PostgreSQL (docs/analytics.md): Apache Kafka's own
Connect worker (`stack/stack.sh connect-up`), Apicurio's Avro converter and Debezium's JDBC
sink, all from Maven Central. Expected outcomes from the issue and the docs: one row per
event of the log, equal field by field, none twice after the worker is killed -9 under
load and restarted; a record the converter cannot decode stops the task with the reason."""

from __future__ import annotations

import contextlib
import random
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer

from sessionstream.adapters import connect
from sessionstream.adapters.kafka import client_config, read_topic
from sessionstream.adapters.registry import reader_codec
from sessionstream.apps._procs import settings_env
from sessionstream.client import SessionClient
from sessionstream.settings import Settings, get_settings
from tests.integration.conftest import WorldFactory
from tests.integration.helpers import wait_until
from tests.integration.procs import REPO, Proc, processor, wait_processed

pytestmark = pytest.mark.integration

STACK = REPO / "stack" / "stack.sh"


def _stack(cmd: str) -> str:
    r = subprocess.run(
        ["bash", str(STACK), cmd], capture_output=True, text=True, timeout=400, check=False
    )
    assert r.returncode == 0, f"stack.sh {cmd}: {r.stdout}\n{r.stderr}"
    return r.stdout


@pytest.fixture(scope="module")
def connect_url(settings: Settings) -> str:
    _stack("connect-up")
    return settings.connect_url


@pytest.fixture
def world(
    request: pytest.FixtureRequest, worlds: WorldFactory, connect_url: str, database_url: str
) -> Iterator[tuple[Settings, str, str]]:
    """An isolated world, its connector and its table (both removed afterwards)."""
    s = worlds(request.node.name[:16].replace("_", "-"))
    suffix = uuid.uuid4().hex[:8]
    name, table = f"it-connect-{suffix}", f"analytics.it_{suffix}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("create schema if not exists analytics")
    yield s, name, table
    with contextlib.suppress(connect.ConnectError):
        connect.delete(connect_url, name)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"drop table if exists {table}")


def _deploy(s: Settings, url: str, name: str, table: str) -> None:
    connect.deploy(url, name, connect.connector_config(s, table=table))


def _tasks(url: str, name: str) -> list[dict[str, Any]]:
    try:
        tasks: list[dict[str, Any]] = connect.status(url, name).get("tasks", [])
    except connect.ConnectError:
        return []
    return tasks


def _count(database_url: str, table: str) -> int:
    with psycopg.connect(database_url) as conn:
        exists = conn.execute("select to_regclass(%s)", (table,)).fetchone()
        if exists is None or exists[0] is None:
            return 0
        row = conn.execute(f"select count(*) from {table}").fetchone()
        return int(row[0]) if row else 0


def _log_events(s: Settings) -> list[Any]:
    codec = reader_codec(get_settings())
    return [codec.decode_event(r.value or b"") for r in read_topic(s, s.events_topic)]


def test_rows_equal_the_log_after_the_worker_is_killed_under_load(
    world: tuple[Settings, str, str], connect_url: str, database_url: str, procs: list[Proc]
) -> None:
    s, name, table = world
    procs.append(processor(s))
    sent = threading.Event()
    count = 0

    def load() -> None:
        nonlocal count
        rnd = random.Random(5)
        with SessionClient("acme", s) as acme, SessionClient("globex", s) as globex:
            for i in range(900):
                c = acme if i % 3 else globex
                sid = f"{c.tenant_id}:cn-{i % 17}"
                kind = rnd.choice(
                    ["prompt", "prompt", "abort", "steer", "follow_up", "clear_queue"]
                )
                payload: dict[str, Any] = (
                    {} if kind in ("abort", "clear_queue") else {"text": f"{kind} {i}"}
                )
                if kind == "prompt":
                    payload["policy"] = rnd.choice(["reject", "enqueue", "interrupt"])
                    if i % 2:  # labels: a map field of run.started / run.queued
                        payload["metadata"] = {"team": f"t{i % 3}", "ticket/id": str(i)}
                c.submit(c.command(sid, kind, payload), track=False)
                count += 1
                if i % 50 == 0:
                    c.flush()
                    time.sleep(0.1)  # load that goes on across the kill and the restart
            acme.flush()
            globex.flush()
        sent.set()

    _deploy(s, connect_url, name, table)
    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    # rows are landing: then the worker dies mid-stream, and a new one takes over
    wait_until(lambda: _count(database_url, table) > 0, timeout=120, what="first rows")
    _stack("kill-connect")
    _stack("connect-up")
    loader.join(180)
    assert sent.is_set(), "the load did not finish"
    wait_processed(s, procs=procs)
    events = _log_events(s)
    assert len(events) > count  # prompts start runs, aborts finish them: more events than commands

    def landed() -> bool:
        failed = [t for t in _tasks(connect_url, name) if t.get("state") == "FAILED"]
        assert not failed, failed[0].get("trace", "")[:3000]
        return _count(database_url, table) >= len(events)

    wait_until(landed, timeout=180, interval=1.0, what=f"{len(events)} rows in {table}")
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            f"select session_id, run_id, seq, type, generation, command_id, ts, tenant_id,"
            f" payload_run_finished_terminal_status, payload_command_rejected_reason"
            f" from {table}"
        ).fetchall()
    want = []
    for e in events:
        p = e.payload
        want.append(
            (
                e.session_id,
                e.run_id,
                e.seq,
                e.type,
                e.generation,
                e.command_id,
                e.ts,
                e.tenant_id,
                getattr(p, "terminal_status", None) if e.type == "run.finished" else None,
                getattr(p, "reason", None) if e.type == "command.rejected" else None,
            )
        )
    assert len(rows) == len(want)  # one row per event, none twice
    assert sorted(rows, key=repr) == sorted(want, key=repr)
    assert {r[7] for r in rows} == {"acme", "globex"}
    assert any(r[3] == "run.finished" for r in rows) and any(
        r[3] == "command.rejected" for r in rows
    )
    # the queue's fates and the labelled runs landed as rows too (their maps left out)
    assert any(r[3] == "run.dequeued" for r in rows)
    assert any(e.type == "run.started" and e.payload.metadata for e in events)


def test_a_record_it_cannot_decode_stops_the_task_with_the_reason(
    world: tuple[Settings, str, str], connect_url: str, database_url: str, procs: list[Proc]
) -> None:
    s, name, table = world
    procs.append(processor(s))
    with SessionClient("acme", s) as c:
        c.submit(c.command("acme:cn-bad", "prompt", {"text": "before the bad record"}), track=False)
        c.flush()
    wait_processed(s, procs=procs)
    good = len(_log_events(s))
    # Confluent framing naming a schema id no registry has, on the events topic itself
    producer = Producer(client_config(s))
    producer.produce(
        s.events_topic, key=b"acme:cn-bad/x/1", value=b"\x00\x3b\x9a\xc9\xff" + b"junk"
    )
    assert producer.flush(10) == 0
    _deploy(s, connect_url, name, table)

    def failed() -> dict[str, Any] | None:
        return next((t for t in _tasks(connect_url, name) if t.get("state") == "FAILED"), None)

    task = wait_until(failed, timeout=120, interval=0.5, what="the task to fail")
    trace = task.get("trace", "")
    assert "999999999" in trace, trace[:3000]  # the id it lacks
    # what came before it landed; nothing after it was skipped over
    assert _count(database_url, table) <= good


def test_a_log_begun_before_the_registry_lands_from_where_the_framing_starts(
    world: tuple[Settings, str, str], connect_url: str, database_url: str, procs: list[Proc]
) -> None:
    """A deployment that ran before the registry: its log begins with single-object events,
    which no registry-aware converter reads. `sessionstream connect deploy` (as a user runs
    it) says which offsets it starts past, and every framed event lands."""
    s, name, table = world
    before = s.model_copy(update={"schema_registry_url": ""})
    old = processor(before, "old")
    with SessionClient("acme", before) as c:
        for i in range(6):
            c.submit(c.command(f"acme:mx-{i}", "prompt", {"text": "old"}), track=False)
        c.flush()
    wait_processed(s, procs=[old])
    old.stop()
    procs.append(processor(s, "new"))
    with SessionClient("acme", s) as c:
        for i in range(6):
            c.submit(c.command(f"acme:mx-{i}", "abort", {}), track=False)
        c.flush()
    wait_processed(s, procs=procs)
    records = read_topic(s, s.events_topic)
    framed = [r for r in records if (r.value or b"")[:1] == b"\x00"]
    assert framed and len(framed) < len(records)
    starts = connect.framed_starts(s)
    # each partition that begins old starts past its last old record and at or before its
    # first framed one (a transaction marker may lie between)
    old_parts = {r.partition for r in records if r not in framed}
    assert set(starts) == old_parts
    for p, (start, _) in starts.items():
        last_old = max(r.offset for r in records if r.partition == p and r not in framed)
        first_new = min(r.offset for r in framed if r.partition == p)
        assert last_old < start <= first_new, (p, start, last_old, first_new)
    r = subprocess.run(
        [
            str(REPO / ".venv" / "bin" / "sessionstream"),
            "connect",
            "deploy",
            "--name",
            name,
            "--table",
            table,
        ],
        env=settings_env(s),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "single-object framing" in r.stderr and f"{s.events_topic}[" in r.stderr
    wait_until(
        lambda: _count(database_url, table) >= len(framed), timeout=120, what="the framed events"
    )
    with psycopg.connect(database_url) as conn:
        got = conn.execute(f"select session_id, run_id, seq from {table}").fetchall()
    codec = reader_codec(get_settings())
    want = [(e.session_id, e.run_id, e.seq) for e in (codec.decode_event(x.value) for x in framed)]
    assert sorted(got) == sorted(want)
