"""Two `sessionstream analytics` instances on the real broker and database: any instance
answers for every partition, and a kill -9 under load neither loses nor double counts.

A processor and the PostgreSQL sink run on an isolated world of 4 partitions while clients of
two tenants send a mix of commands (runs started, completed, failed, cancelled, timed out,
and rejected for several reasons). Two analytics instances of one app id split the
partitions; one is killed with SIGKILL mid-load (the other takes its partitions over) and
started again (they split again), then the other likewise. When the load has ended, the
pages of each instance must equal PostgreSQL's numbers exactly: runs started, finished by
status, active, and rejections by reason, per tenant.
"""

from __future__ import annotations

import contextlib
import random
import tempfile
import threading
import time
import urllib.error
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from sessionstream.client import SessionClient
from sessionstream.schemas.commands import PromptPayload
from sessionstream.settings import Settings
from tests.analytics_world import make_world
from tests.integration.conftest import WorldFactory
from tests.integration.helpers import wait_until
from tests.integration.procs import (
    Proc,
    processor,
    sink,
    wait_processed,
    wait_sink_caught_up,
)
from tests.integration.rows import db
from tests.integration.runtimes.analytics.test_analytics import (
    ALL_TIME,
    Analytics,
    Events,
    _free_port,
    expected_json,
)

pytestmark = pytest.mark.integration

TENANTS = ("tenant-a", "tenant-b")
FIELDS = {"completed": "completed", "cancelled": "cancelled", "failed": "failed"}
FIELDS["timed_out"] = "timedOut"


@pytest.fixture
def world(worlds: WorldFactory, kafka_bootstrap: str) -> Iterator[Settings]:
    s = worlds("analytics-scale")
    app_id = f"it-analytics-{uuid.uuid4().hex[:8]}"
    yield s.model_copy(update={"analytics_app_id": app_id})
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    ours = [t for t in admin.list_topics(timeout=10).topics if t.startswith(app_id)]
    for fut in admin.delete_topics(ours, operation_timeout=30).values() if ours else []:
        with contextlib.suppress(Exception):
            fut.result(timeout=60)
    with contextlib.suppress(Exception):
        admin.delete_consumer_groups([app_id])[app_id].result(timeout=30)


def instance(s: Settings) -> Analytics:
    """One analytics instance of `s`'s app id, on a port and data directory of its own."""
    return Analytics(
        s.model_copy(
            update={
                "analytics_port": _free_port(),
                "analytics_state_dir": tempfile.mkdtemp(prefix="ss-analytics-"),
            }
        )
    )


def served(app: Analytics) -> set[int] | None:
    """The partitions `app` answers for itself (None: not up)."""
    got = app.try_get("/stats/local?kind=active")
    return None if got is None else {int(p) for p in got["partitions"]}


def split(apps: list[Analytics], partitions: int) -> bool:
    """Each instance serves some partitions, and together exactly all of them, once."""
    shares = [served(a) for a in apps]
    if any(not s for s in shares):
        return False
    flat = [p for s in shares for p in s or ()]
    return sorted(flat) == list(range(partitions))


def merged_numbers(app: Analytics) -> dict[str, Any] | None:
    """Totals from `app`'s pages (merged over every instance); None while it answers 503."""
    try:
        runs = app.get(f"/stats/runs?{ALL_TIME}")["totals"]
        rejections = app.get(f"/stats/rejections?{ALL_TIME}")["totals"]
        active = app.get("/stats/active")["tenants"]
    except urllib.error.HTTPError as e:
        if e.code == 503:  # a partition unserved for a moment (rebalance, recovery)
            return None
        raise
    return {"runs": runs, "rejections": rejections, "active": active}


def postgres_numbers(s: Settings) -> dict[str, Any]:
    """The same totals from the sink's tables (`agent_runs`, `agent_run_events`)."""
    runs: dict[str, dict[str, int]] = {}
    active: dict[str, int] = {}
    rejections: dict[str, dict[str, int]] = {}
    with db(s) as conn:
        for tenant, status, n in conn.execute(
            "select tenant_id, terminal_status, count(*) from agent_runs group by 1, 2"
        ):
            row = runs.setdefault(tenant, {"started": 0, **dict.fromkeys(FIELDS.values(), 0)})
            row["started"] += n
            if status is None:
                active[tenant] = active.get(tenant, 0) + n
            else:
                row[FIELDS[status]] += n
        for tenant, reason, n in conn.execute(
            "select tenant_id, payload->>'reason', count(*) from agent_run_events"
            " where type = 'command.rejected' group by 1, 2"
        ):
            rejections.setdefault(tenant, {})[reason] = n
    return {
        "runs": dict(sorted(runs.items())),
        "rejections": {t: dict(sorted(r.items())) for t, r in sorted(rejections.items())},
        "active": dict(sorted(active.items())),
    }


def drive(s: Settings, tenant: str, stop: threading.Event, seed: int) -> None:
    """Commands of one tenant until `stop`: prompts (some with a short timeout), steers,
    follow-ups, sends and aborts without waiting, and now and then a run a fake worker
    completes or fails (waiting on each outcome)."""
    rnd = random.Random(seed)
    with SessionClient(tenant, s) as c:
        i = 0
        while not stop.is_set():
            i += 1
            sid = c.session_id(f"s{rnd.randrange(16)}")
            kind = rnd.choice(["prompt", "prompt", "steer", "follow_up", "abort", "send", "work"])
            if kind == "work":
                _work(c, c.session_id(f"w{rnd.randrange(6)}"), rnd)
                continue
            payload: Any = {} if kind == "abort" else {"text": f"{kind} {i}"}
            if kind == "prompt":
                payload = PromptPayload(text=f"p{i}", timeout_ms=rnd.choice([None, None, 300]))
            c.submit(c.command(sid, kind, payload), track=False)
            if i % 20 == 0:
                c.flush()
                stop.wait(0.02)  # pacing: a stream, not one burst
        c.flush()


