"""Fault suite: the whole pipeline under kill -9, a broker restart, a PostgreSQL restart;
and a table-driven sweep of bad input against a running processor.

Each pipeline test runs processor + sink + two reference-agent workers (2 s leases) under a
paced load of numbered commands while a verifier thread re-checks the committed log, then
asserts the contract in `faults.assert_consistent`. Bounded for CI; `make soak` runs the
same tests with `SESSIONSTREAM_SOAK=1` (10x load and rounds).
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import Producer

from sessionstream.adapters.kafka import read_topic
from sessionstream.adapters.postgres.migrate import migrate
from sessionstream.adapters.registry import reader_codec
from sessionstream.client import SessionClient
from sessionstream.core.partitioning import partition_for
from sessionstream.schemas.codec import DEFAULT_MAX_RECORD_BYTES, Codec
from sessionstream.schemas.commands import Command
from sessionstream.schemas.events import Event, StaleWriteRecorded
from sessionstream.settings import Settings, get_settings
from tests.integration.conftest import WorldFactory
from tests.integration.faults import (
    Load,
    Pipeline,
    Verifier,
    assert_consistent,
    restart_server,
    scaled,
)
from tests.integration.helpers import check_log, wait_until
from tests.integration.procs import Proc, processor

pytestmark = pytest.mark.integration


@pytest.fixture
def iso(request: pytest.FixtureRequest, worlds: WorldFactory, database_url: str) -> Settings:
    s = worlds("f-" + request.node.name[5:18].replace("_", "-"))
    migrate(database_url)  # the workers' action executor writes to the default schema
    return s


@pytest.fixture
def pipe(iso: Settings) -> Iterator[Pipeline]:
    p = Pipeline(iso, workers=2, lease_ms=2000)
    yield p
    p.stop()


def _local_stack(s: Settings) -> None:
    defaults = Settings.model_fields
    if (
        s.database_url != defaults["database_url"].default
        or s.kafka_bootstrap != defaults["kafka_bootstrap"].default
    ):
        pytest.fail("this test restarts the local servers; run it against `make up`'s stack")


def _start(iso: Settings, pipe: Pipeline, n: int, rate: float) -> tuple[Load, Verifier]:
    pipe.start()
    verifier = Verifier(iso)
    verifier.start()
    load = Load(iso, n, sessions=scaled(40), rate=rate)
    load.start()
    return load, verifier


def _at_progress(pipe: Pipeline, load: Load, verifier: Verifier, share: float) -> None:
    """Until the verifier saw outcomes for `share` of the load (the processes all alive)."""

    def reached() -> bool:
        pipe.assert_alive()
        assert load.error is None, load.error
        return verifier.progress(load.command_ids(), load.n) >= share

    wait_until(reached, timeout=240, interval=0.2, what=f"{share:.0%} of the load decided")


def test_kill9_processor_sink_and_workers_and_restart_postgres(
    iso: Settings, pipe: Pipeline
) -> None:
    """Rounds of kill -9 (processor, sink, a worker; each >= 20% apart) + a PG restart."""
    _local_stack(iso)
    rounds = scaled(3)
    n = scaled(1200)
    load, verifier = _start(iso, pipe, n, rate=40.0)
    step = 0.8 / (rounds + 1)  # every kind is killed once per step of the load (>= 20%)
    try:
        for r in range(rounds):
            base = (r + 1) * step
            for k, what in enumerate(["processor", "sink", pipe.worker_ids[r % 2]]):
                _at_progress(pipe, load, verifier, base + k * step / 3)
                pipe.kill9(what)
            if r == rounds // 2:
                restart_server("postgres")
    finally:
        load.join(load.n / load.rate + 300)
    counts = assert_consistent(iso, pipe, load, verifier)
    # the sink notices the outage only if it wrote during it (it may have been restarting)
    sinks = "".join(p.log_text() for p in pipe.all if p.args[0] == "sink")
    counts["sink_db_retries"] = sinks.count("database unavailable")
    print("fault loop:", counts)


def test_the_pipeline_rides_out_a_broker_restart(iso: Settings, pipe: Pipeline) -> None:
    """`stack.sh restart-kafka` under load: every process stays up and the contract holds."""
    _local_stack(iso)
    # a transaction timeout shorter than the outage: the coordinator aborts the open
    # transaction itself and fences the processor's producer, which must carry on
    iso = pipe.s = iso.model_copy(update={"transaction_timeout_ms": 4000})
    n = scaled(600)
    load, verifier = _start(iso, pipe, n, rate=30.0)
    try:
        _at_progress(pipe, load, verifier, 0.3)
        restart_server("kafka")
        pipe.assert_alive()
        _at_progress(pipe, load, verifier, 0.6)
    finally:
        load.join(load.n / load.rate + 300)
    counts = assert_consistent(iso, pipe, load, verifier)
    assert pipe.proc is not None
    counts["producer_renewed"] = pipe.proc.log_text().count("a new producer takes over")
    print("broker restart:", counts)


# -- bad-input sweep ------------------------------------------------------------------------


def _json_cmd(sid: str, **fields: object) -> bytes:
    base: dict[str, object] = {
        "commandId": f"j-{uuid.uuid4().hex[:8]}",
        "sessionId": sid,
        "tenantId": "tenant-a",
        "type": "prompt",
        "ts": 1,
        "payload": {"text": "hi"},
    }
    base.update(fields)
    return json.dumps(base).encode()


def _dead_letter_cases(sid: str, codec: Codec) -> dict[str, tuple[bytes | None, bytes | None, str]]:
    """name -> (key, value, DLQ reason): records no decoder or router can accept."""
    good = Command(
        command_id="dlq-template",
        session_id=sid,
        tenant_id="tenant-a",
        type="prompt",
        ts=1,
        payload={"text": "template"},
    )
    avro = codec.encode_command(good)
    key = sid.encode()
    return {
        "random-bytes": (key, random.Random(3).randbytes(96), "malformed"),
        "truncated-avro": (key, avro[: len(avro) // 2], "malformed"),
        "unknown-fingerprint": (key, avro[:2] + b"\x5a" * 8 + avro[10:], "unknown_schema"),
        "json-wrong-types": (key, _json_cmd(sid, commandId=7, ts="yesterday"), "schema_violation"),
        "json-payload-wrong-types": (
            key,
            _json_cmd(sid, payload={"text": ["a"], "policy": 3}),
            "schema_violation",
        ),
        "unknown-command-type": (key, _json_cmd(sid, type="launch.missiles"), "unknown_type"),
        "oversized-record": (key, avro + b"\x00" * (DEFAULT_MAX_RECORD_BYTES + 1), "oversized"),
        "tombstone": (key, None, "malformed"),
        "key-mismatch": (b"somebody-else", avro, "key_mismatch"),
    }


def test_bad_input_sweep_every_kind_gets_its_recorded_outcome(iso: Settings) -> None:
    """Each bad input is dead-lettered or rejected with its reason; the processor goes on."""
    proc = processor(iso, "sweep")
    try:
        _sweep(iso, proc)
    finally:
        proc.stop()


def _sweep(iso: Settings, proc: Proc) -> None:
    codec = reader_codec(get_settings())
    sid = f"sweep-{uuid.uuid4().hex[:6]}"
    part = partition_for(sid.encode(), iso.partitions)
    # Step 1: dead letters — undecodable or misrouted records, sent raw
    cases = _dead_letter_cases(sid, codec)
    raw = Producer({"bootstrap.servers": iso.kafka_bootstrap, "message.max.bytes": 4 << 20})
    for name, (key, value, _reason) in cases.items():
        raw.produce(
            iso.commands_topic,
            key=key,
            value=value,
            partition=part,
            headers=[("case", name.encode())],
        )
    assert raw.flush(30) == 0
    with SessionClient("tenant-a", iso) as c:
        # Step 2: rejections — decodable commands the decider refuses, each with a reason
        first = c.wait(c.prompt(sid, "steps=1 tool_ms=50", timeout_ms=600_000), 60)
        assert first.status == "accepted" and first.run_id
        run = first.run_id
        w = {"run_id": run, "worker_id": "fake-worker"}
        acquire = c.command(sid, "lease.acquire", {"leaseMs": 300}, **w)
        assert c.wait(c.submit(acquire), 30).status == "accepted"
        _wait_events(iso, lambda e: e.type == "run.lease_expired" and e.run_id == run)
        big = "x" * (iso.max_payload_bytes + 10_000)  # over the payload limit, under the record's
        rejections = {
            "oversized-payload": (c.command(sid, "steer", {"text": big}), "payload_too_large"),
            "wrong-tenant": (c.command(sid, "abort", {}, tenant_id="tenant-b"), "tenant_mismatch"),
            "stale-generation": (
                c.command(
                    sid, "run.progress", {"kind": "model.request.started"}, generation=1, **w
                ),
                "stale_generation",
            ),
            "unknown-run": (
                c.command(
                    sid,
                    "run.complete",
                    {"result": "x"},
                    run_id="no-such-run",
                    worker_id="fake-worker",
                    generation=1,
                ),
                "unknown_run",
            ),
        }
        for name, (cmd, reason) in rejections.items():
            out = c.wait(c.submit(cmd), 60)
            assert (out.status, out.reason) == ("rejected", reason), (name, out)
        stale = [e for e in _events(iso) if e.type == "run.stale_write_recorded"]
        assert len(stale) == 1, stale
        sw = stale[0].payload_as(StaleWriteRecorded)
        assert (sw.worker_id, sw.stale_generation, sw.current_generation) == ("fake-worker", 1, 2)
        assert stale[0].command_id == rejections["stale-generation"][0].command_id
        # Step 3: replayed command ids — `duplicate`, and not one event more; except another
        # tenant's command, which is refused every time and never takes an id from the owner
        before = len(_events(iso))
        for name, (cmd, reason) in rejections.items():
            out = c.wait(c.submit(cmd), 60)
            if reason == "tenant_mismatch":
                assert (out.status, out.reason) == ("rejected", reason), name
                before += 1
            else:
                assert out.status == "duplicate", name
        assert c.wait(c.submit(acquire), 60).status == "duplicate"
        assert len(_events(iso)) == before
        # Step 4: the processor is alive and still decides a good command
        proc.assert_alive()
        after = c.wait(c.abort(sid, "sweep done"), 60)
        assert after.status == "accepted", after
    dlq = {r.headers["case"].decode(): r for r in read_topic(iso, iso.dlq_topic)}
    assert set(dlq) == set(cases), sorted(set(cases) ^ set(dlq))
    for name, (key, value, reason) in cases.items():
        r = dlq[name]
        assert r.headers["error.reason"].decode() == reason, (name, r.headers["error.reason"])
        assert (r.key, r.value) == (key, value), f"{name}: original record not kept"
        assert int(r.headers["source.partition"]) == part and r.headers["error.message"]
    proc.assert_alive()
    assert check_log(read_topic(iso, iso.events_topic)).ok


def _events(s: Settings) -> list[Event]:
    codec = reader_codec(get_settings())
    return [codec.decode_event(r.value or b"") for r in read_topic(s, s.events_topic)]


def _wait_events(s: Settings, pred: Callable[[Event], bool]) -> None:
    wait_until(lambda: any(pred(e) for e in _events(s)), timeout=60, what="the lease to expire")
