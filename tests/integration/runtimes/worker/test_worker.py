"""Run workers against the real broker and database: cancel reach, steer, follow-up, timeout.

Workers run as `sessionstream worker --agent reference` subprocesses next to a real
processor; the reference agent's behaviour is set by words in the prompt (tool_ms=...).
"""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from pydantic import BaseModel, Field

from sessionstream.adapters.kafka import read_topic
from sessionstream.adapters.postgres.migrate import migrate
from sessionstream.adapters.registry import reader_codec
from sessionstream.client import SessionClient
from sessionstream.schemas.events import Event, RunFinished
from sessionstream.settings import Settings, get_settings
from tests.integration.helpers import check_log, wait_until
from tests.integration.procs import Proc, processor

pytestmark = pytest.mark.integration

_codec = reader_codec(get_settings())


@pytest.fixture
def db(iso: Settings, database_url: str) -> str:
    """A conninfo on the test's own schema, where its workers record their actions."""
    migrate(database_url, schema=iso.database_schema)
    return make_conninfo(database_url, options=f"-c search_path={iso.database_schema}")


class Order(BaseModel):
    """The typed input of the typed-input test's agent (at the module's top level: the
    handler's annotation is a string here, resolved where the handler was written)."""

    sku: str
    qty: int = Field(gt=0)


def start_worker(s: Settings, worker_id: str, lease_ms: int = 3000) -> Proc:
    return Proc(
        s,
        "worker",
        "--worker-id",
        worker_id,
        "--lease-ms",
        str(lease_ms),
    ).start()


def events(s: Settings, session_id: str) -> list[Event]:
    out = []
    for r in read_topic(s, s.events_topic):
        e = _codec.decode_event(r.value or b"")
        if e.session_id == session_id:
            out.append(e)
    return out


def run_events(s: Settings, run_id: str) -> list[Event]:
    return [e for e in _all(s) if e.run_id == run_id]


def _all(s: Settings) -> list[Event]:
    return [_codec.decode_event(r.value or b"") for r in read_topic(s, s.events_topic)]


def wait_event(
    s: Settings, run_id: str, type_: str, timeout: float = 60.0, procs: list[Proc] | None = None
) -> Event:
    def found() -> Event | None:
        for p in procs or []:
            p.assert_alive()
        return next((e for e in run_events(s, run_id) if e.type == type_), None)

    return wait_until(found, timeout=timeout, interval=0.1, what=f"{type_} of run {run_id}")


def terminal(s: Settings, run_id: str, timeout: float = 60.0) -> str:
    e = wait_event(s, run_id, "run.finished", timeout)
    return e.payload_as(RunFinished).terminal_status


def prompt(s: Settings, session_id: str, text: str, timeout_ms: int | None = None) -> str:
    with SessionClient("tenant-w", s) as c:
        out = c.wait(c.prompt(session_id, text, timeout_ms=timeout_ms), timeout=60)
    assert out.status == "accepted" and out.run_id, out
    return out.run_id


def outbox(db: str, run_id: str) -> list[tuple[str, str]]:
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "select idempotency_key, subject from agent_outbox where run_id = %s", (run_id,)
        ).fetchall()
    return [(str(k), str(v)) for k, v in rows]


def actions(db: str, run_id: str) -> list[tuple[str, int, str]]:
    with psycopg.connect(db) as conn:
        rows = conn.execute(
            "select idempotency_key, generation, status from agent_actions where run_id = %s",
            (run_id,),
        ).fetchall()
    return [(str(k), int(g), str(st)) for k, g, st in rows]


def ready(*workers: Proc) -> None:
    for w in workers:
        w.wait_log("ready:", timeout=60)


