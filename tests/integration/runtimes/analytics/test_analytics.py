"""`sessionstream analytics` against the real broker: exact counts through duplicates and kill -9.

Events of a generated history (tests/analytics_world.py, counted there by hand) are
produced in transactions to an isolated events topic, with an aborted transaction of
ghost runs in between (read_committed must never see them). The app runs as a real
subprocess; the test reads its JSON endpoints until they report the expected numbers,
re-produces byte-identical duplicates (numbers unchanged), then kills the app with SIGKILL
twice while a paced producer writes the rest, restarts it each time, and requires the
exact final numbers again.
"""

from __future__ import annotations

import contextlib
import json
import socket
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from sessionstream.adapters.registry import reader_codec
from sessionstream.core.partitioning import partition_for
from sessionstream.schemas.events import Event, RunStarted
from sessionstream.settings import Settings, get_settings
from tests.analytics_world import COUNTED_TYPES, Expected, make_world
from tests.integration.conftest import WorldFactory
from tests.integration.helpers import wait_until
from tests.integration.procs import Proc

pytestmark = pytest.mark.integration

ALL_TIME = "since=0&until=99999999999999"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Events:
    """A transactional producer of encoded events; remembers the last offset per partition."""

    def __init__(self, s: Settings) -> None:
        self.s = s
        self.codec = reader_codec(get_settings())
        self.last: dict[int, int] = {}
        self.p = Producer(
            {
                "bootstrap.servers": s.kafka_bootstrap,
                "transactional.id": f"it-analytics-{uuid.uuid4()}",
                "linger.ms": 5,
            }
        )
        self.p.init_transactions(30)

    def _delivered(self, err: Any, msg: Any) -> None:
        assert err is None, err
        self.last[msg.partition()] = max(self.last.get(msg.partition(), -1), msg.offset())

    def send(self, events: list[Event], *, abort: bool = False) -> None:
        self.p.begin_transaction()
        for e in events:
            self.p.produce(
                self.s.events_topic,
                key=e.key.encode(),
                value=self.codec.encode_event(e),
                partition=partition_for(e.session_id.encode(), self.s.partitions),
                on_delivery=None if abort else self._delivered,
            )
        if abort:
            self.p.flush(30)
            self.p.abort_transaction(30)
        else:
            self.p.commit_transaction(30)


class Analytics:
    """The `sessionstream analytics` subprocess and its endpoints."""

    def __init__(self, s: Settings) -> None:
        self.s = s
        self.proc: Proc | None = None

    def start(self) -> Analytics:
        self.proc = Proc(self.s, "analytics").start()
        return self

    def get(self, path: str) -> Any:
        url = f"http://127.0.0.1:{self.s.analytics_port}{path}"
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())

    def try_get(self, path: str) -> Any:
        assert self.proc is not None
        self.proc.assert_alive()
        try:
            return self.get(path)
        except OSError:
            return None  # not listening yet

    def folded(self) -> dict[int, int]:
        """Next offset to fold per partition (empty before it is up)."""
        got = self.try_get("/stats/progress")
        return {int(p): c["nextOffset"] for p, c in (got or {}).get("partitions", {}).items()}

    def wait_folded(self, last: dict[int, int], timeout: float = 120) -> None:
        def done() -> bool:
            nxt = self.folded()
            return all(nxt.get(p, 0) > off for p, off in last.items())

        wait_until(done, timeout=timeout, interval=0.2, what="analytics to fold every record")

    def snapshot(self) -> dict[str, Any]:
        return {
            "runs": self.get(f"/stats/runs?{ALL_TIME}"),
            "rejections": self.get(f"/stats/rejections?{ALL_TIME}"),
            "latency": self.get(f"/stats/cancel-latency?{ALL_TIME}"),
            "active": self.get("/stats/active"),
        }

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill9()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


