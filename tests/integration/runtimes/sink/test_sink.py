"""The PostgreSQL sink against the real broker and database: rows equal the log, always."""

from __future__ import annotations

import random
import subprocess
import threading
import uuid

import psycopg
import pytest

from sessionstream.client import SessionClient
from sessionstream.settings import Settings
from tests.integration.conftest import WorldFactory
from tests.integration.helpers import wait_until
from tests.integration.procs import (
    REPO,
    Proc,
    processor,
    sink,
    wait_processed,
    wait_sink_caught_up,
)
from tests.integration.rows import assert_rows_equal_log, count_rows, db

pytestmark = pytest.mark.integration


@pytest.fixture
def iso(request: pytest.FixtureRequest, worlds: WorldFactory) -> Settings:
    return worlds(request.node.name[:16].replace("_", "-"))


def _load(s: Settings, n: int, sessions: int, stop: threading.Event, pause: float = 0.0) -> None:
    rnd = random.Random(11)
    with SessionClient("tenant-a", s) as c:
        for i in range(n):
            if stop.is_set():
                return
            kind = rnd.choice(["prompt", "steer", "follow_up", "abort", "send"])
            payload = {} if kind == "abort" else {"text": f"{kind} {i}"}
            c.submit(c.command(f"s{i % sessions}", kind, payload, command_id=f"c{i}"), track=False)
            if i % 100 == 0:
                c.flush()
            if pause:
                stop.wait(pause)
        c.flush()


def test_end_to_end_commands_to_rows(iso: Settings, procs: list[Proc]) -> None:
    procs += [processor(iso), sink(iso)]
    sid = f"e2e-{uuid.uuid4().hex[:6]}"
    order = {"to": "LIS", "nights": 3, "flex": [1.5, None, True], "note": "é ✈"}
    with SessionClient("tenant-a", iso) as c:
        started = c.wait(c.submit(c.command(sid, "prompt", {"text": "find", "input": order})), 60)
        run = started.run_id
        assert started.status == "accepted" and run
        w = {"run_id": run, "worker_id": "w1"}
        assert c.wait(c.submit(c.command(sid, "lease.acquire", {}, **w)), 30).status == "accepted"
        for cmd_type, payload in [
            ("run.progress", {"kind": "model.request.started"}),
            ("compact.start", {}),
            ("compact.finish", {"checkpointUri": "s3://ckpt/1"}),
            ("run.complete", {"result": "done"}),
        ]:
            o = c.wait(c.submit(c.command(sid, cmd_type, payload, generation=1, **w)), 30)
            assert o.status == "accepted", (cmd_type, o)
        assert c.wait(c.prompt(sid, "second task"), 30).status == "accepted"
        assert c.wait(c.abort(sid), 30).status == "accepted"
    wait_processed(iso, procs=procs)
    wait_sink_caught_up(iso, procs=procs)
    assert assert_rows_equal_log(iso) > 8
    with db(iso) as conn:
        statuses = [
            r[0]
            for r in conn.execute(
                "select status from agent_runs where session_id = %s order by created_at", (sid,)
            )
        ]
        uri, typed = conn.execute(
            "select checkpoint_uri, input from agent_runs where run_id = %s", (run,)
        ).fetchone() or (None, None)
        second = conn.execute(
            "select input from agent_runs where session_id = %s and run_id != %s", (sid, run)
        ).fetchone()
    assert statuses == ["completed", "cancelled"]
    assert uri == "s3://ckpt/1"
    # the prompt's typed input, as a jsonb (its JSON value); none for a prompt without one
    assert typed == order and second == (None,)


def test_kill9_sink_mid_batch_three_times(iso: Settings, procs: list[Proc]) -> None:
    procs.append(processor(iso))
    s = sink(iso, "--batch-size", "200", "--linger-ms", "5")
    procs.append(s)
    stop = threading.Event()
    loader = threading.Thread(target=_load, args=(iso, 4000, 80, stop))
    loader.start()
    try:
        for _ in range(3):
            with_rows = count_rows(iso)
            wait_until(
                lambda with_rows=with_rows: count_rows(iso) > with_rows + 300,
                timeout=120,
                what="the sink to write 300 more rows",
            )
            s.kill9()
            s = sink(iso, "--batch-size", "200", "--linger-ms", "5")
            procs.append(s)
    finally:
        loader.join()
    wait_processed(iso, procs=procs[:1])
    wait_sink_caught_up(iso, procs=[s])
    assert assert_rows_equal_log(iso) > 1000


