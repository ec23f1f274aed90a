"""The run stream in the Confluent wire format through the stack's schema registry,
against the real broker, Apicurio Registry and PostgreSQL: registration and compatibility,
what a stock Kafka reader sees (confluent-kafka's `AvroDeserializer`, CloudEvents headers),
a log of both framings replayed and rebuilt, and the registry's faults: a forged id, an
incompatible schema, the registry killed under load."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Producer

from sessionstream.adapters.kafka import read_topic
from sessionstream.adapters.registry import COMPATIBILITY, SchemaRegistry, reader_codec, subjects_of
from sessionstream.apps._procs import settings_env
from sessionstream.client import SessionClient
from sessionstream.runtimes.sink.replay import rebuild
from sessionstream.schemas._avro import event_schema
from sessionstream.settings import Settings
from tests.integration.conftest import WorldFactory
from tests.integration.helpers import check_log, wait_until
from tests.integration.procs import REPO, Proc, processor, sink

pytestmark = pytest.mark.integration


@pytest.fixture
def iso(request: pytest.FixtureRequest, worlds: WorldFactory) -> Settings:
    return worlds(request.node.name[5:21].replace("_", "-"))


def _cli(s: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("sessionstream")
    return subprocess.run(
        [str(exe), *args], env=settings_env(s), capture_output=True, text=True, timeout=120
    )


def _rows(s: Settings) -> int:
    with psycopg.connect(s.database_url, options=f"-c search_path={s.database_schema}") as c:
        row = c.execute("select count(*) from agent_run_events").fetchone()
    return int(row[0]) if row else 0


def _run_cycle(c: SessionClient, sid: str) -> None:
    """A prompt (a run starts), a second prompt (rejected), an abort (cancelled)."""
    assert c.wait(c.prompt(sid, "go"), 30).status == "accepted"
    assert c.wait(c.prompt(sid, "again"), 30).reason == "session_busy"
    assert c.wait(c.abort(sid), 30).status == "accepted"


# -- registration ------------------------------------------------------------------------------
def test_topics_create_registers_each_subject_backward_transitive_and_check_agrees(
    iso: Settings,
) -> None:
    out = _cli(iso, "topics", "create")
    assert out.returncode == 0, out.stderr
    assert "schemas registered (BACKWARD_TRANSITIVE)" in out.stdout
    reg = SchemaRegistry(iso)
    ids = set()
    for subject, kind in subjects_of(iso).items():
        versions = reg.client.get_versions(subject)
        assert len(versions) == 1, subject
        latest = reg.client.get_latest_version(subject)
        ids.add((kind, latest.schema_id))
        assert reg.client.get_compatibility(subject) == COMPATIBILITY
    assert len(ids) == 3, "one id per kind (command, event, outcome) across its subjects"
    again = _cli(iso, "topics", "create")
    assert again.returncode == 0 and "nothing (all exist)" in again.stdout
    assert [len(reg.client.get_versions(s)) for s in subjects_of(iso)] == [1] * 5
    check = _cli(iso, "topics", "check")
    assert check.returncode == 0, check.stderr


def test_an_incompatible_schema_is_refused_at_check_and_at_start(
    iso: Settings, worlds: WorldFactory
) -> None:
    """A newer writer registered an event schema this version cannot read (its `seq` is a
    string): `topics check` names the subject and the registry's reason, and a processor
    of this version refuses to start rather than write next to it."""
    from confluent_kafka.schema_registry import Schema

    assert _cli(iso, "topics", "create").returncode == 0
    reg = SchemaRegistry(iso)
    subject = f"{iso.events_topic}-value"
    # a fresh world whose events subject holds only the incompatible schema
    other = worlds(f"incompat-{uuid.uuid4().hex[:4]}", base=iso)
    bad = event_schema()
    for f in bad["fields"]:
        if f["name"] == "seq":
            f["type"] = "string"
    bad_subject = f"{other.events_topic}-value"
    reg.client.register_schema(bad_subject, Schema(json.dumps(bad), "AVRO"))
    reg.client.set_compatibility(bad_subject, COMPATIBILITY)
    check = _cli(other, "topics", "check")
    assert check.returncode != 0
    assert bad_subject in check.stderr and "not compatible" in check.stderr, check.stderr
    assert "reader type" in check.stderr, "the registry's own reason is shown"
    p = Proc(other, "processor", "--instance", "incompat").start()
    try:
        wait_until(lambda: p.popen is not None and p.popen.poll() is not None, timeout=120,
                   what="the processor to refuse to start")  # fmt: skip
        assert p.popen is not None and p.popen.returncode != 0
        assert bad_subject in p.log_text() and "not compatible" in p.log_text()
    finally:
        p.stop()
    assert subject in subjects_of(iso)


# -- what Kafka's own tools read -----------------------------------------------------------------
def test_events_are_confluent_framed_with_cloudevents_headers_and_a_stock_reader_agrees(
    iso: Settings, procs: list[Proc]
) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    procs.append(processor(iso))
    sid = f"acme:{uuid.uuid4().hex[:8]}"
    with SessionClient("acme", iso) as c:
        _run_cycle(c, sid)
    registered = SchemaRegistry(iso).client.get_latest_version(f"{iso.events_topic}-value")
    stock = AvroDeserializer(SchemaRegistryClient({"url": iso.schema_registry_url}))
    ours = reader_codec(iso)
    records = [
        r for r in read_topic(iso, iso.events_topic) if (r.key or b"").startswith(sid.encode())
    ]
    assert len(records) >= 4
    for r in records:
        assert r.value is not None and r.value[:1] == b"\x00"
        assert int.from_bytes(r.value[1:5], "big") == registered.schema_id
        mine = ours.decode_event(r.value)
        theirs = stock(r.value, SerializationContext(iso.events_topic, MessageField.VALUE))
        expected = ours.event_to_json(mine)
        assert {k: v for k, v in theirs.items() if k != "payload"} == {
            k: v for k, v in expected.items() if k != "payload"
        }
        assert {k: v for k, v in theirs["payload"].items() if k in expected["payload"]} == {
            k: v for k, v in expected["payload"].items()
        }
        h = r.headers
        assert h["ce_specversion"] == b"1.0" and h["ce_id"] == r.key
        assert h["ce_type"] == mine.type.encode() and h["ce_subject"] == sid.encode()
        assert h["ce_tenantid"] == b"acme" and h["ce_runid"] == mine.run_id.encode()
        assert h["ce_source"] == f"/sessionstream/{iso.events_topic}".encode()
        assert h["content-type"] == b"application/avro; schemaregistry=confluent"
        when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(mine.ts // 1000))
        assert h["ce_time"].decode().startswith(when) and h["ce_time"].endswith(b"Z")


def test_a_forged_zero_byte_record_with_a_garbage_id_is_a_dead_letter_and_the_stream_goes_on(
    iso: Settings, procs: list[Proc]
) -> None:
    procs.append(processor(iso))
    sid = f"acme:{uuid.uuid4().hex[:8]}"
    forged = b"\x00" + (2**31 - 7).to_bytes(4, "big") + b"\x02garbage"
    p = Producer({"bootstrap.servers": iso.kafka_bootstrap, "partitioner": "murmur2_random"})
    p.produce(iso.commands_topic, key=sid.encode(), value=forged)
    assert p.flush(30) == 0
    with SessionClient("acme", iso) as c:
        assert c.wait(c.prompt(sid, "after the forgery"), 60).status == "accepted"

    def dead() -> dict[str, bytes] | None:
        for r in read_topic(iso, iso.dlq_topic):
            if r.value == forged:
                return r.headers
        return None

    headers = wait_until(dead, timeout=60, what="the forged record in the DLQ")
    assert headers["error.reason"] == b"unknown_schema"
    assert str(2**31 - 7).encode() in headers["error.message"]


# -- a log of both framings ---------------------------------------------------------------------
def test_a_log_written_before_the_registry_and_after_replays_and_rebuilds_equal_to_live(
    iso: Settings, procs: list[Proc]
) -> None:
    """The upgrade a running deployment makes: its processor wrote single-object events;
    the new one writes registry-framed events into the same sessions. The sink, a replay
    and a rebuild read the whole log, and the rebuilt projection equals the live one."""
    before = iso.model_copy(update={"schema_registry_url": ""})
    sessions = [f"acme:{uuid.uuid4().hex[:8]}" for _ in range(3)]
    old = processor(before, "old")
    procs.append(sink(iso))
    with SessionClient("acme", before) as c:
        for sid in sessions:
            _run_cycle(c, sid)
    old.stop()
    procs.append(processor(iso, "new"))
    with SessionClient("acme", iso) as c:
        for sid in sessions:
            _run_cycle(c, sid)  # the same sessions go on from their state
    records = read_topic(iso, iso.events_topic)
    framings = {(r.value or b"")[:1] for r in records}
    assert framings == {b"\xc3", b"\x00"}, framings
    assert check_log(records).ok
    wait_until(lambda: _rows(iso) == len(records), timeout=90, what="the sink to write all")
    report = rebuild(iso)
    assert report.events == len(records) and report.equal, report.differences


# -- the registry's faults ----------------------------------------------------------------------
def _stack(cmd: str) -> None:
    subprocess.run(
        ["bash", str(REPO / "stack/stack.sh"), cmd], check=True, capture_output=True, timeout=300
    )


def test_the_registry_killed_under_load_stops_no_decision_and_loses_nothing(
    iso: Settings, procs: list[Proc]
) -> None:
    """kill -9 of the registry while commands flow: the processor keeps deciding (its ids
    were resolved at start); a sink started during the outage meets ids it does not know,
    waits for the registry (no record skipped, no crash), and once it is back PostgreSQL
    holds every event of the log."""
    procs.append(processor(iso))
    sessions = [f"acme:{uuid.uuid4().hex[:8]}" for _ in range(4)]
    with SessionClient("acme", iso) as c:
        assert c.wait(c.prompt(f"acme:warm-{uuid.uuid4().hex[:6]}", "warm"), 30).run_id
        try:
            _stack("kill-registry")
            for sid in sessions:
                _run_cycle(c, sid)  # decided with the registry down
            late = sink(iso)
            procs.append(late)
            late.wait_log("waiting (never skipping the record)", 60)
            late.assert_alive()
            assert _rows(iso) == 0, "nothing written before its schema is known"
        finally:
            _stack("restart-registry")
    records = read_topic(iso, iso.events_topic)
    wait_until(lambda: _rows(iso) == len(records), timeout=120, what="the sink to catch up")
    assert check_log(records).ok
