"""Fixtures for tests against the real broker and database.

Everything connects through :class:`sessionstream.settings.Settings`, so the same tests run
against the local stack (``make up``) or a user's own Kafka/PostgreSQL named by
``SESSIONSTREAM_KAFKA_BOOTSTRAP`` / ``SESSIONSTREAM_DATABASE_URL``. An unreachable server
fails the run with that hint; it is never a skip.
"""

from __future__ import annotations

import contextlib
import functools
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from sessionstream.settings import Settings
from stack.probe import NotAnswering, NotListening, kafka_answers, postgres_answers
from tests.integration.helpers import wait_until
from tests.integration.procs import MADE, REPO, Proc
from tests.integration.worlds import isolated_world, remove_isolated

TopicFactory = Callable[..., str]
WorldFactory = Callable[..., Settings]


@pytest.fixture(scope="session")
def settings() -> Settings:
    return Settings()


@pytest.fixture(scope="session")
def kafka_bootstrap(settings: Settings) -> str:
    try:
        kafka_answers(settings.kafka_bootstrap, timeout=15.0)
    except (NotListening, NotAnswering) as e:
        pytest.fail(
            f"Kafka at {settings.kafka_bootstrap} does not answer ({e}); "
            "run 'make up' or set SESSIONSTREAM_KAFKA_BOOTSTRAP",
            pytrace=False,
        )
    return settings.kafka_bootstrap


@pytest.fixture(scope="session")
def database_url(settings: Settings) -> str:
    try:
        postgres_answers(settings.database_url, timeout=15.0)
    except (NotListening, NotAnswering) as e:
        pytest.fail(
            f"PostgreSQL does not answer ({e}); run 'make up' or set SESSIONSTREAM_DATABASE_URL",
            pytrace=False,
        )
    return settings.database_url


@pytest.fixture(scope="session")
def kafka_admin(kafka_bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka_bootstrap})


@pytest.fixture
def topic_factory(
    request: pytest.FixtureRequest, kafka_admin: AdminClient
) -> Iterator[TopicFactory]:
    """Create uniquely named topics (reruns never collide); delete them after the test."""
    created: list[str] = []
    base = re.sub(r"[^a-zA-Z0-9._-]", "-", request.node.name)[:40]

    def create(partitions: int = 1, config: dict[str, str] | None = None) -> str:
        name = f"it-{base}-{uuid.uuid4().hex[:10]}"
        new = NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})
        kafka_admin.create_topics([new])[name].result(timeout=30)
        created.append(name)

        def has_leaders() -> bool:
            topic = kafka_admin.list_topics(topic=name, timeout=5).topics.get(name)
            return (
                topic is not None
                and topic.error is None
                and len(topic.partitions) == partitions
                and all(p.leader >= 0 for p in topic.partitions.values())
            )

        wait_until(has_leaders, timeout=30, what=f"topic {name} to have leaders")
        return name

    yield create
    if created:
        for future in kafka_admin.delete_topics(created).values():
            future.result(timeout=30)


@pytest.fixture
def pg_conn(database_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(database_url, connect_timeout=10) as conn:
        yield conn


@pytest.fixture(scope="session", autouse=True)
def _remove_isolated_worlds() -> Iterator[None]:
    """Isolated topics and schemas live for the test session only."""
    yield
    remove_isolated()


#: when the current test started (local time, as the broker's log writes it)
_STARTED: list[str] = [""]
_BROKER_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+\] (WARN|ERROR|INFO)")


@pytest.fixture(autouse=True)
def _forget_procs() -> None:
    MADE.clear()
    _STARTED[0] = time.strftime("%Y-%m-%d %H:%M:%S")


@functools.cache
def _broker_log() -> Path | None:
    """The default profile's broker log (`stack.sh where`); None for a user's own Kafka."""
    out = subprocess.run(
        ["bash", str(REPO / "stack/stack.sh"), "where"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout
    node = re.search(r"^KAFKA_NODE_1_DIR='([^']+)'", out, re.M)
    log = Path(node.group(1)) / "logs" / "server.log" if node else None
    return log if log is not None and log.exists() else None


def broker_view(since: str, lines: int = 25) -> str:
    """The broker's warnings, errors and coordinator lines since `since`: what a client's
    timeout cannot say (a coordinator still loading, a group never joined)."""
    log = _broker_log()
    if log is None:
        return ""
    keep = []
    with log.open(errors="replace") as f:
        for line in f:
            m = _BROKER_LINE.match(line)
            if not m or m.group(1) < since:
                continue
            if m.group(2) != "INFO" or "oordinator" in line:
                keep.append(line.rstrip()[:300])
    return "\n".join(keep[-lines:])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test's report ends with the tail of every process log it made and the
    broker's own view of that time: a CI run keeps only its output, and a timeout says
    nothing of why the process was late."""
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call" and rep.failed:
        for p in MADE:
            rep.sections.append((f"log of {' '.join(p.args)} ({p.log})", p.tail()))
        with contextlib.suppress(Exception):  # a diagnosis must not hide the failure
            view = broker_view(_STARTED[0])
            if view:
                rep.sections.append(("broker log: warnings, errors, coordinators", view))


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """Processes a test starts (processor, sink, workers); each is stopped at teardown."""
    started: list[Proc] = []
    yield started
    for p in started:
        p.stop()


@pytest.fixture
def worlds(settings: Settings, kafka_bootstrap: str, database_url: str) -> Iterator[WorldFactory]:
    """Isolated worlds for this test: `worlds(tag, *, base=settings, partitions=4,
    migrated=False)` is the settings of an `isolated_world` that lasts until the test's end
    (its schema dropped then; its topics and groups at the session's end)."""
    with contextlib.ExitStack() as stack:

        def make(
            tag: str, *, base: Settings | None = None, partitions: int = 4, migrated: bool = False
        ) -> Settings:
            world = isolated_world(base or settings, tag, partitions=partitions, migrated=migrated)
            return stack.enter_context(world)

        yield make


@pytest.fixture
def iso(request: pytest.FixtureRequest, worlds: WorldFactory) -> Settings:
    """A world of the test's own, named after it (`worlds`). A module that needs more (a
    name of its own, migrations, a cleanup) defines its own `iso` over `worlds`."""
    return worlds(request.node.name[:20].replace("_", "-"))