def test_cancel_while_a_tool_runs_reaches_the_tool_and_blocks_the_email(
    iso: Settings, db: str, procs: list[Proc]
) -> None:
    procs.append(processor(iso))
    w = start_worker(iso, "w-cancel")
    procs.append(w)
    ready(w)
    sid = f"cancel-{uuid.uuid4().hex[:6]}"
    run_id = prompt(iso, sid, "steps=1 tool_ms=6000 email=end")
    wait_event(iso, run_id, "tool.started", procs=procs)
    with SessionClient("tenant-w", iso) as c:
        aborted = c.wait(c.abort(sid, reason="user pressed stop"), timeout=30)
    assert aborted.status == "accepted"
    abort_ts = aborted.events[0].ts

    assert terminal(iso, run_id, timeout=30) == "cancelled"
    evs = run_events(iso, run_id)
    types = [e.type for e in evs]
    # the tool saw the abort (its tool.finished says so) well within a deadline
    tool_end = next(e for e in evs if e.type == "tool.finished")
    assert (tool_end.payload.model_dump().get("detail") or "").startswith("aborted"), tool_end
    assert tool_end.ts - abort_ts < 2000, f"tool saw the abort {tool_end.ts - abort_ts} ms late"
    # cancelled only after the holder's ack, which lists what it reached
    ack = next(e for e in evs if e.type == "run.cancel_acknowledged")
    assert types.index("run.cancel_acknowledged") < types.index("run.finished")
    assert ack.payload.model_dump()["tools_aborted"] == ["search:search-0"]
    assert "action.approved" not in types and "action.request" not in types

    # a marker run started after the cancel, as long as the cancelled one would have been:
    # when it is done (and its own email sent), the cancelled run's email would long be due
    marker = prompt(iso, sid, "steps=1 tool_ms=6500 email=end")
    assert terminal(iso, marker, timeout=60) == "completed"
    wait_until(lambda: outbox(db, marker), timeout=10, what="the marker run's email")
    assert outbox(db, run_id) == [], "a cancelled run sent its email"
    assert actions(db, run_id) == []
    report = check_log(read_topic(iso, iso.events_topic))
    assert report.ok, report.violations


def _detail(e: Event) -> str:
    return str(e.payload.model_dump().get("detail") or "")


def test_steer_reaches_the_next_step_and_a_follow_up_comes_before_the_end(
    iso: Settings, db: str, procs: list[Proc]
) -> None:
    procs.append(processor(iso))
    w = start_worker(iso, "w-steer")
    procs.append(w)
    ready(w)
    sid = f"steer-{uuid.uuid4().hex[:6]}"
    # 3 steps of 3 s: the steer and the follow-up must land while it runs, on a loaded CI
    # machine too (the approved-action test lost a 3 s window there)
    run_id = prompt(iso, sid, "steps=3 tool_ms=3000 email=no compact=1")
    wait_event(iso, run_id, "tool.started", procs=procs)
    with SessionClient("tenant-w", iso) as c:
        assert c.wait(c.steer(sid, "do not search that, try the archive")).status == "accepted"
        assert c.wait(c.follow_up(sid, "also look at the last 7 days")).status == "accepted"
    assert terminal(iso, run_id, timeout=60) == "completed"
    evs = run_events(iso, run_id)
    types = [e.type for e in evs]
    steered = types.index("run.steered")
    # the first model request after the steer (the handler's next step) carries it
    next_model = next(e for e in evs[steered:] if e.type == "model.request.started")
    assert "steer: do not search that, try the archive" in _detail(next_model)
    # the follow-up is delivered before the run finishes, and the handler answers it
    delivered = types.index("run.follow_up_delivered")
    finished = types.index("run.finished")
    assert delivered < finished
    answer = [e for e in evs[delivered:finished] if e.type == "model.request.started"]
    assert any("follow-up: also look at the last 7 days" in _detail(e) for e in answer)
    result = evs[finished].payload_as(RunFinished).result
    assert result == "follow-ups handled: 1"
    assert all(e.generation == 1 for e in evs)
    assert "context.checkpointed" in types and "run.compaction_finished" in types


