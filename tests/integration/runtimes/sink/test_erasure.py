"""Erasure end to end on the real broker and database (docs/protocol.md#erasure-and-retention):
a session with runs is erased; the sink tombstones its event keys and deletes its rows; once
the log cleaner has run, the compacted topics hold nothing of it but tombstones (and the
state's marker), PostgreSQL holds no row of it, a rebuild of the projection resurrects
nothing, and the audit's erasure check passes — and fails on a crafted leftover.

The world's compacted topics get a small `segment.ms`, no compaction lag and a low dirty
ratio, so the broker's log cleaner (it looks every 15 s) compacts them within the test.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from sessionstream.adapters.kafka import read_topic
from sessionstream.adapters.postgres import connect
from sessionstream.adapters.topics import check_topics
from sessionstream.client import SessionClient
from sessionstream.core.decider._erase import session_hash
from sessionstream.core.state import FinishedRun, SessionState
from sessionstream.core.state_codec import decode_state, encode_state
from sessionstream.runtimes.sink.audit import run_audit
from sessionstream.runtimes.sink.audit_erasure import (
    CLEANER_SLACK_MS,
    compaction_bound_ms,
    erased_leftovers,
)
from sessionstream.runtimes.sink.replay import rebuild
from sessionstream.settings import Settings
from tests.integration.conftest import WorldFactory
from tests.integration.helpers import wait_until
from tests.integration.procs import Proc, processor, sink, wait_processed, wait_sink_caught_up

pytestmark = pytest.mark.integration

SEGMENT_MS = 1000
DAY_MS = 24 * 3600 * 1000
FAST_COMPACTION = {
    "segment.ms": str(SEGMENT_MS),
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "1000",
}


def _compact_quickly(admin: AdminClient, topics: list[str]) -> None:
    for t in topics:
        _set(admin, t, FAST_COMPACTION)


def _wait_config(s: Settings, topic: str, key: str, value: str) -> None:
    wait_until(
        lambda: check_topics(s).configs[topic].get(key) == value,
        timeout=30,
        what=f"the broker to apply {topic}'s {key}={value}",
    )


def _set(admin: AdminClient, topic: str, config: dict[str, str], *, delete: bool = False) -> None:
    """Set `config` on `topic` (with `delete`: remove those keys, back to the defaults)."""
    op = AlterConfigOpType.DELETE if delete else AlterConfigOpType.SET
    resources = [
        ConfigResource(
            ConfigResource.Type.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry(k, v, incremental_operation=op) for k, v in config.items()
            ],
        )
    ]
    for fut in admin.incremental_alter_configs(resources).values():
        fut.result(timeout=30)


def _roll(s: Settings, topics: list[str]) -> None:
    """Close each topic's active segment (the cleaner never touches it): after
    `segment.ms`, the next append rolls it. The record appended is a tombstone under a key
    of no session, which every reader skips."""
    time.sleep(SEGMENT_MS / 1000 + 0.2)  # the age a segment must reach; not a wait for state
    p = Producer({"bootstrap.servers": s.kafka_bootstrap})
    for t in topics:
        for part in range(s.partitions):
            p.produce(t, key=b"roll/segment", value=None, partition=part)
    assert p.flush(30) == 0


def _run(c: SessionClient, sid: str, text: str, worker: str, command_id: str | None = None) -> str:
    cmd = c.command(sid, "prompt", {"text": text}, command_id=command_id or str(uuid.uuid4()))
    run = c.wait(c.submit(cmd), 30).run_id
    assert run
    w = {"run_id": run, "worker_id": worker}
    assert c.wait(c.submit(c.command(sid, "lease.acquire", {}, **w)), 30).status == "accepted"
    for t, payload in [
        ("run.progress", {"kind": "tool.started", "name": "search", "callId": "t1"}),
        ("compact.start", {}),
        ("compact.finish", {"checkpointUri": f"s3://ck/{run}"}),
        ("run.complete", {"result": f"answer to {text}"}),
    ]:
        out = c.wait(c.submit(c.command(sid, t, payload, generation=1, **w)), 30)
        assert out.status == "accepted", (t, out)
    return run


def _leftovers(s: Settings, sid: str, erased_at: int) -> list[str]:
    """What a reader of each topic from its start can still read of the erased session."""
    out = []
    prefix = f"{sid}/".encode()
    for r in read_topic(s, s.events_topic):
        if r.key and r.key.startswith(prefix) and r.value is not None:
            out.append(f"event {r.key!r}")
    for r in read_topic(s, s.state_topic):
        if r.key == sid.encode() and r.value is not None:
            st = decode_state(r.value)
            if st.active or st.queue or st.finished or st.last_checkpoint:
                out.append(f"state with content at {r.offset}")
    for r in read_topic(s, s.open_runs_topic):
        if r.key == sid.encode() and r.value is not None and r.timestamp <= erased_at:
            out.append(f"{s.open_runs_topic} {r.key!r}")
    return out


def test_an_erased_session_leaves_nothing_readable(
    worlds: WorldFactory, kafka_admin: AdminClient
) -> None:
    t0 = time.monotonic()
    s = worlds("erasure", partitions=1)
    compacted = [s.events_topic, s.state_topic, s.open_runs_topic]
    # every compacted topic is created with a bound on how long a superseded record stays
    configs = check_topics(s).configs
    assert {t: configs[t]["max.compaction.lag.ms"] for t in compacted} == dict.fromkeys(
        compacted, str(DAY_MS)
    )
    _compact_quickly(kafka_admin, compacted)
    procs: list[Proc] = [processor(s), sink(s)]
    try:
        with SessionClient("acme", s, actor="user:ana") as c:
            sid = c.session_id(f"erase-{uuid.uuid4().hex[:6]}")
            keep = c.session_id(f"keep-{uuid.uuid4().hex[:6]}")
            runs = [_run(c, sid, "first", "w1", "first-prompt"), _run(c, sid, "second", "w1")]
            kept_run = _run(c, keep, "stays", "w2")
            assert c.wait(c.prompt(sid, "a third"), 30).status == "accepted"
            assert c.wait(c.prompt(sid, "busy"), 30).reason == "session_busy"
            # erase while a run is active: refused, the run untouched
            refused = c.wait(c.submit(c.command(sid, "session.erase", {})), 30)
            assert (refused.status, refused.reason) == ("rejected", "session_busy")
            assert c.wait(c.abort(sid), 30).status == "accepted"
            erased = c.wait(
                c.submit(c.command(sid, "session.erase", {"reason": "ticket 42"}, actor="ops")),
                30,
            )
            assert erased.status == "accepted"
            assert [e.type for e in erased.events] == ["session.erased"]
            erased_at = erased.events[0].ts
        wait_processed(s, procs=procs)
        wait_sink_caught_up(s, procs=procs)
        # PostgreSQL: nothing of the session, the other one whole, the erasure recorded
        with connect(s) as conn:
            for table in ("agent_run_events", "agent_runs", "agent_sessions"):
                n = conn.execute(f"select count(*) from {table} where session_id = %s", (sid,))
                assert n.fetchone() == (0,), table
            assert conn.execute(
                "select count(*) from agent_runs where run_id = any(%s)", (runs,)
            ).fetchone() == (0,)
            assert conn.execute(
                "select status from agent_runs where run_id = %s", (kept_run,)
            ).fetchone() == ("completed",)
            row = conn.execute(
                "select session_hash, trigger, actor, reason, keys_tombstoned from session_erasures"
            ).fetchall()
            assert len(row) == 1 and row[0][:4] == (session_hash(sid), "admin", "ops", "ticket 42")
            assert row[0][4] > 10
            pointers = conn.execute("select uri from erasure_pointers order by uri").fetchall()
            assert sorted(p[0] for p in pointers) == sorted(f"s3://ck/{r}" for r in runs)
        # a rebuild from the log, before the cleaner ran: nothing of the session comes back
        report = rebuild(s)
        assert report.equal, report.differences
        # the log cleaner: only tombstones (or nothing) and the state's marker remain
        _roll(s, compacted)
        wait_until(
            lambda: not _leftovers(s, sid, erased_at),
            timeout=60,
            interval=1.0,
            what=lambda: f"the log cleaner to remove {_leftovers(s, sid, erased_at)}",
        )
        kept = [
            r for r in read_topic(s, s.events_topic) if r.key and r.key.startswith(keep.encode())
        ]
        assert kept and all(r.value is not None for r in kept)
        # the audit agrees; a crafted leftover fails it
        with connect(s) as conn:
            nine = run_audit(s, conn)[8]
            assert nine.title == "nothing of an erased session is readable"
            assert nine.ok, nine.evidence
            assert not any(e.startswith("pending:") for e in nine.evidence), nine.evidence
            # a record of the session superseded but not compacted yet (the state topic's
            # segments now roll after a day: the cleaner cannot reach it): a leftover while
            # the topic sets no max.compaction.lag.ms (one created before it was set at
            # creation: nothing bounds when it goes), pending within the lag once it does,
            # a leftover past that
            _set(kafka_admin, s.state_topic, {"segment.ms": str(DAY_MS)})
            _wait_config(s, s.state_topic, "segment.ms", str(DAY_MS))
            _set(kafka_admin, s.state_topic, {"max.compaction.lag.ms": ""}, delete=True)
            _wait_config(s, s.state_topic, "max.compaction.lag.ms", str(2**63 - 1))
            _plant_state(s, sid, runs[0], erased_at - 1)
            _plant_state(s, sid, None, erased_at + 1)  # the marker's shape: no content
            nine = run_audit(s, conn)[8]
            assert not nine.ok and any(
                "sets no max.compaction.lag.ms" in e and "state before erasure" in e
                for e in nine.evidence
            ), nine.evidence
            _set(kafka_admin, s.state_topic, {"max.compaction.lag.ms": str(DAY_MS)})
            _wait_config(s, s.state_topic, "max.compaction.lag.ms", str(DAY_MS))
            nine = run_audit(s, conn)[8]
            assert nine.ok, nine.evidence
            assert any(
                e.startswith(f"pending: 1 superseded records of erased sessions in {s.state_topic}")
                for e in nine.evidence
            ), nine.evidence
            bound = compaction_bound_ms({"max.compaction.lag.ms": str(DAY_MS)})
            assert bound == DAY_MS + CLEANER_SLACK_MS
            _n, left, _notes = erased_leftovers(s, conn, now_ms=erased_at + bound + 60_000)
            assert len(left) == 1 and left[0].startswith(s.state_topic), left
            assert "superseded, still readable" in left[0] and "state before erasure" in left[0]
            _plant(conn, sid, runs[0])
            nine = run_audit(s, conn)[8]
            assert not nine.ok and any("agent_run_events" in e for e in nine.evidence)
            # and a state record with content from before the erasure, in the changelog
            _plant_state(s, sid, runs[0], erased_at - 1)
            nine = run_audit(s, conn)[8]
            assert any("state before erasure" in e for e in nine.evidence), nine.evidence
        # the processor forgot the erased session's command ids: the first prompt's id sent
        # again is decided anew, as a new run (the run counter goes on: a new key)
        with SessionClient("acme", s, actor="user:ana") as c:
            again = c.wait(
                c.submit(c.command(sid, "prompt", {"text": "first"}, command_id="first-prompt")),
                30,
            )
            assert again.status == "accepted" and again.run_id not in runs, again
        print(f"erasure test wall time {time.monotonic() - t0:.1f}s")
    finally:
        for p in procs:
            p.stop()


def _plant_state(s: Settings, sid: str, run: str | None, clock: int) -> None:
    """A state record of `sid`: a finished `run` (content), or without one (None: the
    erasure marker's shape)."""
    state = SessionState(
        session_id=sid,
        tenant_id="acme",
        clock=clock,
        runs_started=1,
        finished=()
        if run is None
        else (FinishedRun(run_id=run, status="completed", generation=1),),
    )
    p = Producer({"bootstrap.servers": s.kafka_bootstrap})
    p.produce(s.state_topic, key=sid.encode(), value=encode_state(state), partition=0)
    assert p.flush(30) == 0


def _plant(conn: psycopg.Connection[Any], sid: str, run: str) -> None:
    conn.execute(
        "insert into agent_run_events (session_id, run_id, seq, type, payload, generation,"
        " command_id, tenant_id, ts, kafka_partition, kafka_offset)"
        " values (%s, %s, 1, 'run.started', '{}', 1, 'planted', 'acme', now(), 0, 0)",
        (sid, run),
    )
    conn.commit()
