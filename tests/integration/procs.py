"""Real sessionstream processes for integration tests: isolated topics, start, kill -9, wait."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from sessionstream.adapters.kafka import read_topic
from sessionstream.apps._procs import Service
from sessionstream.settings import Settings
from stack.worlds import TOPIC_FIELDS
from tests.integration.helpers import wait_until

REPO = Path(__file__).resolve().parents[2]


def topic_names(prefix: str) -> dict[str, str]:
    """Every topic setting renamed `{prefix}.{kind}` (e.g. `it.bad.commands`)."""
    return {f: f"{prefix}.{f.removesuffix('_topic').replace('_', '-')}" for f in TOPIC_FIELDS}


#: every Proc made during the current test, so a failed test's report carries the tails of
#: their logs (conftest clears it before each test and reads it when one fails)
MADE: list[Proc] = []


class Proc(Service):
    """One `sessionstream ...` subprocess with its log in a temp file."""

    def __init__(self, settings: Settings, *args: str) -> None:
        super().__init__(
            args[0] if args else "sessionstream", settings, list(args), Path(tempfile.gettempdir())
        )
        self.log = Path(tempfile.mkstemp(prefix="ss-proc-", suffix=".log")[1])
        self.cwd = REPO
        MADE.append(self)

    def tail(self, lines: int = 25, width: int = 300) -> str:
        """The last `lines` lines of the log, each cut at `width` characters."""
        return "\n".join(line[:width] for line in self.log_text().splitlines()[-lines:])

    def start(self) -> Proc:
        super().start()
        return self

    def log_text(self) -> str:
        return self.text()

    def wait_log(self, needle: str, timeout: float = 60.0, after: int = 0) -> None:
        def found() -> bool:
            self.assert_alive()
            return needle in self.log_text()[after:]

        wait_until(found, timeout=timeout, what=f"{needle!r} in {self.log}")

    def assert_alive(self) -> None:
        assert self.popen is not None
        code = self.popen.poll()
        if code is not None:
            raise AssertionError(f"{self.args} exited with {code}:\n{self.log_text()[-3000:]}")


def processor(settings: Settings, instance: str = "p0") -> Proc:
    """Start a processor and wait until it owns partitions."""
    p = Proc(settings, "processor", "--instance", instance).start()
    return p


def committed_offsets(settings: Settings, topic: str | None = None) -> dict[int, int]:
    """The processor group's committed offset per partition of `topic` (default: the
    commands topic; -1: none)."""
    c = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": settings.processor_group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        topic = topic or settings.commands_topic
        parts = [TopicPartition(topic, p) for p in range(settings.partitions)]
        return {tp.partition: tp.offset for tp in c.committed(parts, timeout=10)}
    finally:
        c.close()


def wait_processed(
    settings: Settings, timeout: float = 120.0, procs: list[Proc] | None = None
) -> None:
    """Until the processors committed past every command in the three input topics
    (producers', workers' and timers)."""
    inputs = (settings.commands_topic, settings.worker_commands_topic, settings.timers_topic)

    def done() -> bool:
        for p in procs or []:
            p.assert_alive()
        for topic in inputs:
            last: dict[int, int] = {}
            for r in read_topic(settings, topic):
                last[r.partition] = max(last.get(r.partition, -1), r.offset)
            committed = committed_offsets(settings, topic)
            if not all(committed.get(p, -1) > off for p, off in last.items()):
                return False
        return True

    wait_until(done, timeout=timeout, interval=0.5, what="processor to consume every command")
    wait_events_settled(settings, timeout=timeout)


def wait_events_settled(settings: Settings, timeout: float = 60.0) -> None:
    """Until no transaction is open on the events topic (LSO == high watermark everywhere).

    A committed offset can become visible before the commit marker reaches the events
    partition (markers are written one partition at a time, later still after a broker
    restart), and a killed processor's open transaction holds readers back until it is
    aborted: only when every partition has settled does a read_committed reader see all.
    """
    base = {"bootstrap.servers": settings.kafka_bootstrap, "group.id": f"settle-{uuid.uuid4()}"}
    committed = Consumer({**base, "isolation.level": "read_committed"})
    uncommitted = Consumer({**base, "isolation.level": "read_uncommitted"})
    try:
        parts = [TopicPartition(settings.events_topic, p) for p in range(settings.partitions)]

        def settled() -> bool:
            return all(
                committed.get_watermark_offsets(tp, timeout=10, cached=False)[1]
                == uncommitted.get_watermark_offsets(tp, timeout=10, cached=False)[1]
                for tp in parts
            )

        wait_until(settled, timeout=timeout, interval=0.2, what="open transactions to end")
    finally:
        committed.close()
        uncommitted.close()


def sink(settings: Settings, *args: str) -> Proc:
    """Start `sessionstream sink` on the test's topics and schema."""
    return Proc(settings, "sink", *args).start()


def wait_sink_caught_up(
    settings: Settings, timeout: float = 120.0, procs: list[Proc] | None = None
) -> None:
    """Until `sink_offsets` is past the last event of every events partition."""
    wait_events_settled(settings, timeout=timeout)
    import psycopg

    last: dict[int, int] = {}
    stored: dict[int, int] = {}

    def done() -> bool:
        for p in procs or []:
            p.assert_alive()
        last.clear()
        for r in read_topic(settings, settings.events_topic):
            last[r.partition] = max(last.get(r.partition, -1), r.offset)
        try:
            with psycopg.connect(
                settings.database_url, options=f"-c search_path={settings.database_schema}"
            ) as conn:
                rows = conn.execute(
                    "select partition, next_offset from sink_offsets where topic = %s",
                    (settings.events_topic,),
                ).fetchall()
        except psycopg.Error:
            return False  # schema not migrated yet, or the database restarting
        stored.clear()
        stored.update({int(p): int(o) for p, o in rows})
        return all(stored.get(p, -1) > off for p, off in last.items())

    try:
        wait_until(done, timeout=timeout, interval=0.5, what="sink to write every event")
    except AssertionError as e:
        # what the sink stored against the last committed event, and what it said
        logs = [p.log_text()[-3000:] for p in procs or [] if "sink" in p.args[:2]]
        raise AssertionError(
            f"{e}: sink_offsets next {stored}, last committed event per partition {last}; "
            "sink log:\n" + "\n".join(logs)
        ) from None