def test_a_run_past_its_deadline_times_out_and_the_worker_stops_it(
    iso: Settings, db: str, procs: list[Proc]
) -> None:
    procs.append(processor(iso))
    w = start_worker(iso, "w-deadline")
    procs.append(w)
    ready(w)
    sid = f"deadline-{uuid.uuid4().hex[:6]}"
    run_id = prompt(iso, sid, "steps=1 tool_ms=8000 email=end", timeout_ms=2500)
    wait_event(iso, run_id, "tool.started", procs=procs)
    assert terminal(iso, run_id, timeout=30) == "timed_out"
    w.wait_log(f"run {run_id}: stopped locally: run finished: timed_out", timeout=10)
    # past the run's would-be end (a marker run as long as it) nothing more came from it
    marker = prompt(iso, sid, "steps=1 tool_ms=8500 email=no")
    assert terminal(iso, marker, timeout=60) == "completed"
    assert outbox(db, run_id) == [] and actions(db, run_id) == []
    evs = run_events(iso, run_id)
    assert evs[-1].type == "run.finished"
    assert not [e for e in evs if e.type == "tool.finished"], "the tool ran to its end"
    late = [
        e
        for e in events(iso, sid)
        if e.type == "command.rejected"
        and e.payload.model_dump().get("target_run_id") == run_id
        and e.payload.model_dump().get("command_type") != "lease.renew"
    ]
    assert not late, f"the worker kept writing after the deadline: {late}"


def test_cancel_during_a_model_call_aborts_it_and_cancels_subtasks(
    iso: Settings, db: str, procs: list[Proc]
) -> None:
    procs.append(processor(iso))
    w = start_worker(iso, "w-model")
    procs.append(w)
    ready(w)
    sid = f"model-{uuid.uuid4().hex[:6]}"
    run_id = prompt(iso, sid, "steps=1 model_ms=20000 subtask_ms=20000 email=end")
    wait_event(iso, run_id, "model.request.started", procs=procs)
    with SessionClient("tenant-w", iso) as c:
        assert c.wait(c.abort(sid), timeout=30).status == "accepted"
    assert terminal(iso, run_id, timeout=30) == "cancelled"
    evs = run_events(iso, run_id)
    ack = next(e for e in evs if e.type == "run.cancel_acknowledged").payload.model_dump()
    assert ack["model_request_aborted"] is True
    assert ack["subtasks_cancelled"] == ["background-index"]
    # the sub-task's end is an event of its own, with why
    sub_end = [e for e in evs if e.type == "subtask.finished"]
    assert len(sub_end) == 1 and _detail(sub_end[0]) == "aborted: user"
    model_end = next(e for e in evs if e.type == "model.request.finished")
    assert _detail(model_end).startswith("aborted")
    assert "tool.started" not in [e.type for e in evs]
    assert outbox(db, run_id) == []


def test_a_cancel_during_an_approved_action_says_it_was_executing(
    iso: Settings, db: str, procs: list[Proc]
) -> None:
    """An approved action already running is not torn mid-way (its transaction may be
    committing): the acknowledgement names it, and it completes exactly once."""
    procs.append(processor(iso))
    w = start_worker(iso, "w-action")
    procs.append(w)
    ready(w)
    sid = f"act-{uuid.uuid4().hex[:6]}"
    # the action runs 15 s: the abort must land while it runs, and a loaded CI machine
    # took more than 3 s from action.approved to the abort's outcome
    run_id = prompt(iso, sid, "steps=1 tool_ms=10 email=start email_ms=15000")
    wait_event(iso, run_id, "action.approved", procs=procs)
    with SessionClient("tenant-w", iso) as c:
        out = c.wait(c.abort(sid), timeout=30)
    assert out.status == "accepted", out
    assert terminal(iso, run_id, timeout=60) == "cancelled"
    ack = next(e for e in run_events(iso, run_id) if e.type == "run.cancel_acknowledged")
    assert ack.payload.model_dump()["actions_executing"] == [f"{run_id}:email:start"]
    assert len(outbox(db, run_id)) == 1


