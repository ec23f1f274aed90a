"""The protocol at run boundaries, against the real processor on the real broker.

Every story here ended wrongly before: a late abort hit the next run, a foreign tenant took
an id, a reused id was silent, producer clocks decided deadlines, a forged timer ended a
run, follow-ups vanished across a takeover or started ahead of the user's next task, a
takeover mid-compaction stuck the run, big prompts wedged a partition, a lease had no cap,
nobody was recorded as the initiator, misplaced commands were lost, `retryable` was ignored.
Workers are played by hand (worker commands through the SDK), so each step is exact.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer

from sessionstream.adapters.kafka import read_topic
from sessionstream.adapters.registry import reader_codec
from sessionstream.apps._procs import settings_env
from sessionstream.client import Outcome, SessionClient
from sessionstream.core.partitioning import partition_for
from sessionstream.schemas.events import Event
from sessionstream.settings import Settings, get_settings
from tests.integration.helpers import check_log, wait_until
from tests.integration.procs import processor, sink, wait_sink_caught_up
from tests.integration.worlds import isolated_world

pytestmark = pytest.mark.integration

CODEC = reader_codec(get_settings())
LEASE_MS = 2_000
COMPACTION_LEASE_MS = 10_000


@pytest.fixture(scope="module")
def world(settings: Settings, kafka_bootstrap: str, database_url: str) -> Iterator[Settings]:
    """One processor and one sink on isolated topics for the whole module."""
    with isolated_world(settings, "edges") as iso:
        procs = [processor(iso), sink(iso)]
        procs[0].wait_log("assigned", timeout=90)
        procs[1].wait_log("assigned", timeout=90)
        yield iso
        for p in procs:
            p.assert_alive()
            p.stop()


@pytest.fixture
def client(world: Settings) -> Iterator[SessionClient]:
    with SessionClient("acme", world, actor="user:ana") as c:
        yield c


def sid(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


def events(s: Settings, session: str) -> list[Event]:
    out = []
    for r in read_topic(s, s.events_topic):
        e = CODEC.decode_event(r.value or b"")
        if e.session_id == session:
            out.append(e)
    return out


def wait_event(s: Settings, session: str, type_: str, timeout: float = 30.0) -> Event:
    def found() -> Event | None:
        return next((e for e in events(s, session) if e.type == type_), None)

    return wait_until(found, timeout=timeout, interval=0.2, what=f"{type_} in {session}")


class Worker:
    """A worker played by hand: its commands carry its id and the generation it holds."""

    def __init__(self, c: SessionClient, session: str, run_id: str, worker_id: str) -> None:
        self.c, self.session, self.run_id, self.worker_id = c, session, run_id, worker_id
        self.generation: int | None = None

    def send(
        self, type_: str, payload: dict[str, Any] | None = None, *, ts: int | None = None
    ) -> Outcome:
        cmd = self.c.command(
            self.session,
            type_,
            payload or {},
            run_id=self.run_id,
            worker_id=self.worker_id,
            generation=self.generation,
            actor=None,
            ts=ts,
        )
        return self.c.wait(self.c.submit(cmd), 30)

    def acquire(self, lease_ms: int = 30_000) -> Outcome:
        """A lease of `lease_ms`: long unless the test wants it to run out (`LEASE_MS`): a
        2 s lease ran out on a loaded CI machine between a test's steps."""
        out = self.send("lease.acquire", {"leaseMs": lease_ms})
        granted = [e for e in out.events if e.type == "run.lease_granted"]
        if granted:
            self.generation = granted[0].generation
        return out


def start(c: SessionClient, session: str, text: str = "task") -> str:
    out = c.wait(c.prompt(session, text), 30)
    assert out.status == "accepted" and out.run_id
    return out.run_id


def types(out: Outcome) -> list[str]:
    return [e.type for e in out.events]


def payload(e: Event) -> dict[str, Any]:
    return e.payload.model_dump()


# -- 1. commands address runs ------------------------------------------------------------------


