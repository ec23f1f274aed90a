"""A schedule on the real stack: the processor is killed across its firing times and
restarted; the missed times fire once (catch-up `once`), the next on time; PostgreSQL's view
shows the next firing the log recorded."""

from __future__ import annotations

import time
import uuid

import pytest

from sessionstream.adapters.kafka import read_topic
from sessionstream.adapters.registry import reader_codec
from sessionstream.apps.gateway.schedules import schedules_of
from sessionstream.client import SessionClient
from sessionstream.schemas.events import Event, RunStarted, ScheduleDefined, ScheduleFired
from sessionstream.settings import Settings
from tests.integration.conftest import WorldFactory
from tests.integration.helpers import wait_until
from tests.integration.procs import Proc, processor, sink, wait_processed, wait_sink_caught_up
from tests.integration.rows import db

pytestmark = pytest.mark.integration

EVERY_MS = 3_000


def _events(s: Settings, sid: str) -> list[Event]:
    codec = reader_codec(s)
    out = [codec.decode_event(r.value) for r in read_topic(s, s.events_topic) if r.value]
    return [e for e in out if e.session_id == sid]


def test_a_schedule_fires_once_across_a_processor_restart(
    worlds: WorldFactory, procs: list[Proc]
) -> None:
    s = worlds("sched-restart", partitions=2, migrated=True).model_copy(
        update={"schedule_min_interval_ms": 1_000}
    )
    p = processor(s)
    procs += [p, sink(s)]
    sid = f"sched-{uuid.uuid4().hex[:8]}"
    with SessionClient("acme", s) as c:
        # the client's outcome tail is up (its first wait is slow): the next answer is quick
        warm = c.wait(c.prompt(f"warm-{sid}", "hello"), timeout=60)
        assert warm.status == "accepted", warm
        out = c.wait(
            c.schedule_create(sid, "tick", "check the queue", interval_ms=EVERY_MS, overlap="skip"),
            timeout=60,
        )
        assert out.status == "accepted", out
        first = out.events[0].payload_as(ScheduleDefined).next_at
        # the processor dies before the first firing and stays down across three more
        p.kill9()
    assert time.time() * 1000 < first, "killed after the first firing time: no restart across it"
    wait_until(
        lambda: time.time() * 1000 > first + 3 * EVERY_MS + 200,
        timeout=30,
        what="three firing times pass while the processor is down",
    )
    procs.append(processor(s, "p0"))

    def fired() -> list[ScheduleFired]:
        return [e.payload_as(ScheduleFired) for e in _events(s, sid) if e.type == "schedule.fired"]

    # the catch-up firing, then one on time (the schedule's own run still runs: skipped busy)
    wait_until(lambda: len(fired()) >= 2, timeout=60, what="two firings after the restart")
    wait_processed(s, procs=procs[-1:])
    log = _events(s, sid)
    late, on_time = fired()[:2]
    assert late.nominal_at == first and late.outcome == "prompted"
    assert late.missed >= 3  # counted, not fired: catch-up `once`
    started = [e for e in log if e.type == "run.started"]
    assert len(started) == 1, [e.type for e in log]
    assert started[0].payload_as(RunStarted).actor == "schedule:tick"
    assert on_time.nominal_at == late.next_nominal_at
    assert (on_time.outcome, on_time.reason, on_time.missed) == ("skipped", "busy", 0)
    # a timer never decides twice: one schedule.fired per nominal time in the whole log
    nominal = [f.nominal_at for f in fired()]
    assert len(nominal) == len(set(nominal))
    # PostgreSQL's view (what GET .../schedules and `schedules list` show) has the next
    # firing the log recorded last (the processor stopped: nothing fires meanwhile)
    assert procs[-1].stop() == 0
    wait_sink_caught_up(s, procs=procs[1:2])
    with db(s) as conn:
        found = schedules_of(conn, sid, "acme")
    assert found is not None and [sc.schedule_id for sc in found] == ["tick"]
    assert found[0].next_at == fired()[-1].next_at