def test_a_worker_whose_producer_turns_fatal_releases_its_run_and_says_why(
    iso: Settings, db: str, procs: list[Proc]
) -> None:
    """A background task of the worker fails: here its presence beat meets a fatal
    producer error (injected into the worker's own presence call; the producer itself is
    real). The task used to die unseen (its error logged, if ever, when collected) and the
    worker ran on, silent to the others while it held its runs. Now it stops as on
    SIGTERM — the run it held is released for another worker — and `run` raises the
    error (the CLI exits 2 with it)."""
    import asyncio

    from sessionstream.adapters.topics import ensure_topics
    from sessionstream.errors import KafkaFailed, KafkaUnavailable
    from sessionstream.runtimes.worker.reference_agent import reference_agent
    from sessionstream.runtimes.worker.runtime import Worker

    ensure_topics(iso)
    procs.append(processor(iso))
    w = Worker(iso, reference_agent, "w-fatal", database_url=db, presence_interval_s=0.2)
    sid = f"fatal-{uuid.uuid4().hex[:6]}"

    async def main() -> None:
        stop = asyncio.Event()
        running = asyncio.create_task(w.run(stop))
        await asyncio.wait_for(w.ready.wait(), 60)
        run_id = await asyncio.to_thread(prompt, iso, sid, "steps=1 tool_ms=60000 email=no")
        await asyncio.to_thread(wait_event, iso, run_id, "tool.started", 60.0, procs)
        assert run_id in w.executions

        def fatal(*, leaving: bool = False) -> None:
            # what the Kafka adapter's producer raises for a fatal driver error
            raise KafkaFailed("injected", name="_FATAL", fatal=True)

        w._publish_presence = fatal  # type: ignore[method-assign]
        with pytest.raises(KafkaUnavailable, match=r"the worker failed: .*injected"):
            await asyncio.wait_for(running, 60)
        assert stop.is_set() and isinstance(w.failure, KafkaFailed)
        await asyncio.to_thread(wait_event, iso, run_id, "run.lease_released", 30.0)
        # released, not ended: another worker may take it up
        assert "run.finished" not in [e.type for e in run_events(iso, run_id)]

    asyncio.run(main())


def test_a_record_key_that_is_not_utf8_is_skipped_and_the_worker_stays_up(
    iso: Settings, db: str, procs: list[Proc]
) -> None:
    """Every worker reads the whole compacted `session.workers` and `session.open-runs`
    topics. One record there whose key is not UTF-8 used to end the feed, and with it
    every worker, again on every restart. It is skipped (ERROR logged); the worker runs
    the next prompt."""
    from confluent_kafka import Producer

    procs.append(processor(iso))
    w = start_worker(iso, "w-badkey")
    procs.append(w)
    ready(w)
    p = Producer({"bootstrap.servers": iso.kafka_bootstrap})
    for topic in (iso.workers_topic, iso.open_runs_topic):
        p.produce(topic, key=b"\xff\xfe-not-utf8", value=None)  # a tombstone: no value to refuse
    assert p.flush(30) == 0
    for topic in (iso.workers_topic, iso.open_runs_topic):
        w.wait_log(f"a {topic} record with a key that is not UTF-8 skipped", 30)
    run_id = prompt(iso, f"badkey-{uuid.uuid4().hex[:6]}", "steps=1 tool_ms=50 email=no")
    assert terminal(iso, run_id, timeout=60) == "completed"
    w.assert_alive()


def test_a_worker_whose_feed_dies_stops_and_run_raises_its_error(
    iso: Settings, db: str, procs: list[Proc]
) -> None:
    """A feed thread that ends with an error stops the worker as SIGTERM does, and `run`
    raises that error (the CLI exits non-zero): it used to SIGTERM its own process, so a
    program embedding the worker was killed, and `sessionstream worker` exited 0 as if
    stopped on purpose."""
    import asyncio

    from sessionstream.adapters.topics import ensure_topics
    from sessionstream.runtimes.worker.reference_agent import reference_agent
    from sessionstream.runtimes.worker.runtime import Worker

    ensure_topics(iso)
    w = Worker(iso, reference_agent, "w-feed", database_url=db, presence_interval_s=0.2)

    async def main() -> None:
        stop = asyncio.Event()
        running = asyncio.create_task(w.run(stop))
        await asyncio.wait_for(w.ready.wait(), 60)

        def broken(key: bytes, value: bytes | None, partition: int, ts: int) -> None:
            raise RuntimeError("the feed broke")

        w.presence.handle = broken  # type: ignore[method-assign]  # the next beat reaches it
        with pytest.raises(RuntimeError, match="the feed broke"):
            await asyncio.wait_for(running, 60)
        assert stop.is_set()

    asyncio.run(main())