def test_a_late_abort_or_steer_for_a_finished_run_never_touches_the_next_one(
    world: Settings, client: SessionClient
) -> None:
    s = sid("late")
    run1 = start(client, s, "first")
    w = Worker(client, s, run1, "w1")
    w.acquire(30_000)
    queued = client.wait(client.prompt(s, "second", policy="enqueue"), 30)
    assert queued.status == "accepted"
    done = w.send("run.complete", {"result": "ok"})
    run2 = next(e.run_id for e in done.events if e.type == "run.started")
    for late in (client.abort(s, run_id=run1), client.steer(s, "other way", run_id=run1)):
        out = client.wait(late, 30)
        assert (out.status, out.reason) == ("rejected", "run_not_active")
        rej = payload(out.events[0])
        assert rej["target_run_id"] == run1 and rej["target_status"] == "completed"
    assert not [e for e in events(world, s) if e.run_id == run2 and e.type != "run.started"]
    # session-scoped, explicitly: today's meaning, the active run
    out = client.wait(client.abort(s, run_id=None), 30)
    assert out.status == "accepted" and out.run_id == run2


def test_the_sdk_names_the_run_it_last_saw(world: Settings, client: SessionClient) -> None:
    s = sid("sdk")
    run1 = start(client, s)
    assert client.known_run(s) == run1
    # another producer's prompt and a worker start the next run; this client reads nothing
    # meanwhile, so it has not seen it start
    with SessionClient("acme", world) as other:
        w = Worker(other, s, run1, "w1")
        w.acquire(30_000)
        other.wait(other.prompt(s, "theirs", policy="enqueue"), 30)
        w.send("run.complete", {})
    out = client.wait(client.abort(s), 30)  # meant for run1, as this client knew it
    assert (out.status, out.reason) == ("rejected", "run_not_active")
    # now it has read the log up to the abort's outcome: it knows the new run
    run2 = client.known_run(s)
    assert run2 not in (None, run1)
    assert client.wait(client.abort(s), 30).run_id == run2


