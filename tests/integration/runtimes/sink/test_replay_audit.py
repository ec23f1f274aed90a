"""Replay by run id and by offset, rebuild, and the audit on a healthy and a planted database."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer, Producer

from sessionstream.adapters.kafka import client_config, partitions_of, read_topic, reader_config
from sessionstream.adapters.postgres import connect
from sessionstream.adapters.postgres.migrate import migrate
from sessionstream.adapters.registry import reader_codec
from sessionstream.adapters.topics import ensure_topics
from sessionstream.apps._procs import settings_env
from sessionstream.client import SessionClient
from sessionstream.core.decider import decide
from sessionstream.errors import KafkaUnavailable, SingleWriterViolation
from sessionstream.runtimes.sink.audit import run_audit
from sessionstream.runtimes.sink.rebuild import RebuildFailed
from sessionstream.runtimes.sink.replay import (
    events_of_run,
    events_of_session,
    read_range,
    rebuild,
    session_partition,
)
from sessionstream.settings import Settings, get_settings
from tests.integration.conftest import WorldFactory
from tests.integration.procs import (
    Proc,
    processor,
    sink,
    wait_processed,
    wait_sink_caught_up,
)
from tests.integration.worlds import isolated_world

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def world(
    settings: Settings, kafka_bootstrap: str, database_url: str
) -> Iterator[tuple[Settings, str, str]]:
    """A processor and a sink that recorded a small scenario: (settings, session, run)."""
    with isolated_world(settings, "replay") as s:
        procs: list[Proc] = [processor(s), sink(s)]
        sid = f"replay-{uuid.uuid4().hex[:6]}"
        try:
            with SessionClient("tenant-r", s) as c:
                run = c.wait(c.prompt(sid, "plan a trip"), 60).run_id
                assert run
                w = {"run_id": run, "worker_id": "w1"}
                assert (
                    c.wait(c.submit(c.command(sid, "lease.acquire", {}, **w)), 30).status
                    == "accepted"
                )
                for t, p in [
                    ("run.progress", {"kind": "tool.started", "name": "search", "callId": "t1"}),
                    ("action.request", {"idempotencyKey": "mail-1", "kind": "email"}),
                    ("action.result", {"idempotencyKey": "mail-1", "ok": True}),
                    ("run.complete", {"result": "booked"}),
                ]:
                    assert (
                        c.wait(c.submit(c.command(sid, t, p, generation=1, **w)), 30).status
                        == "accepted"
                    )
                # with a typed input: a rebuild projects it the same
                typed = c.command(sid, "prompt", {"text": "second", "input": {"k": ["v", 1]}})
                assert c.wait(c.submit(typed), 30).status == "accepted"
                assert c.wait(c.prompt(sid, "third"), 30).status == "rejected"
                assert c.wait(c.abort(sid), 30).status == "accepted"
            wait_processed(s, procs=procs)
            wait_sink_caught_up(s, procs=procs)
            yield s, sid, run
        finally:
            for p in procs:
                p.stop()


def test_replay_by_run_id_equals_the_topic(world: tuple[Settings, str, str]) -> None:
    s, sid, run = world
    codec = reader_codec(get_settings())
    topic = [codec.decode_event(r.value or b"") for r in read_topic(s, s.events_topic)]
    from_topic = sorted((e for e in topic if e.run_id == run), key=lambda e: e.seq)
    with connect(s) as conn:
        replayed = events_of_run(conn, run)
        session = events_of_session(conn, sid)
    assert [e.seq for e in replayed] == list(range(1, len(from_topic) + 1))
    assert replayed == from_topic
    assert [e.type for e in replayed][:3] == ["run.started", "run.lease_granted", "tool.started"]
    assert replayed[-1].type == "run.finished"
    assert session == [e for e in topic if e.session_id == sid]  # log order, session log included


def test_replay_by_offset_and_rebuild(world: tuple[Settings, str, str]) -> None:
    s, _sid, _run = world
    records = [r for r in read_topic(s, s.events_topic)]
    part = records[0].partition
    in_part = [r for r in records if r.partition == part]
    got = list(read_range(s, part, in_part[1].offset, in_part[-1].offset))
    assert [o for o, _e in got] == [r.offset for r in in_part[1:-1]]
    report = rebuild(s)
    assert report.events == len(records)
    assert report.equal, report.differences


def test_the_cli_rebuild_forks_its_loaders_and_finds_the_projection_equal(
    world: tuple[Settings, str, str],
) -> None:
    """`sessionstream replay rebuild` runs one thread, so its loaders are forked: they
    share none of the parent's clients or its database connection, which goes on to build
    the indexes and compare once they are done."""
    s, _sid, _run = world
    cli = Path(sys.executable).with_name("sessionstream")
    out = subprocess.run(
        [str(cli), "replay", "rebuild", "--workers", "2"],
        env=settings_env(s),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for table in ("agent_run_events", "agent_runs", "agent_sessions"):
        assert f"{table}: equal" in out.stdout, out.stdout
    assert "by 2 forked processes" in out.stdout, out.stdout


def _layout(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> set[str]:
    """The keys, foreign keys, checks and indexes of a schema's tables, schema name left out."""
    rows = conn.execute(
        "select conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(c.oid)"
        " from pg_constraint c join pg_namespace n on n.oid = c.connamespace"
        " where n.nspname = %s union all"
        " select indexdef from pg_indexes where schemaname = %s",
        (schema, schema),
    ).fetchall()
    return {str(r[0]).replace(f"{schema}.", "").replace(f'"{schema}".', "") for r in rows}