def test_a_result_too_large_to_record_fails_the_run_with_the_reason(
    iso: Settings, db: str, procs: list[Proc]
) -> None:
    """A handler's result over the worker's `max_payload_bytes`: the worker fails the run
    at once, saying why. And when the processor is the one to refuse the completion (its
    limit lower than the worker's: two configurations), the refusal fails the run too.
    Either used to leave the run `running` until its deadline, then `timed_out`, with no
    word of the cause."""
    import asyncio

    from sessionstream.adapters.topics import ensure_topics
    from sessionstream.runtimes.worker.context import RunContext
    from sessionstream.runtimes.worker.runtime import Worker

    ensure_topics(iso)
    procs.append(processor(iso.model_copy(update={"max_payload_bytes": 50_000})))

    async def handler(ctx: RunContext) -> str:
        return "x" * 120_000

    w = Worker(iso, handler, "w-big", database_url=db)

    def finished(run_id: str) -> RunFinished:
        e = wait_event(iso, run_id, "run.finished", 60.0, procs)
        return e.payload_as(RunFinished)

    async def main() -> None:
        stop = asyncio.Event()
        running = asyncio.create_task(w.run(stop))
        await asyncio.wait_for(w.ready.wait(), 60)
        w.max_payload_bytes = 100_000  # below the result: the worker's own check
        own = await asyncio.to_thread(prompt, iso, f"big-{uuid.uuid4().hex[:6]}", "go")
        done = await asyncio.to_thread(finished, own)
        assert done.terminal_status == "failed"
        assert "the result is too large to record: 120" in (done.error or ""), done
        w.max_payload_bytes = 1_000_000  # above it, and the processor's 50,000 below
        refused = await asyncio.to_thread(prompt, iso, f"big-{uuid.uuid4().hex[:6]}", "go")
        done = await asyncio.to_thread(finished, refused)
        assert done.terminal_status == "failed"
        assert (done.error or "").startswith("run.complete rejected: payload_too_large"), done
        stop.set()
        await asyncio.wait_for(running, 30)

    asyncio.run(main())


def test_a_handler_misused_or_failing_outside_its_own_errors_fails_its_run_once(
    iso: Settings, db: str, procs: list[Proc]
) -> None:
    """A plain `def run(ctx)` is refused when the worker is built. And what used to escape
    the execution — a plain `def` that slipped through, a result `json` cannot encode — or
    a handler saying `RunCancelled` when nothing cancelled the run: each fails its run once,
    at generation 1, saying why. The first two used to log a traceback and send nothing:
    the lease expired and the run was taken again and again until its deadline."""
    import asyncio

    from sessionstream.adapters.topics import ensure_topics
    from sessionstream.errors import ConfigurationError
    from sessionstream.runtimes.worker._signal import RunCancelled
    from sessionstream.runtimes.worker.context import RunContext
    from sessionstream.runtimes.worker.runtime import Worker

    def plain(ctx: RunContext) -> str:
        return "a plain def"

    with pytest.raises(ConfigurationError, match=r"not a coroutine function.*async def run"):
        Worker(iso, plain, "w-plain", database_url=db)

    ensure_topics(iso)
    procs.append(processor(iso))

    async def handler(ctx: RunContext) -> object:
        if ctx.prompt == "set":
            return {"a", "b"}
        raise RunCancelled("gave up on my own")

    w = Worker(iso, handler, "w-misuse", database_url=db, lease_ms=1500)
    # and a plain def that got past the check (assigned after it): the execution's own guard
    sneaky = Worker(iso, handler, "w-misuse-sync", database_url=db, lease_ms=1500)
    sneaky.handler = plain  # type: ignore[assignment]

    def finished(run_id: str) -> RunFinished:
        e = wait_event(iso, run_id, "run.finished", 60.0, procs)
        return e.payload_as(RunFinished)

    async def run_with(worker: Worker, *texts: str) -> list[tuple[str, RunFinished]]:
        stop = asyncio.Event()
        running = asyncio.create_task(worker.run(stop))
        await asyncio.wait_for(worker.ready.wait(), 60)
        out = []
        for text in texts:
            sid = f"misuse-{uuid.uuid4().hex[:6]}"
            run_id = await asyncio.to_thread(prompt, iso, sid, text)
            out.append((run_id, await asyncio.to_thread(finished, run_id)))
        stop.set()
        await asyncio.wait_for(running, 30)
        return out

    async def main() -> list[tuple[str, RunFinished]]:
        return await run_with(w, "set", "cancelled") + await run_with(sneaky, "plain")

    (not_json, not_json_end), (said_cancelled, said_end), (sync, sync_end) = asyncio.run(main())
    assert not_json_end.terminal_status == "failed"
    assert "the handler returned a value of type set, which is not JSON" in (
        not_json_end.error or ""
    ), not_json_end
    assert said_end.terminal_status == "failed"
    assert "RunCancelled('gave up on my own'), but the run was not cancelled" in (
        said_end.error or ""
    ), said_end
    assert sync_end.terminal_status == "failed"
    assert "not an awaitable" in (sync_end.error or ""), sync_end
    for run_id in (not_json, said_cancelled, sync):
        evs = run_events(iso, run_id)
        grants = [e for e in evs if e.type == "run.lease_granted"]
        assert len(grants) == 1 and grants[0].generation == 1, [e.type for e in evs]
        assert evs[-1].type == "run.finished"