def _nearest_rank(values: list[int], p: int) -> int | None:
    if not values:
        return None
    v = sorted(values)
    return v[max(1, -(-p * len(v) // 100)) - 1]


def expected_json(exp: Expected) -> dict[str, Any]:
    """`exp` in the endpoints' shapes (windows left out)."""
    fields = ("started", "cancelled", "completed", "failed", "timedOut")
    totals: dict[str, Counter[str]] = {}
    for (_, tenant), c in exp.runs.items():
        totals.setdefault(tenant, Counter()).update(c)
    rej_totals: dict[str, Counter[str]] = {}
    for (_, tenant, reason), n in exp.rejections.items():
        rej_totals.setdefault(tenant, Counter())[reason] += n
    lat = exp.latencies
    return {
        "runs": {
            "minutes": [
                {"minute": m, "tenantId": t, **{f: c[f] for f in fields}}
                for (m, t), c in sorted(exp.runs.items())
            ],
            "totals": {t: {f: c[f] for f in fields} for t, c in sorted(totals.items())},
        },
        "rejections": {
            "minutes": [
                {"minute": m, "tenantId": t, "reason": r, "count": n}
                for (m, t, r), n in sorted(exp.rejections.items())
            ],
            "totals": {t: dict(sorted(c.items())) for t, c in sorted(rej_totals.items())},
        },
        "latency": {
            "count": len(lat),
            "p50": _nearest_rank(lat, 50),
            "p90": _nearest_rank(lat, 90),
            "p99": _nearest_rank(lat, 99),
            "max": max(lat) if lat else None,
        },
        "active": {"total": sum(exp.active.values()), "tenants": dict(sorted(exp.active.items()))},
    }


def observed_json(snap: dict[str, Any]) -> dict[str, Any]:
    return {
        "runs": {k: snap["runs"][k] for k in ("minutes", "totals")},
        "rejections": {k: snap["rejections"][k] for k in ("minutes", "totals")},
        "latency": snap["latency"]["overall"],
        "active": snap["active"],
    }


def merged(a: Expected, b: Expected) -> Expected:
    out = Expected()
    for e in (a, b):
        for key, c in e.runs.items():
            out.runs.setdefault(key, Counter()).update(c)
        out.rejections.update(e.rejections)
        out.latencies.extend(e.latencies)
        out.active.update(e.active)
    return out


def ghost_runs(n: int, ts: int) -> list[Event]:
    """Run starts of tenant `ghost`, only ever produced in an aborted transaction."""
    return [
        Event(
            session_id=f"ghost-{uuid.uuid4().hex[:8]}",
            run_id=str(uuid.uuid4()),
            seq=1,
            type="run.started",
            payload=RunStarted(
                prompt="g", origin="prompt", source_command_id="g", timeout_at=ts + 1
            ),
            command_id="g",
            ts=ts,
            tenant_id="ghost",
        )
        for _ in range(n)
    ]


@pytest.fixture
def iso(worlds: WorldFactory, kafka_bootstrap: str) -> Iterator[Settings]:
    s = worlds("analytics")
    app_id = f"it-analytics-{uuid.uuid4().hex[:8]}"
    state = tempfile.mkdtemp(prefix="ss-analytics-")
    yield s.model_copy(
        update={
            "analytics_app_id": app_id,
            "analytics_port": _free_port(),
            "analytics_state_dir": state,
        }
    )
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    ours = [t for t in admin.list_topics(timeout=10).topics if t.startswith(app_id)]
    for fut in admin.delete_topics(ours, operation_timeout=30).values() if ours else []:
        with contextlib.suppress(Exception):
            fut.result(timeout=60)
    with contextlib.suppress(Exception):
        admin.delete_consumer_groups([app_id])[app_id].result(timeout=30)


def test_counts_are_exact_through_duplicates_and_kill9(iso: Settings) -> None:
    now = int(time.time() * 1000)
    first = make_world(sessions=120, runs_per_session=4, start_ms=now - 40 * 60_000, seed=11)
    rest = make_world(sessions=240, runs_per_session=4, start_ms=now - 20 * 60_000, seed=12)
    events = Events(iso)
    half = len(first.events) // 2
    events.send(first.events[:half])
    events.send(ghost_runs(50, now), abort=True)
    events.send(first.events[half:])

    app = Analytics(iso).start()
    try:
        want = expected_json(first.expected)
        try:
            wait_until(
                lambda: (
                    app.try_get("/stats/active") is not None
                    and observed_json(app.snapshot()) == want
                ),
                timeout=120,
                interval=0.5,
                what="analytics to report the first history's numbers",
            )
        except AssertionError:
            # up but wrong (the diff), or never up (the first line): not a bare timeout
            assert app.try_get("/stats/active") is not None, "analytics never answered"
            assert observed_json(app.snapshot()) == want, app.try_get("/stats/progress")
            raise
        assert "ghost" not in app.snapshot()["runs"]["totals"]

        # byte-identical re-emissions (same keys, same bytes) change nothing
        dups = first.events[::7]
        events.send(dups)
        app.wait_folded(events.last)
        assert observed_json(app.snapshot()) == want
        counted = sum(1 for e in dups if e.type in COUNTED_TYPES)
        assert app.get("/stats/progress")["fold"]["repeats"] == counted

        # kill -9 twice while a paced producer writes the rest
        def produce_rest() -> None:
            for i in range(0, len(rest.events), 40):
                events.send(rest.events[i : i + 40])
                time.sleep(0.05)  # pacing: a stream, not one burst

        producer = threading.Thread(target=produce_rest, daemon=True)
        producer.start()
        for _ in range(2):
            base = sum(app.folded().values())
            wait_until(
                lambda b=base: sum(app.folded().values()) > b + 100,
                timeout=120,
                interval=0.05,
                what="analytics to fold part of the stream",
            )
            app.kill9()
            app.start()
            wait_until(app.folded, timeout=120, interval=0.2, what="analytics to recover")
        producer.join(timeout=300)
        assert not producer.is_alive()
        app.wait_folded(events.last, timeout=180)
        assert observed_json(app.snapshot()) == expected_json(merged(first.expected, rest.expected))
    finally:
        app.stop()


def test_a_changelog_it_cannot_recover_stops_the_app_saying_why(iso: Settings) -> None:
    """A fact in the table's changelog this version cannot read (a newer version's, after
    a rollback). faust runs the recovery callback in a task whose outcome it never reads:
    the error vanished, the app served zeros and counted every event as `unowned`. Now
    the app stops with the reason, for its supervisor to see."""
    from sessionstream.adapters.topics import ensure_topics

    ensure_topics(iso)
    changelog = f"{iso.analytics_app_id}-analytics-changelog"
    admin = AdminClient({"bootstrap.servers": iso.kafka_bootstrap})
    first = Analytics(iso).start()
    try:
        wait_until(
            lambda: (
                changelog in admin.list_topics(timeout=10).topics
                and first.try_get("/stats/progress") is not None
            ),
            timeout=120,
            what="the analytics app up, its changelog made",
        )
    finally:
        first.stop()
    delivered: list[Any] = []
    p = Producer({"bootstrap.servers": iso.kafka_bootstrap})
    p.produce(
        changelog,
        key=b"run:0:r-future",
        value=b'{"t":"from-a-newer-version"}',
        partition=0,
        on_delivery=lambda err, msg: delivered.append(err),
    )
    assert p.flush(30) == 0 and delivered == [None], delivered
    second = Analytics(iso).start()
    assert second.proc is not None
    popen = second.proc.popen
    assert popen is not None
    try:
        try:
            wait_until(lambda: popen.poll() is not None, timeout=120, what="the app to stop")
        except AssertionError as e:
            raise AssertionError(f"{e}; its log:\n{second.proc.tail(40)}") from None
        assert popen.returncode != 0
        assert "the table's changelog cannot be recovered" in second.proc.log_text()
    finally:
        second.stop()
