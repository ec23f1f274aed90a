"""Fault suite: the whole pipeline under kill -9, a broker restart, a PostgreSQL restart;
and a table-driven sweep of bad input against a running processor.

Each pipeline test runs processor + sink + two reference-agent workers (2 s leases) under a
paced load of numbered commands while a verifier thread re-checks the committed log, then
asserts the contract in `faults.assert_consistent`. Bounded for CI; `make soak` runs the
same tests with `SESSIONSTREAM_SOAK=1` (10x load and rounds).
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from sessionstream.settings import Settings
from sinks.migrate import migrate
from tests.integration.faults import (
    Load,
    Pipeline,
    Verifier,
    assert_consistent,
    restart_server,
    scaled,
)
from tests.integration.helpers import wait_until
from tests.integration.procs import isolated_settings

pytestmark = pytest.mark.integration


@pytest.fixture
def iso(
    request: pytest.FixtureRequest, settings: Settings, kafka_bootstrap: str, database_url: str
) -> Iterator[Settings]:
    s = isolated_settings(settings, "f-" + request.node.name[5:18].replace("_", "-"))
    s = s.model_copy(update={"worker_group": f"{s.processor_group}-workers"})
    migrate(database_url)  # the workers' action executor writes to the default schema
    yield s
    with psycopg.connect(s.database_url, autocommit=True) as conn:
        conn.execute(f'drop schema if exists "{s.database_schema}" cascade')


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
        load.join(330)
    counts = assert_consistent(iso, pipe, load, verifier)
    print("fault loop:", counts)
    assert "database unavailable" in "".join(
        p.log_text() for p in pipe.all if p.args[0] == "sink"
    ), "the sink never saw the PostgreSQL restart"


def test_the_pipeline_rides_out_a_broker_restart(iso: Settings, pipe: Pipeline) -> None:
    """`stack.sh restart-kafka` under load: every process stays up and the contract holds."""
    _local_stack(iso)
    n = scaled(600)
    load, verifier = _start(iso, pipe, n, rate=30.0)
    try:
        _at_progress(pipe, load, verifier, 0.3)
        restart_server("kafka")
        pipe.assert_alive()
        _at_progress(pipe, load, verifier, 0.6)
    finally:
        load.join(330)
    counts = assert_consistent(iso, pipe, load, verifier)
    print("broker restart:", counts)