def test_a_dict_result_completes_the_run_as_json_after_its_action_ran_once(
    iso: Settings, db: str, procs: list[Proc]
) -> None:
    """An agent that sends an email (an approved action) and returns a dict: the run
    completes with the dict as its JSON text. It used to fail ("Input should be a valid
    string") after the email had gone."""
    import asyncio
    import json

    from sessionstream.adapters.topics import ensure_topics
    from sessionstream.runtimes.worker.context import RunContext
    from sessionstream.runtimes.worker.executor import ActionRun
    from sessionstream.runtimes.worker.runtime import Worker

    ensure_topics(iso)
    procs.append(processor(iso))

    async def write(a: ActionRun) -> str:
        assert a.conn is not None
        await a.conn.execute(
            "insert into agent_outbox (idempotency_key, session_id, run_id, recipient,"
            " subject, body) values (%s, %s, %s, %s, %s, %s)",
            (a.idempotency_key, a.session_id, a.run_id, "ops@example.com", "report", "done"),
        )
        return "email to ops@example.com"

    async def handler(ctx: RunContext) -> dict[str, object]:
        sent = await ctx.action("email", f"{ctx.run_id}:email", write)
        return {"answer": "42 rows", "email": sent, "steps": [1, 2], "ok": True}

    w = Worker(iso, handler, "w-dict", database_url=db)

    async def main() -> tuple[str, RunFinished]:
        stop = asyncio.Event()
        running = asyncio.create_task(w.run(stop))
        await asyncio.wait_for(w.ready.wait(), 60)
        run_id = await asyncio.to_thread(prompt, iso, f"dict-{uuid.uuid4().hex[:6]}", "go")
        e = await asyncio.to_thread(wait_event, iso, run_id, "run.finished", 60.0, procs)
        stop.set()
        await asyncio.wait_for(running, 30)
        return run_id, e.payload_as(RunFinished)

    run_id, done = asyncio.run(main())
    assert done.terminal_status == "completed", done
    assert json.loads(done.result or "") == {
        "answer": "42 rows",
        "email": "email to ops@example.com",
        "steps": [1, 2],
        "ok": True,
    }
    assert outbox(db, run_id) == [(f"{run_id}:email", "report")]
    assert actions(db, run_id) == [(f"{run_id}:email", 1, "done")]
    assert [e.generation for e in run_events(iso, run_id) if e.type == "run.lease_granted"] == [1]