def test_postgres_restarted_under_the_sink(iso: Settings, procs: list[Proc]) -> None:
    if iso.database_url != Settings.model_fields["database_url"].default:
        pytest.fail("this test restarts the local PostgreSQL; run it against `make up`'s stack")
    procs += [processor(iso), sink(iso, "--batch-size", "100")]
    stop = threading.Event()
    loader = threading.Thread(target=_load, args=(iso, 200_000, 30, stop, 0.002))
    loader.start()
    try:
        wait_until(lambda: count_rows(iso) > 200, timeout=120, what="rows before the restart")
        subprocess.run(
            ["bash", str(REPO / "stack/stack.sh"), "restart-postgres"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        after = count_rows(iso)
        wait_until(
            lambda: count_rows(iso) > after + 200,
            timeout=120,
            what="rows written after the restart",
        )
    finally:
        stop.set()
        loader.join()
    wait_processed(iso, procs=procs[:1])
    wait_sink_caught_up(iso, procs=procs[1:])
    assert assert_rows_equal_log(iso) > 1000
    assert "database unavailable" in procs[1].log_text()  # it did see the outage and retried


def test_partial_unique_index_rejects_a_second_active_run(iso: Settings, procs: list[Proc]) -> None:
    from sessionstream.adapters.postgres.migrate import migrate

    migrate(iso.database_url, schema=iso.database_schema)
    with db(iso) as conn:
        conn.execute("insert into agent_sessions values ('s1', 't', null, now(), now())")
        insert = (
            "insert into agent_runs (run_id, session_id, tenant_id, status, generation,"
            " timeout_at, prompt, last_seq, created_at, updated_at)"
            " values (%s, 's1', 't', %s, 1, now(), 'p', 1, now(), now())"
        )
        conn.execute(insert, ("r1", "running"))
        conn.commit()
        with pytest.raises(psycopg.errors.UniqueViolation, match="only_one_active_run_per_session"):
            conn.execute(insert, ("r2", "cancelling"))
        conn.rollback()
        conn.execute(
            "update agent_runs set status = 'completed', terminal_status = 'completed',"
            " terminal_at = now() where run_id = 'r1'"
        )
        conn.execute(insert, ("r2", "running"))  # once the first ended, the next may start
        conn.commit()


def test_a_consumer_stuck_outside_the_group_is_replaced(
    iso: Settings, procs: list[Proc], caplog: pytest.LogCaptureFixture
) -> None:
    """A sink whose consumer lost its partitions and never rejoins (seen once after a
    coordinator restart: no JoinGroup for minutes) replaces it and writes on, exactly once.
    The stuck member is made here by unsubscribing the live consumer, on the sink's own
    thread, behind the sink's back; nothing else in the sink knows."""
    from sessionstream.runtimes.sink.sink import Sink

    class Unsubscribing(Sink):
        unsubscribe = threading.Event()
        stuck: object = None

        def _collect(self) -> list:  # type: ignore[type-arg]
            if self.unsubscribe.is_set() and self.stuck is None:
                assert self._consumer is not None
                self.stuck = self._consumer
                # leaves the group; nothing rejoins it (the adapter's GroupConsumer has no
                # unsubscribe: the sink never needs one, so its driver client is asked)
                self._consumer.driver.unsubscribe()
            return super()._collect()

    s = iso.model_copy(update={"sink_stall_s": 5.0})
    procs.append(processor(s))
    snk = Unsubscribing(s)
    stop = threading.Event()
    t = threading.Thread(target=snk.run, args=(stop,), name="sink-under-test", daemon=True)
    t.start()
    try:
        _load(s, 120, 12, threading.Event())
        wait_processed(s, procs=procs)
        wait_sink_caught_up(s)
        assert snk.stats.consumers_replaced == 0
        caplog.set_level("WARNING", logger="sessionstream.sink")
        snk.unsubscribe.set()
        wait_until(lambda: snk.stuck is not None, timeout=30, what="the consumer unsubscribed")
        # more events arrive while the sink has no partitions
        with SessionClient("tenant-b", s) as c:
            for i in range(60):
                c.submit(c.command(f"late{i % 6}", "prompt", {"text": f"t{i}"}), track=False)
        wait_processed(s, procs=procs)
        wait_sink_caught_up(s, timeout=90)
        assert snk.stats.consumers_replaced >= 1
        assert snk._consumer is not snk.stuck
        assert any("replacing it" in r.getMessage() for r in caplog.records), caplog.text
    finally:
        stop.set()
        t.join(30)
    assert not t.is_alive()
    assert assert_rows_equal_log(s) > 100