def test_rebuild_skips_a_duplicated_event_as_the_sink_does_and_restores_every_index(
    worlds: WorldFactory,
) -> None:
    """A log holding one event twice (a producer re-sent it outside a transaction): the sink
    keeps the first, so must the bulk rebuild; and the rebuilt schema has every key and
    index a migrated one has, plus the offsets a sink would go on from."""
    s = worlds("rebuild-dup", partitions=2)
    ensure_topics(s)
    codec = reader_codec(get_settings())
    client = SessionClient("tenant-d", s)
    events = []
    for i in range(3):
        cmd = client.command(f"dup-{i}", "prompt", {"text": f"hello {i}"})
        events += decide(None, cmd, at=cmd.ts).events
    client.close()
    producer = Producer(client_config(s))
    records = [(e.key.encode(), codec.encode_event(e)) for e in events]
    for key, value in [*records, records[0]]:  # the first event again, at the end
        producer.produce(s.events_topic, key=key, value=value, partition=0)
    assert producer.flush(30) == 0
    proc = sink(s)
    try:
        wait_sink_caught_up(s, procs=[proc])
    finally:
        proc.stop()
    report = rebuild(s, keep=True)
    assert report.events == len(records)  # the copy was skipped
    assert report.equal, report.differences
    reference = f"{s.database_schema}_ref"
    migrate(s.database_conninfo, schema=reference)
    try:
        with psycopg.connect(s.database_url) as conn:
            assert _layout(conn, report.schema) == _layout(conn, reference)
            rows = conn.execute(
                f'select partition, next_offset from "{report.schema}".sink_offsets'
            ).fetchall()
            assert rows == [(0, len(records) + 1)]
    finally:
        with psycopg.connect(s.database_url, autocommit=True) as conn:
            conn.execute(f'drop schema "{report.schema}" cascade')
            conn.execute(f'drop schema "{reference}" cascade')


def _schema_exists(s: Settings, schema: str) -> bool:
    with psycopg.connect(s.database_url) as conn:
        row = conn.execute(
            "select count(*) from pg_namespace where nspname = %s", (schema,)
        ).fetchone()
    return row != (0,)


def test_a_second_active_run_in_the_log_stops_the_rebuild_and_leaves_nothing(
    worlds: WorldFactory,
) -> None:
    """Two writers planted in one partition of a two-partition log (a run started while
    the session's first run is still active): the partition's loader refuses it, the
    rebuild raises naming where, and its schema is gone; the other partition's loader ran
    alongside in its own process."""
    s = worlds("rebuild-2w", partitions=2)
    ensure_topics(s)
    codec = reader_codec(get_settings())
    client = SessionClient("tenant-w", s)
    first = client.command("two-writers", "prompt", {"text": "one"})
    second = client.command("two-writers", "prompt", {"text": "two"})
    fine = client.command("a-fine-session", "prompt", {"text": "fine"})
    client.close()
    producer = Producer(client_config(s))
    for cmd, p in ((first, 1), (second, 1), (fine, 0)):
        for e in decide(None, cmd, at=cmd.ts).events:  # each as if the session were new
            producer.produce(
                s.events_topic, key=e.key.encode(), value=codec.encode_event(e), partition=p
            )
    assert producer.flush(30) == 0
    migrate(s.database_conninfo, schema=s.database_schema)  # the live projection (empty)
    schema = f"{s.database_schema}_rb"
    with pytest.raises(SingleWriterViolation, match=rf"{s.events_topic}\[1\]@1"):
        rebuild(s, schema=schema, workers=2)
    assert not _schema_exists(s, schema)


def test_a_rebuild_without_a_live_projection_says_so_and_builds_nothing(
    worlds: WorldFactory,
) -> None:
    """The rebuild is compared with the live projection: a schema the sink never filled (a
    wrong SESSIONSTREAM_DATABASE_SCHEMA) is named before any schema is made or any event
    read, and nothing is left behind."""
    s = worlds("rebuild-nolive", partitions=1)
    ensure_topics(s)
    schema = f"{s.database_schema}_rb"
    with pytest.raises(RebuildFailed, match=rf"schema '{s.database_schema}' has no agent_run"):
        rebuild(s, schema=schema, workers=1)
    assert not _schema_exists(s, schema)