def test_a_typed_input_reaches_the_handler_and_one_that_does_not_fit_fails_before_its_action(
    iso: Settings, db: str, procs: list[Proc]
) -> None:
    """A prompt sent with an input through the SDK (a pydantic model) and through the CLI
    (`--input JSON`): the handler gets the JSON value as `ctx.input` and the validated
    `Order` as its second argument, its action runs once and its dict result completes the
    run. A prompt whose input does not fit `Order` fails its run at once, saying why: the
    handler is not called, no action is asked for, the outbox stays empty."""
    import asyncio
    import json
    import subprocess
    import sys

    from sessionstream.adapters.topics import ensure_topics
    from sessionstream.apps._procs import settings_env
    from sessionstream.runtimes.worker.context import RunContext
    from sessionstream.runtimes.worker.executor import ActionRun
    from sessionstream.runtimes.worker.runtime import Worker
    from sessionstream.schemas.events import RunStarted

    ensure_topics(iso)
    procs.append(processor(iso))
    seen: list[tuple[object, Order]] = []

    async def write(a: ActionRun) -> str:
        assert a.conn is not None
        await a.conn.execute(
            "insert into agent_outbox (idempotency_key, session_id, run_id, recipient,"
            " subject, body) values (%s, %s, %s, %s, %s, %s)",
            (a.idempotency_key, a.session_id, a.run_id, "shop@example.com", "order", "ok"),
        )
        return "booked"

    async def handler(ctx: RunContext, order: Order) -> dict[str, object]:
        seen.append((ctx.input, order))
        booked = await ctx.action("order", f"{ctx.run_id}:book", write)
        return {"sku": order.sku, "qty": order.qty, "total": order.qty * 2.5, "state": booked}

    w = Worker(iso, handler, "w-typed", database_url=db)

    def send(sid: str, given: object) -> str:
        with SessionClient("tenant-w", iso) as c:
            out = c.wait(c.prompt(sid, "book it", input=given), timeout=60)
        assert out.status == "accepted" and out.run_id, out
        return out.run_id

    cli = [sys.executable, "-c", "from sessionstream.apps.cli import main; main()"]

    def send_by_cli(sid: str, given: str) -> str:
        done = subprocess.run(
            [*cli, "prompt", sid, "book it", "--tenant", "tenant-w", "--input", given, "--json"],
            env=settings_env(iso),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert out["status"] == "accepted", out
        return str(out["runId"])

    async def main() -> tuple[list[str], dict[str, RunFinished]]:
        stop = asyncio.Event()
        running = asyncio.create_task(w.run(stop))
        await asyncio.wait_for(w.ready.wait(), 60)
        runs = [
            await asyncio.to_thread(send, "typed-a", Order(sku="A-1", qty=2)),
            await asyncio.to_thread(send_by_cli, "typed-c", '{"sku": "C-3", "qty": 1}'),
            await asyncio.to_thread(send, "typed-b", {"sku": "B-2", "qty": "lots"}),
        ]
        out = {}
        for run_id in runs:
            e = await asyncio.to_thread(wait_event, iso, run_id, "run.finished", 60.0, procs)
            out[run_id] = e.payload_as(RunFinished)
        stop.set()
        await asyncio.wait_for(running, 30)
        return runs, out

    (good, by_cli, bad), ended = asyncio.run(main())
    assert seen == [
        ({"sku": "A-1", "qty": 2}, Order(sku="A-1", qty=2)),
        ({"sku": "C-3", "qty": 1}, Order(sku="C-3", qty=1)),
    ]
    for run_id, (sku, qty) in ((good, ("A-1", 2)), (by_cli, ("C-3", 1))):
        done = ended[run_id]
        assert done.terminal_status == "completed", done
        result = {"sku": sku, "qty": qty, "total": qty * 2.5, "state": "booked"}
        assert json.loads(done.result or "") == result
        assert outbox(db, run_id) == [(f"{run_id}:book", "order")]
        started = run_events(iso, run_id)[0].payload_as(RunStarted)
        assert json.loads(started.input or "") == {"sku": sku, "qty": qty}
    failed = ended[bad]
    assert failed.terminal_status == "failed" and not failed.retryable
    assert (failed.error or "").startswith("the input does not match Order: qty: Input should"), (
        failed.error
    )
    types = [e.type for e in run_events(iso, bad)]
    assert types == ["run.started", "run.lease_granted", "run.finished"], types
    assert outbox(db, bad) == [] and actions(db, bad) == []
