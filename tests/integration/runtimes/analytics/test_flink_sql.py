"""Flink SQL over the run event stream against the real broker, registry
and PostgreSQL: the queries of sessionstream/runtimes/analytics/flink/ on a bounded read_committed
read
equal what the sink projected (`sessionstream stats` and the same definitions in SQL), and a
record whose schema id the registry lacks stops the job with that reason.

Needs the Flink virtualenv and jars (`stack/flink/install.sh`); without them the tests fail
with that hint, they are never skipped.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer

from sessionstream.apps._procs import settings_env
from sessionstream.client import SessionClient
from sessionstream.runtimes.sink.stats import run_stats
from sessionstream.settings import Settings
from tests.integration.conftest import TopicFactory, WorldFactory
from tests.integration.helpers import wait_until
from tests.integration.procs import (
    REPO,
    Proc,
    processor,
    sink,
    wait_processed,
    wait_sink_caught_up,
)

pytestmark = pytest.mark.integration

JOB = REPO / "sessionstream" / "runtimes" / "analytics" / "flink_job.py"


@pytest.fixture(scope="module")
def flink_python() -> Path:
    """The Flink virtualenv and jars, put there by stack/flink/install.sh (idempotent)."""
    where = subprocess.run(
        [str(REPO / "stack" / "flink" / "install.sh"), "where"],
        capture_output=True,
        text=True,
        check=True,
    )
    env = dict(line.split("=", 1) for line in where.stdout.splitlines())
    missing = [
        p for p in [env["FLINK_PYTHON"], *env["FLINK_JARS"].split(";")] if not Path(p).exists()
    ]
    if missing:
        pytest.fail(
            f"Flink SQL needs {missing}: run 'stack/flink/install.sh' (make flink)", pytrace=False
        )
    return Path(env["FLINK_PYTHON"])


def run_job(flink_python: Path, s: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = settings_env(s)
    return subprocess.run(
        [str(flink_python), str(JOB), "--bounded", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


def results(out: str) -> dict[str, list[dict[str, Any]]]:
    by_query: dict[str, list[dict[str, Any]]] = {}
    for line in out.splitlines():
        r = json.loads(line)
        assert r["op"] == "+I", r  # a bounded run only inserts
        by_query.setdefault(r["query"], []).append(r["row"])
    return by_query


@pytest.fixture
def iso(worlds: WorldFactory) -> Settings:
    return worlds("flink-sql", partitions=3)


def _world(s: Settings) -> None:
    """Two tenants, different mixes: cancelled runs (with a session_busy rejection each),
    a timed-out run, runs left running, an abort with nothing to abort."""
    plan = {"acme": (4, 1, 2), "globex": (2, 1, 1)}  # cancelled, timed out, running
    with SessionClient("acme", s) as acme, SessionClient("globex", s) as globex:
        for tenant, c in (("acme", acme), ("globex", globex)):
            cancelled, timed_out, running = plan[tenant]
            for _ in range(cancelled):
                sid = f"{tenant}:{uuid.uuid4().hex[:8]}"
                assert c.wait(c.prompt(sid, "go"), 60).status == "accepted"
                assert c.wait(c.prompt(sid, "again"), 30).reason == "session_busy"
                time.sleep(0.05)  # durations that differ
                assert c.wait(c.abort(sid), 30).status == "accepted"
            for _ in range(timed_out):
                sid = f"{tenant}:{uuid.uuid4().hex[:8]}"
                assert c.wait(c.prompt(sid, "slow", timeout_ms=1500), 60).status == "accepted"
            for _ in range(running):
                sid = f"{tenant}:{uuid.uuid4().hex[:8]}"
                assert c.wait(c.prompt(sid, "stay"), 60).status == "accepted"
        idle = f"globex:{uuid.uuid4().hex[:8]}"
        assert globex.wait(globex.abort(idle), 30).reason == "no_active_run"


def _pg(s: Settings) -> psycopg.Connection[Any]:
    return psycopg.connect(s.database_url, options=f"-c search_path={s.database_schema}")


def _ms(col: str) -> str:
    return f"(extract(epoch from {col}) * 1000)::bigint"


def test_the_sql_files_on_a_bounded_read_equal_postgresql(
    iso: Settings, procs: list[Proc], flink_python: Path
) -> None:
    procs.append(processor(iso))
    procs.append(sink(iso))
    _world(iso)

    def timed_out() -> bool:
        with _pg(iso) as conn:
            row = conn.execute(
                "select count(*) from agent_runs where terminal_status = 'timed_out'"
            ).fetchone()
        return bool(row and row[0] == 2)

    wait_until(timed_out, timeout=120, interval=0.5, what="both timed-out runs in PostgreSQL")
    wait_processed(iso, procs=procs)
    wait_sink_caught_up(iso, procs=procs)

    t0 = time.monotonic()
    done = run_job(flink_python, iso)
    took = time.monotonic() - t0
    assert done.returncode == 0, done.stderr[-4000:]
    got = results(done.stdout)
    print(f"flink job: {took:.1f} s, {sum(map(len, got.values()))} rows")

    with _pg(iso) as conn:
        stats = run_stats(conn)["tenants"]
        minute = "date_trunc('minute', {})"
        per_minute = conn.execute(
            f"select tenant_id, {_ms(minute.format('created_at'))}, 'started', count(*)"
            " from agent_runs group by 1, 2"
            f" union all select tenant_id, {_ms(minute.format('terminal_at'))},"
            " terminal_status, count(*) from agent_runs where terminal_at is not null"
            " group by 1, 2, 3"
        ).fetchall()
        rejected = conn.execute(
            f"select tenant_id, {_ms(minute.format('ts'))}, payload->>'reason',"
            " payload->>'commandType', count(*) from agent_run_events"
            " where type = 'command.rejected' group by 1, 2, 3, 4"
        ).fetchall()
        pct = ", ".join(
            f"percentile_cont({p}) within group (order by {{x}})" for p in (0.5, 0.95, 0.99)
        )
        dur = "extract(epoch from terminal_at - created_at) * 1000"
        cancel = "extract(epoch from terminal_at - cancel_requested_at) * 1000"
        durations = conn.execute(
            f"select tenant_id, count(*), {pct.format(x=dur)} from agent_runs"
            " where terminal_at is not null group by 1"
        ).fetchall()
        cancels = conn.execute(
            f"select tenant_id, count(*), {pct.format(x=cancel)} from agent_runs"
            " where status = 'cancelled' and cancel_requested_at is not null group by 1"
        ).fetchall()
        active_at = {
            (r["tenant"], r["at_time"]): conn.execute(
                f"select count(*) from agent_runs where tenant_id = %s and {_ms('created_at')} < %s"
                f" and (terminal_at is null or {_ms('terminal_at')} >= %s)",
                (r["tenant"], r["at_time"], r["at_time"]),
            ).fetchone()[0]  # type: ignore[index]
            for r in got["active_runs_over_time"]
        }

    # the world is what the test made (a guard against comparing two empty results)
    assert stats["acme"]["runs"] == {"cancelled": 4, "timed_out": 1, "running": 2}
    assert stats["globex"]["runs"] == {"cancelled": 2, "timed_out": 1, "running": 1}

    # runs by status per tenant per minute: exactly the projection's created_at/terminal_at
    flink_minutes = Counter(
        {
            (r["tenant"], r["window_start"], r["status"]): r["runs"]
            for r in got["runs_by_status_per_minute"]
        }
    )
    assert all(
        r["window_end"] - r["window_start"] == 60_000 for r in got["runs_by_status_per_minute"]
    )
    assert flink_minutes == Counter({(t, int(m), st): n for t, m, st, n in per_minute})

    # every run's current status: `sessionstream stats`' runs
    totals: dict[str, dict[str, int]] = {}
    for r in got["run_status_totals"]:
        totals.setdefault(r["tenant"], {})[r["status"]] = r["runs"]
    assert totals == {t: v["runs"] for t, v in stats.items()}

    # rejections by reason: per minute as in agent_run_events, summed as in stats
    flink_rej = Counter(
        {
            (r["tenant"], r["window_start"], r["reason"], r["command_type"]): r["rejections"]
            for r in got["rejections_by_reason"]
        }
    )
    assert flink_rej == Counter({(t, int(m), re, ct): n for t, m, re, ct, n in rejected})
    summed: dict[str, Counter[str]] = {}
    for (t, _, reason, _), n in flink_rej.items():
        summed.setdefault(t, Counter())[reason] += n
    assert summed == {t: Counter(v["rejections"]) for t, v in stats.items() if v["rejections"]}
    assert summed["acme"] == {"session_busy": 4}
    assert summed["globex"] == {"session_busy": 2, "no_active_run": 1}

    # percentiles: PostgreSQL's percentile_cont (linear interpolation between the two
    # nearest values) = Flink's PERCENTILE; stats rounds to 0.1 ms
    def check(name: str, pg_rows: list[tuple[Any, ...]], key: str) -> None:
        flink = {r["tenant"]: r for r in got[name]}
        assert set(flink) == {row[0] for row in pg_rows}
        for tenant, n, *ps in pg_rows:
            f = flink[tenant]
            assert f["n"] == n == stats[tenant][key]["n"]
            for label, p in zip(("p50", "p95", "p99"), ps, strict=True):
                assert f[label] == pytest.approx(float(p), abs=1e-6), (name, tenant, label)
                assert round(f[label], 1) == stats[tenant][key][label], (name, tenant, label)

    check("run_duration_percentiles", durations, "duration_ms")
    check("cancel_latency_percentiles", cancels, "cancel_latency_ms")

    # active runs at each window end: runs created before it and not ended before it
    assert got["active_runs_over_time"]
    for r in got["active_runs_over_time"]:
        assert r["active"] == active_at[(r["tenant"], r["at_time"])], r
    last = {
        r["tenant"]: r for r in sorted(got["active_runs_over_time"], key=lambda r: r["at_time"])
    }
    assert {t: r["active"] for t, r in last.items()} == {"acme": 2, "globex": 1}


def test_a_record_whose_schema_the_registry_lacks_stops_the_job_with_the_reason(
    settings: Settings, topic_factory: TopicFactory, flink_python: Path
) -> None:
    topic = topic_factory(partitions=1)
    unknown = 2**31 - 7
    p = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    p.produce(topic, key=b"acme:x", value=b"\x00" + unknown.to_bytes(4, "big") + b"\x02garbage")
    assert p.flush(30) == 0
    done = run_job(
        flink_python,
        settings.model_copy(update={"events_topic": topic}),
        "--query",
        "run_status_totals",
    )
    assert done.returncode == 1, (done.stdout, done.stderr[-3000:])
    assert done.stdout == ""  # nothing was counted past it
    stopped = done.stderr[done.stderr.index("flink_job: stopped:") :]
    assert f"Could not find schema with id {unknown} in registry" in stopped
    assert "error code: 40403" in stopped