def test_cli_abort_names_the_run_postgres_shows(world: Settings, client: SessionClient) -> None:
    s = sid("cli")
    run1 = start(client, s)
    w = Worker(client, s, run1, "w1")
    w.acquire(30_000)
    w.send("run.complete", {})
    wait_sink_caught_up(world, timeout=60)
    cli = Path(sys.executable).with_name("sessionstream")
    env = settings_env(world)

    def run(*args: str) -> dict[str, Any]:
        p = subprocess.run(
            [str(cli), "abort", s, "--tenant", "acme", "--json", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return {"code": p.returncode, **json.loads(p.stdout or "{}"), "err": p.stderr}

    # the last run it saw has ended: refused, not sent to whatever runs next
    late = run()
    assert (late["code"], late["status"], late["reason"]) == (1, "rejected", "run_not_active")
    assert run("--run", run1)["reason"] == "run_not_active"
    assert run("--any")["reason"] == "no_active_run"
    run2 = start(client, s, "again")
    wait_sink_caught_up(world, timeout=60)
    ok = run()
    assert (ok["code"], ok["status"], ok["runId"]) == (0, "accepted", run2)


# -- 2, 3. authorization before dedup; dedup compares content -----------------------------------


def test_a_foreign_command_takes_no_id_and_reused_ids_are_refused(
    world: Settings, client: SessionClient
) -> None:
    s = sid("ids")
    start(client, s)
    with SessionClient("intruder", world) as evil:
        forged = evil.command(s, "abort", {"reason": "x"}, command_id=f"{s}-abort-1")
        assert evil.wait(evil.submit(forged), 30).reason == "tenant_mismatch"
        assert evil.wait(evil.submit(forged), 30).reason == "tenant_mismatch"
    mine = client.command(s, "abort", {"reason": "mine"}, command_id=f"{s}-abort-1")
    out = client.wait(client.submit(mine), 30)
    assert out.status == "accepted" and types(out)[0] == "run.cancel_requested"
    assert client.wait(client.submit(mine), 30).status == "duplicate"
    other = client.command(s, "steer", {"text": "x"}, command_id=f"{s}-abort-1")
    out = client.wait(client.submit(other), 30)
    assert (out.status, out.reason) == ("rejected", "command_id_reused")


# -- 4, 5. the clock is the log's ---------------------------------------------------------------


def test_producer_clocks_decide_nothing(world: Settings, client: SessionClient) -> None:
    s = sid("clock")
    behind = client.now_ms() - 20 * 60_000
    out = client.wait(
        client.submit(
            client.command(s, "prompt", {"text": "t", "timeoutMs": 15 * 60_000}, ts=behind)
        ),
        30,
    )
    started = out.events[0]
    assert started.producer_ts == behind
    assert abs(started.ts - client.now_ms()) < 60_000, "ts is the broker's, not the producer's"
    assert payload(started)["timeout_at"] == started.ts + 15 * 60_000
    w = Worker(client, s, started.run_id, "w1")
    # a worker whose clock is in seconds still gets a lease that lasts from now
    grant = w.send("lease.acquire", {"leaseMs": 30_000}, ts=client.now_ms() // 1000)
    g = grant.events[0]
    assert payload(g)["lease_expires_at"] == g.ts + 30_000 and g.ts >= started.ts
    # an abort stamped an hour ahead gets the full grace from the log's now
    ahead = client.command(s, "abort", {}, ts=client.now_ms() + 3_600_000, run_id=started.run_id)
    req = client.wait(client.submit(ahead), 30).events[0]
    assert payload(req)["cancel_deadline_at"] == req.ts + 30_000
    # no timer fired early: the run is still cancelling, waiting for its holder
    assert "run.finished" not in [e.type for e in events(world, s)]


def test_a_forged_timer_ends_nothing(world: Settings, client: SessionClient) -> None:
    s = sid("forged")
    run = start(client, s)
    raw = {
        "commandId": f"timer:run_deadline:{run}:1:0",
        "sessionId": s,
        "tenantId": "acme",
        "type": "timer.fired",
        "ts": client.now_ms() + 10 * 3_600_000,  # its clock says the deadline has passed
        "runId": run,
        "generation": 1,
        "payload": {"kind": "run_deadline", "dueAt": 0},
    }
    p = Producer({"bootstrap.servers": world.kafka_bootstrap, "partitioner": "murmur2_random"})
    # a producer's or a worker's topic: not theirs to say; the processor's own timers topic
    # (closed by ACLs on a secured cluster, open on the dev stack): not due by the log's
    # clock. Each in turn, so their order in the log is known
    expected = []
    for topic, reason in (
        (world.commands_topic, "not_allowed_here"),
        (world.worker_commands_topic, "not_allowed_here"),
        (world.timers_topic, "timer_stale"),
    ):
        p.produce(topic, key=s.encode(), value=json.dumps(raw).encode())
        p.flush(30)
        expected.append(reason)

        def refused(n: int = len(expected)) -> list[Event] | None:
            got = [e for e in events(world, s) if e.type == "command.rejected"]
            return got if len(got) >= n else None

        got = wait_until(refused, timeout=30, what=f"rejection of the timer on {topic}")
        assert [payload(e)["reason"] for e in got] == expected
        assert {e.command_id for e in got} == {raw["commandId"]}
    assert "run.finished" not in [e.type for e in events(world, s)]
    # the run still works: its holder completes it
    w = Worker(client, s, run, "w1")
    assert types(w.acquire())[0] == "run.lease_granted"
    assert types(w.send("run.complete", {"result": "r"})) == ["run.finished"]


def test_each_topic_takes_only_its_writers_commands(world: Settings, client: SessionClient) -> None:
    """A worker command on the producers' topic and a producer command on the workers'
    topic are refused `not_allowed_here` and change nothing; the same command (same id) on
    its own topic then does what it says."""
    s = sid("classes")
    run = start(client, s)
    w = Worker(client, s, run, "w1")
    w.acquire()
    complete = client.command(
        s, "run.complete", {"result": "r"}, run_id=run, worker_id="w1", generation=w.generation
    )
    abort = client.command(s, "abort", {"reason": "user"}, run_id=run)
    p = Producer({"bootstrap.servers": world.kafka_bootstrap, "partitioner": "murmur2_random"})
    for topic, cmd in ((world.commands_topic, complete), (world.worker_commands_topic, abort)):
        p.produce(topic, key=s.encode(), value=CODEC.encode_command(cmd))
    p.flush(30)

    def refused() -> list[Event] | None:
        got = [e for e in events(world, s) if e.type == "command.rejected"]
        return got if len(got) >= 2 else None

    got = wait_until(refused, timeout=30, what="both misplaced commands refused")
    assert {(e.command_id, payload(e)["reason"]) for e in got} == {
        (complete.command_id, "not_allowed_here"),
        (abort.command_id, "not_allowed_here"),
    }
    assert [e.type for e in events(world, s)][-2:] == ["command.rejected"] * 2  # nothing else
    # the SDK sends each to its own topic: now they act (the ids were not used up)
    done = client.wait(client.submit(complete), 30)
    assert types(done) == ["run.finished"]
    # the abort names a run that has finished by now
    assert client.wait(client.submit(abort), 30).reason == "run_not_active"


# -- 6, 7, 8. every steer and follow-up has a fate ----------------------------------------------


def test_follow_ups_and_steers_survive_a_takeover(world: Settings, client: SessionClient) -> None:
    s = sid("takeover")
    run = start(client, s)
    w1 = Worker(client, s, run, "w1")
    w1.acquire(LEASE_MS)
    f = client.wait(client.follow_up(s, "also the last 7 days"), 30)
    st = client.wait(client.steer(s, "skip flights"), 30)
    assert types(f) == ["run.follow_up_queued"] and types(st) == ["run.steered"]
    # w1 goes silent: the processor's timer takes its lease
    expired = wait_event(world, s, "run.lease_expired", timeout=30)
    w2 = Worker(client, s, run, "w2")
    grant = w2.acquire(30_000)
    assert types(grant) == ["run.lease_granted", "run.input_delivered", "run.input_delivered"]
    given = {payload(e)["source_command_id"]: payload(e)["kind"] for e in grant.events[1:]}
    assert given == {f.command_id: "follow_up", st.command_id: "steer"}
    assert grant.events[0].generation == expired.generation
    # completing without the follow-up is not a completion: the round's result is kept and
    # the follow-up delivered again
    again = w2.send("run.complete", {"result": "r"})
    assert types(again) == ["run.round_completed", "run.follow_up_delivered"]
    assert payload(again.events[0])["result"] == "r"
    done = w2.send(
        "run.complete",
        {"result": "r", "consumedFollowUps": [f.command_id], "consumedSteers": [st.command_id]},
    )
    assert types(done) == ["run.input_consumed", "run.input_consumed", "run.finished"]


def test_a_cancelled_runs_follow_up_never_starts_ahead_of_the_next_task(
    world: Settings, client: SessionClient
) -> None:
    s = sid("cancelled")
    run = start(client, s)
    w = Worker(client, s, run, "w1")
    w.acquire(30_000)
    f = client.wait(client.send(s, "and tomorrow?"), 30)
    assert types(f) == ["run.follow_up_queued"]
    client.wait(client.abort(s), 30)
    late = client.wait(client.follow_up(s, "late", when_idle="reject"), 30)
    assert (late.status, late.reason) == ("rejected", "run_cancelling")
    nxt = client.wait(client.send(s, "NEW TASK"), 30)
    assert types(nxt) == ["run.queued"]
    ack = w.send("cancel.ack", {})
    assert types(ack) == [
        "run.cancel_acknowledged",
        "run.input_dropped",
        "run.finished",
        "run.started",
    ]
    dropped, started = payload(ack.events[1]), payload(ack.events[3])
    assert (dropped["source_command_id"], dropped["terminal_status"]) == (f.command_id, "cancelled")
    assert started["prompt"] == "NEW TASK" and started["origin"] == "queued"


# -- 9. takeover during compaction ---------------------------------------------------------------


def test_a_takeover_mid_compaction_leaves_a_run_the_next_holder_can_finish(
    world: Settings, client: SessionClient
) -> None:
    s = sid("compact")
    run = start(client, s)
    w1 = Worker(client, s, run, "w1")
    # the lease must outlast the next command and then run out: 2 s ran out before
    # compact.start was decided on a loaded CI machine (rejected as a stale write)
    w1.acquire(COMPACTION_LEASE_MS)
    assert types(w1.send("compact.start")) == ["run.compaction_started"]
    wait_event(world, s, "run.compaction_abandoned", timeout=30 + COMPACTION_LEASE_MS / 1000)
    w2 = Worker(client, s, run, "w2")
    w2.acquire(30_000)
    act = w2.send("action.request", {"idempotencyKey": f"{s}-mail", "kind": "email"})
    assert types(act) == ["action.approved"]
    assert types(w2.send("run.complete", {})) == ["run.finished"]


# -- 10, 11. bounds -------------------------------------------------------------------------------


def test_big_prompts_are_refused_and_the_partition_goes_on(
    world: Settings, client: SessionClient
) -> None:
    s = sid("big")
    big = "x" * 200_000
    start(client, s, big)
    outs = [client.wait(client.prompt(s, big, policy="enqueue"), 60) for _ in range(6)]
    assert [o.status for o in outs[:1]] == ["accepted"]
    assert {o.reason for o in outs[1:]} == {"queue_full"}
    # the state record stays writable: another session on the same partition is decided
    n = world.partitions
    neighbour = next(
        x
        for x in (sid("nb") for _ in range(200))
        if partition_for(x.encode(), n) == partition_for(s.encode(), n)
    )
    assert client.wait(client.prompt(neighbour, "small"), 30).status == "accepted"
    assert check_log(read_topic(world, world.events_topic)).ok


def test_a_huge_lease_is_capped_and_says_so(world: Settings, client: SessionClient) -> None:
    s = sid("lease")
    run = start(client, s)
    grant = Worker(client, s, run, "w1").send("lease.acquire", {"leaseMs": 10**12})
    g = payload(grant.events[0])
    assert (g["lease_ms"], g["capped"]) == (world.max_lease_ms, True)
    assert g["lease_expires_at"] == grant.events[0].ts + world.max_lease_ms


# -- 12, 14. who, and retries, into PostgreSQL -------------------------------------------------


def test_initiators_and_retries_reach_postgres(world: Settings, client: SessionClient) -> None:
    s = sid("who")
    run1 = start(client, s, "deploy")
    w = Worker(client, s, run1, "w1")
    w.acquire(30_000)
    failed = w.send("run.fail", {"error": "upstream 503", "retryable": True})
    assert payload(failed.events[-1])["retryable"] is True
    with SessionClient("acme", world, actor="scheduler:nightly") as sched:
        retry = sched.wait(sched.prompt(s, "deploy again", retry_of=run1), 30)
        assert payload(retry.events[0])["retry_of"] == run1
        assert payload(retry.events[0])["actor"] == "scheduler:nightly"
    run2 = retry.run_id
    assert run2 is not None
    cancel = client.wait(client.abort(s, run_id=run2), 30)
    assert payload(cancel.events[0])["actor"] == "user:ana"
    again = client.wait(client.prompt(s, "x", retry_of=run2), 30)  # cancelled: not retryable
    assert (again.reason, payload(again.events[0])["target_status"]) == (
        "not_retryable",
        "cancelled",
    )
    wait_sink_caught_up(world, timeout=60)
    with psycopg.connect(
        world.database_url, options=f"-c search_path={world.database_schema}"
    ) as c:
        rows = {
            r[0]: r[1:]
            for r in c.execute(
                "select run_id, started_by, cancelled_by, retryable, retry_of, terminal_status"
                " from agent_runs where session_id = %s",
                (s,),
            )
        }
        user = c.execute("select user_id from agent_sessions where session_id = %s", (s,))
        assert user.fetchone() == ("user:ana",)
    assert rows[run1] == ("user:ana", None, True, None, "failed")
    assert rows[run2] == ("scheduler:nightly", "user:ana", False, run1, "cancelled")


# -- 13. producers without murmur2 -------------------------------------------------------------


def test_a_default_partitioner_producer_loses_nothing(world: Settings) -> None:
    """librdkafka's default (consistent_random, CRC32) places most keys elsewhere: each such
    command is forwarded and decided, and its producer finds the outcome."""
    p = Producer({"bootstrap.servers": world.kafka_bootstrap})  # default partitioner
    sent = {}
    for i in range(24):
        s = sid(f"kcat{i}")
        cid = f"{s}-1"
        raw = {
            "commandId": cid,
            "sessionId": s,
            "tenantId": "acme",
            "type": "prompt",
            "ts": int(time.time() * 1000),
            "payload": {"text": "hi"},
        }
        p.produce(world.commands_topic, key=s.encode(), value=json.dumps(raw).encode())
        sent[cid] = s
    p.flush(30)

    def outcomes() -> dict[str, Event] | None:
        got = {}
        for r in read_topic(world, world.events_topic):
            e = CODEC.decode_event(r.value or b"")
            if e.command_id in sent and e.type == "run.started":
                got[e.command_id] = e
        return got if len(got) == len(sent) else None

    got = wait_until(outcomes, timeout=60, what="an outcome for every misplaced command")
    assert all(e.session_id == sent[c] for c, e in got.items())
    dlq = [
        r for r in read_topic(world, world.dlq_topic) if (r.key or b"").decode() in sent.values()
    ]
    assert dlq == []