def _work(c: SessionClient, sid: str, rnd: random.Random) -> None:
    started = c.wait(c.prompt(sid, "work"), 60)
    if started.status != "accepted" or not started.run_id:
        return
    w = {"run_id": started.run_id, "worker_id": "w1"}
    lease = c.wait(c.submit(c.command(sid, "lease.acquire", {}, **w)), 60)
    granted = [e for e in lease.events if e.type == "run.lease_granted"]
    if lease.status != "accepted" or not granted:
        return
    end, payload = rnd.choice([("run.complete", {"result": "ok"}), ("run.fail", {"error": "x"})])
    c.wait(c.submit(c.command(sid, end, payload, generation=granted[0].generation, **w)), 60)


def test_two_instances_answer_for_all_partitions_through_kill9_under_load(
    world: Settings, procs: list[Proc]
) -> None:
    t0 = time.monotonic()
    procs += [processor(world), sink(world)]
    a, b = instance(world).start(), instance(world).start()
    stop = threading.Event()
    drivers: list[threading.Thread] = []
    try:
        wait_until(
            lambda: split([a, b], world.partitions),
            timeout=120,
            interval=0.5,
            what="the two analytics instances to split the partitions",
        )
        drivers += [
            threading.Thread(target=drive, args=(world, t, stop, n), daemon=True)
            for n, t in enumerate(TENANTS)
        ]
        for d in drivers:
            d.start()

        def started_total(app: Analytics) -> int:
            got = merged_numbers(app)
            return sum(r["started"] for r in got["runs"].values()) if got else 0

        # kill -9 one while it folds: the other takes every partition over and answers
        # alone; the killed one comes back and they split again, all under load. First b,
        # then a (the first member, the group's leader)
        for victim, survivor in ((b, a), (a, b)):
            before = started_total(survivor)
            wait_until(
                lambda s=survivor, n=before: started_total(s) > n + 100,
                timeout=120,
                interval=0.2,
                what="load",
            )
            victim.kill9()
            wait_until(
                lambda s=survivor: served(s) == set(range(world.partitions)) and merged_numbers(s),
                timeout=120,
                interval=0.2,
                what="the surviving instance to serve every partition",
            )
            after_kill = started_total(survivor)
            wait_until(
                lambda s=survivor, n=after_kill: started_total(s) > n + 50,
                timeout=120,
                interval=0.2,
                what="load folded by the survivor",
            )
            victim.start()
            wait_until(
                lambda: split([a, b], world.partitions),
                timeout=120,
                interval=0.5,
                what="the restarted instance to take its share back",
            )
        stop.set()
        for d in drivers:
            d.join(timeout=120)
            assert not d.is_alive()
        wait_processed(world, procs=procs)
        wait_sink_caught_up(world, procs=procs)
        want = postgres_numbers(world)
        assert set(want["runs"]) == set(TENANTS), want
        assert all(sum(r.values()) > 0 for r in want["rejections"].values()), want
        # PostgreSQL's numbers read afresh each time: a run's deadline (prompts with 300 ms)
        # can still fire after the load is processed — a queued run starts, then times out
        # — and the instances read that event before the sink has written it
        for app in (a, b):
            try:
                wait_until(
                    lambda app=app: merged_numbers(app) == postgres_numbers(world),
                    timeout=120,
                    interval=0.5,
                    what=f"instance :{app.s.analytics_port} to report PostgreSQL's numbers",
                )
            except AssertionError:
                assert merged_numbers(app) == postgres_numbers(world)
                raise
        print(f"\nnumbers {want}\nin {time.monotonic() - t0:.1f} s")
    finally:
        stop.set()  # on a failure too: clients left sending time out into later tests
        for d in drivers:
            d.join(timeout=90)
        a.stop()
        b.stop()


def test_retention_minutes_drop_what_ended_before_the_horizon(world: Settings) -> None:
    """`SESSIONSTREAM_ANALYTICS_RETENTION_MINUTES` reaches the process: with 10 minutes, a
    history from 40 minutes ago followed by a recent one leaves only the recent history's
    rejections and cancel latencies, and every active run (active runs never expire)."""
    s = world.model_copy(update={"analytics_retention_minutes": 10})
    now = int(time.time() * 1000)
    old = make_world(sessions=60, runs_per_session=3, start_ms=now - 40 * 60_000, seed=5)
    recent = make_world(sessions=60, runs_per_session=3, start_ms=now - 6 * 60_000, seed=6)
    events = Events(s)
    events.send(old.events)
    events.send(recent.events)
    app = instance(s).start()
    try:
        app.wait_folded(events.last)
        progress = app.get("/stats/progress")
        assert progress["fold"]["expired"] > 0
        for p, c in progress["partitions"].items():
            w = c["watermark"] - 10 * 60_000
            assert c["horizon"] == w - w % 60_000, (p, c)
        want = expected_json(recent.expected)
        got = app.get(f"/stats/rejections?{ALL_TIME}")
        assert {k: got[k] for k in ("minutes", "totals")} == want["rejections"]
        assert app.get(f"/stats/cancel-latency?{ALL_TIME}")["overall"] == want["latency"]
        active = sum(old.expected.active.values()) + sum(recent.expected.active.values())
        assert app.get("/stats/active")["total"] == active
    finally:
        app.stop()