def test_a_missing_topic_is_an_error_for_a_tool_not_a_wait_forever(settings: Settings) -> None:
    """replay and rebuild ask for the events topic's partitions with a bound: a misspelt
    topic is named in the error (it waited forever before)."""
    missing = f"it.missing.{uuid.uuid4().hex[:8]}"
    consumer = Consumer(reader_config(settings))
    try:
        with pytest.raises(KafkaUnavailable, match=rf"topic {missing} is not available after 1s"):
            partitions_of(consumer, missing, timeout=1.0, bootstrap=settings.kafka_bootstrap)
    finally:
        consumer.close()


def test_replay_of_a_partition_the_topic_does_not_have_is_an_error(worlds: WorldFactory) -> None:
    """`replay offsets --partition 5` on a 2-partition topic: an error naming the count (it
    read forever before, waiting for the end of a partition that does not exist)."""
    s = worlds("replay-nopart", partitions=2)
    ensure_topics(s)
    with pytest.raises(ValueError, match=r"has no partition 5 \(it has 2: 0-1\)"):
        list(read_range(s, 5, 0))


def test_replay_by_offset_of_one_session_or_run_decodes_only_those(
    world: tuple[Settings, str, str],
) -> None:
    s, sid, run = world
    codec = reader_codec(get_settings())
    records = read_topic(s, s.events_topic)
    part = next(r.partition for r in records if (r.key or b"").startswith(f"{sid}/".encode()))
    everything = [(o, e) for o, e in read_range(s, part, 0)]
    by_session = list(read_range(s, part, 0, session_id=sid))
    by_run = list(read_range(s, part, 0, run_id=run))
    assert by_session == [(o, e) for o, e in everything if e.session_id == sid]
    assert by_run == [(o, e) for o, e in everything if e.run_id == run]
    assert by_run and len(by_run) < len(by_session)  # the session log is not the run's
    assert list(read_range(s, part, 0, session_id=sid + "x")) == []  # a prefix is no session
    assert all(
        codec.decode_event(r.value or b"").session_id == sid
        for r in records
        if (r.key or b"").startswith(f"{sid}/".encode())
    )


def _audit(s: Settings) -> dict[int, bool]:
    with connect(s) as conn:
        return {c.number: c.ok for c in run_audit(s, conn)}


def test_audit_passes_then_fails_on_planted_violations(world: tuple[Settings, str, str]) -> None:
    s, _sid, run = world
    assert _audit(s) == dict.fromkeys(range(1, 11), True)
    cli = Path(sys.executable).with_name("sessionstream")
    ok = subprocess.run([str(cli), "audit"], env=settings_env(s), capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    with connect(s) as conn:
        # plant: a hole in the run's history, and an action approved a second time
        conn.execute("delete from agent_run_events where run_id = %s and seq = 2", (run,))
        conn.execute(
            "insert into agent_run_events (session_id, run_id, seq, type, payload, generation,"
            " command_id, tenant_id, ts, kafka_partition, kafka_offset) select session_id, run_id,"
            " 100, type, payload, generation, 'planted', tenant_id, ts, kafka_partition, -1"
            " from agent_run_events where type = 'action.approved' and run_id = %s",
            (run,),
        )
        conn.commit()
    result = _audit(s)
    assert not result[2] and not result[7] and not result[8], result
    bad = subprocess.run([str(cli), "audit"], env=settings_env(s), capture_output=True, text=True)
    assert bad.returncode == 1
    for n in (2, 7, 8):
        assert f"FAIL {n}." in bad.stdout, bad.stdout
    assert "PASS 1." in bad.stdout and "gaps or duplicates in seq" in bad.stdout


def test_replay_offsets_finds_a_sessions_partition_itself(
    world: tuple[Settings, str, str],
) -> None:
    """`replay offsets --session S` without `--partition` reads S's own partition (where
    every one of its events is); neither option is a clear error."""
    s, sid, _run = world
    cli = [str(Path(sys.executable).with_name("sessionstream")), "replay", "offsets"]
    out = subprocess.run(
        [*cli, "--session", sid, "--json"], env=settings_env(s), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    part = session_partition(s, sid)
    expected = [e for _o, e in read_range(s, part, 0) if e.session_id == sid]
    assert expected and out.stdout.count(f'"sessionId": "{sid}"') == len(expected), out.stdout
    bad = subprocess.run(cli, env=settings_env(s), capture_output=True, text=True)
    assert bad.returncode == 1 and "--partition, or --session" in bad.stderr
