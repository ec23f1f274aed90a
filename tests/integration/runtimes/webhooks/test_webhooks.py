"""Webhooks on the real broker and database, to receivers on 127.0.0.1 that answer as a
test scripts them: late, failing, down, and a deliverer killed or stopped under them.

What the issue asks, whatever the code does: every event delivered, in order per session,
none twice to a receiver that answered 2xx (but after a kill -9, which may send again what
was not committed); signed so the example receiver verifies it; dead letters after the
tries run out, sent again by `webhooks redeliver`; loopback refused unless configured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from sessionstream.adapters.kafka import read_topic
from sessionstream.adapters.registry import reader_codec
from sessionstream.apps._procs import settings_env
from sessionstream.apps.gateway.keys import create_key
from sessionstream.client import SessionClient
from sessionstream.schemas.codec import Codec
from sessionstream.settings import Settings
from tests.integration.conftest import WorldFactory
from tests.integration.helpers import wait_until
from tests.integration.procs import Proc, processor
from tests.integration.webhook_world import (
    Delivery,
    Receiver,
    dead_letters,
    first_seen_order,
    free_port,
    keys_by_session,
    receiving,
    run_events,
    subscribe,
    webhook_settings,
    write_events,
)
from tests.webhook_example import example_receiver

pytestmark = pytest.mark.integration

#: how long the receiver stays down (`make soak`: the issue's minute)
DOWN_S = 60.0 if os.environ.get("SESSIONSTREAM_SOAK") else 8.0


@pytest.fixture
def hooks(request: pytest.FixtureRequest, worlds: WorldFactory) -> Settings:
    """An isolated world (2 partitions, migrated) with webhooks set for tests."""
    return webhook_settings(
        worlds(request.node.name[5:21].replace("_", "-"), partitions=2, migrated=True)
    )


def deliverer(s: Settings, *args: str) -> Proc:
    p = Proc(s, "webhooks", "run", *args).start()
    p.wait_log("webhooks: assigned", timeout=30)
    return p


def interleaved(*sessions: list[Any]) -> list[Any]:
    """The sessions' events, one of each in turn (as concurrent sessions write them)."""
    out = []
    for i in range(max(len(s) for s in sessions)):
        out += [s[i] for s in sessions if i < len(s)]
    return out


def wait_accepted(r: Receiver, n: int, timeout: float = 30) -> None:
    wait_until(
        lambda: len(set(r.accepted_ids())) >= n,
        timeout=timeout,
        what=lambda: f"{n} deliveries answered 2xx (have {len(set(r.accepted_ids()))})",
    )


def assert_once_in_order(r: Receiver, events: list[Any]) -> None:
    """Each event accepted exactly once, each session's in log order."""
    ids = r.accepted_ids()
    assert sorted(ids) == sorted(e.key for e in events), "missing, foreign or repeated"
    assert first_seen_order(ids) == keys_by_session(events)


def test_a_few_runs_reach_their_subscribers_in_order_signed_and_no_history(
    hooks: Settings, procs: list[Proc]
) -> None:
    write_events(hooks, run_events("acme", "before", 1, 3))  # before any subscription
    with receiving() as every, receiving() as finished:
        secret, _sub = subscribe(hooks, "acme", every.url)
        _, _fin = subscribe(hooks, "acme", finished.url, ["run.finished"])
        procs.append(deliverer(hooks))
        sessions = [run_events("acme", s, 2, 4) for s in ("s1", "s2", "s3")]
        events = interleaved(*sessions)
        write_events(hooks, events + run_events("globex", "s1", 1, 3))
        wait_accepted(every, len(events))
        wait_accepted(finished, 6)
        time.sleep(0.5)  # anything sent twice would have come by now
        assert_once_in_order(every, events)
        assert sorted(finished.accepted_ids()) == sorted(
            e.key for e in events if e.type == "run.finished"
        )
        verify = example_receiver().verify
        by_key = {e.key: e for e in events}
        for d in every.accepted():
            assert verify(secret, d.headers, d.body, now=d.timestamp) == (d.msg_id, d.timestamp)
            assert json.loads(d.body) == Codec.event_to_json(by_key[d.msg_id])
            assert d.headers["content-type"] == "application/json"
            assert d.headers["user-agent"].startswith("sessionstream-webhooks/")
            assert abs(d.timestamp - time.time()) < 60


def test_what_the_processor_writes_is_what_a_receiver_gets(
    hooks: Settings, procs: list[Proc]
) -> None:
    with receiving() as r:
        subscribe(hooks, "acme", r.url, ["run.*"])
        procs += [processor(hooks), deliverer(hooks)]
        with SessionClient("acme", hooks) as c:
            for s in ("s1", "s2"):
                sid = c.session_id(s)
                assert c.wait(c.prompt(sid, "find flights"), 60).status == "accepted"
                assert c.wait(c.abort(sid), 30).status == "accepted"
        codec = reader_codec(hooks)
        logged = [
            codec.decode_event(rec.value or b"") for rec in read_topic(hooks, hooks.events_topic)
        ]
        runs = [e for e in logged if e.type.startswith("run.")]
        assert {e.type for e in runs} >= {"run.started", "run.cancel_requested", "run.finished"}
        wait_accepted(r, len(runs))
        time.sleep(0.3)
        assert_once_in_order(r, runs)
        by_id = {d.msg_id: d for d in r.accepted()}
        for e in runs:
            assert json.loads(by_id[e.key].body) == Codec.event_to_json(e)


def test_a_receiver_answering_500_then_200_and_one_timing_out(
    hooks: Settings, procs: list[Proc]
) -> None:
    def flaky(_d: Delivery, before: int) -> int:
        return 500 if before == 0 else 200

    def slow(d: Delivery, before: int) -> int:
        if before == 0 and d.event["seq"] == 2:  # the deliverer waits 2 s
            d.late = True
            time.sleep(3)
        return 200

    with receiving(flaky) as failing, receiving(slow) as late:
        subscribe(hooks, "acme", failing.url)
        subscribe(hooks, "acme", late.url)
        procs.append(deliverer(hooks))
        events = interleaved(*(run_events("acme", s, 1, 4) for s in ("a", "b", "c")))
        write_events(hooks, events)
        wait_accepted(failing, len(events))
        wait_accepted(late, len(events))
        time.sleep(0.5)
        assert_once_in_order(failing, events)
        assert_once_in_order(late, events)
        # each was asked twice (500, then 200); the slow one's second events twice too
        assert sorted(d.msg_id for d in failing.got) == sorted(2 * [e.key for e in events])
        assert sum(1 for d in late.got if d.late) == 3


def test_a_receiver_down_for_a_while_gets_everything_in_order_once(
    hooks: Settings, procs: list[Proc]
) -> None:
    r = Receiver()
    subscribe(hooks, "acme", r.url)
    procs.append(deliverer(hooks))
    events = interleaved(*(run_events("acme", s, 2, 3) for s in ("a", "b", "c", "d")))
    write_events(hooks, events)
    time.sleep(DOWN_S)  # nothing listens: connections refused, retried
    r.start()
    try:
        wait_accepted(r, len(events), timeout=30)
        time.sleep(0.5)
        assert_once_in_order(r, events)
    finally:
        r.stop()


def test_kill9_of_the_deliverer_mid_batch_loses_nothing(hooks: Settings, procs: list[Proc]) -> None:
    def busy(_d: Delivery, _before: int) -> int:
        time.sleep(0.02)  # 4 at once: ~200 a second, so the kill comes after a commit
        return 200

    with receiving(busy) as r:
        subscribe(hooks, "acme", r.url)
        first = deliverer(hooks)
        procs.append(first)
        events = interleaved(*(run_events("acme", f"s{i}", 6, 5) for i in range(20)))
        write_events(hooks, events)
        wait_accepted(r, 300)
        first.kill9()
        killed_at = len(set(r.accepted_ids()))
        assert killed_at < len(events), "the kill came too late to be mid-batch"
        procs.append(deliverer(hooks))
        wait_accepted(r, len(events), timeout=60)
        ids = r.accepted_ids()
        assert set(ids) == {e.key for e in events}
        assert first_seen_order(ids) == keys_by_session(events)
        # what was sent twice is what the last commit (a second old at most) did not cover
        again = len(ids) - len(events)
        print(f"kill -9 after {killed_at} of {len(events)}: {again} sent again")
        assert again < killed_at


def test_a_clean_stop_sends_nothing_twice_to_a_receiver_that_answered_2xx(
    worlds: WorldFactory, procs: list[Proc]
) -> None:
    # one partition: the stuck session's first event holds the committed offset below
    # everything the others had delivered
    hooks = webhook_settings(worlds("wh-clean-stop", partitions=1, migrated=True))
    stuck = {"on": True}

    def script(d: Delivery, _before: int) -> int:
        return 503 if stuck["on"] and d.event["sessionId"] == "acme:stuck" else 200

    with receiving(script) as r:
        subscribe(hooks, "acme", r.url)
        p = deliverer(hooks)
        procs.append(p)
        held = run_events("acme", "stuck", 1, 3)
        others = [run_events("acme", s, 2, 3) for s in ("a", "b", "c")]
        write_events(hooks, interleaved(held, *others))
        wait_accepted(r, 18)
        assert p.stop() == 0
        assert "released [0] at {0: " in p.log_text()
        procs.append(deliverer(hooks))
        time.sleep(1.5)  # the restarted one reads from the committed offset again
        stuck["on"] = False
        wait_accepted(r, 21)
        time.sleep(0.5)
        others_ids = [i for i in r.accepted_ids() if not i.startswith("acme:stuck/")]
        assert len(others_ids) == len(set(others_ids)) == 18, "sent again after a 2xx"
        assert first_seen_order(r.accepted_ids())["acme:stuck"] == [e.key for e in held]


def test_two_instances_share_the_partitions(worlds: WorldFactory, procs: list[Proc]) -> None:
    hooks = webhook_settings(worlds("wh-two", partitions=4, migrated=True))
    with receiving() as r:
        subscribe(hooks, "acme", r.url)
        one = deliverer(hooks)
        two = deliverer(hooks)
        procs += [one, two]
        one.wait_log("webhooks: released", timeout=30)  # gave some to the second
        events = interleaved(*(run_events("acme", f"s{i}", 2, 3) for i in range(16)))
        write_events(hooks, events)
        wait_accepted(r, len(events))
        time.sleep(0.5)
        assert_once_in_order(r, events)
        # one leaves: the other takes its partitions and goes on
        mark = len(two.log_text())
        assert one.stop() == 0
        two.wait_log("webhooks: assigned", timeout=30, after=mark)
        more = interleaved(*(run_events("acme", f"t{i}", 1, 3) for i in range(16)))
        write_events(hooks, more)
        wait_accepted(r, len(events) + len(more))
        time.sleep(0.5)
        assert_once_in_order(r, events + more)


def _cli(s: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    exe = str(Path(sys.executable).with_name("sessionstream"))
    return subprocess.run(
        [exe, "webhooks", *args],
        env=settings_env(s),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_dead_letter_after_the_tries_then_redelivered_from_its_offset_and_by_time(
    hooks: Settings, procs: list[Proc]
) -> None:
    hooks = hooks.model_copy(update={"webhooks_max_attempts": 3, "webhooks_backoff_s": 0.1})
    down = {"on": True}

    def script(_d: Delivery, _before: int) -> int:
        return 503 if down["on"] else 200

    with receiving(script) as r:
        _, sub = subscribe(hooks, "acme", r.url)
        procs.append(deliverer(hooks))
        since = time.time()
        events = run_events("acme", "s1", 1, 3)
        write_events(hooks, events)
        wait_until(lambda: len(dead_letters(hooks)) == 3, timeout=30, what="three dead letters")
        rows = dead_letters(hooks)
        assert [row[1] for row in rows] == [e.key for e in events]
        assert {(row[4], row[5]) for row in rows} == {(3, 503)}
        assert all("HTTP 503" in row[6] for row in rows)
        assert len(r.got) == 9 and not r.accepted()
        listed = _cli(hooks, "dead-letters", sub.subscription_id, "--json")
        assert listed.returncode == 0, listed.stderr
        first = json.loads(listed.stdout)[0]
        down["on"] = False
        again = _cli(
            hooks,
            "redeliver",
            "--subscription",
            sub.subscription_id,
            "--from-offset",
            f"{first['partition']}:{first['offset']}",
        )
        assert again.returncode == 0, again.stderr
        assert "delivered: 3, dead letters: 0 (earlier dead letters cleared: 3)" in again.stdout
        assert r.accepted_ids() == [e.key for e in events]
        assert dead_letters(hooks) == []
        by_time = _cli(
            hooks,
            "redeliver",
            "--subscription",
            sub.subscription_id,
            "--since",
            str(int(since * 1000)),
        )
        assert by_time.returncode == 0, by_time.stderr
        assert "for this webhook: 3, delivered: 3," in by_time.stdout
        assert r.accepted_ids() == 2 * [e.key for e in events]  # the receiver dedupes


def test_loopback_and_other_inner_addresses_are_refused_unless_allowed(
    hooks: Settings, procs: list[Proc]
) -> None:
    closed = hooks.model_copy(update={"webhooks_allow_networks": ""})
    with receiving() as r:
        # the classifier's whole table is a unit test (test_guard.py); here, end to end
        for url, why in [
            (r.url, "127.0.0.1 is loopback"),
            (f"http://localhost:{r.port}/", "is loopback"),
            ("http://169.254.169.254/latest/meta-data/", "is link-local"),
            ("file:///etc/passwd", "scheme 'file'"),
        ]:
            made = _cli(closed, "create", "--tenant", "acme", "--url", url)
            assert made.returncode == 1 and why in made.stderr, (url, made.stderr)
        ok = _cli(hooks, "create", "--tenant", "acme", "--url", r.url, "--json")
        assert ok.returncode == 0, ok.stderr
        sub = json.loads(ok.stdout)
        assert sub["secret"].startswith("whsec_")
        # made while it was allowed; the deliverer without the setting refuses to connect
        procs.append(deliverer(closed))
        write_events(hooks, run_events("acme", "s1", 1, 2))
        wait_until(lambda: len(dead_letters(hooks)) == 2, timeout=30, what="two dead letters")
        assert all("refused: 127.0.0.1 is loopback" in row[6] for row in dead_letters(hooks))
        assert [row[4] for row in dead_letters(hooks)] == [1, 1]  # not retried
        assert r.got == []


def test_the_gateway_routes_create_list_and_delete_a_tenants_webhooks(
    hooks: Settings, procs: list[Proc]
) -> None:
    s = hooks.model_copy(update={"gateway_port": free_port()})
    with psycopg.connect(s.database_url, options=f"-c search_path={s.database_schema}") as conn:
        acme, _ = create_key(conn, "acme")
        globex, _ = create_key(conn, "globex")
    gateway = Proc(s, "gateway").start()
    procs.append(gateway)
    gateway.wait_log("Uvicorn running on", 60)
    base = f"http://127.0.0.1:{s.gateway_port}/v1/webhooks"

    def call(key: str, method: str, url: str = base, **kw: Any) -> httpx.Response:
        return httpx.request(
            method, url, headers={"Authorization": f"Bearer {key}"}, timeout=30, **kw
        )

    with receiving() as r:
        made = call(acme, "POST", json={"url": r.url, "eventTypes": ["run.*"], "description": "ci"})
        assert made.status_code == 201, made.text
        body = made.json()
        assert body["secret"].startswith("whsec_") and body["eventTypes"] == ["run.*"]
        hid = body["id"]
        listed = call(acme, "GET").json()["webhooks"]
        assert [w["id"] for w in listed] == [hid] and "secret" not in listed[0]
        assert listed[0]["secretPrefix"] == body["secret"][:10]
        assert call(globex, "GET").json() == {"webhooks": []}
        assert call(globex, "GET", f"{base}/{hid}").status_code == 404
        assert call(globex, "DELETE", f"{base}/{hid}").status_code == 404
        refused = call(acme, "POST", json={"url": "http://169.254.169.254/"})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "url_refused"
        unknown = call(acme, "POST", json={"url": r.url, "eventTypes": ["run.finishd"]})
        assert unknown.status_code == 400 and "run.finishd" in unknown.text
        extra = call(acme, "POST", json={"url": r.url, "secret": "mine"})
        assert extra.status_code == 400
        assert call(acme, "GET", f"{base}/{hid}/dead-letters").json()["deadLetters"] == []
        assert call(acme, "DELETE", f"{base}/{hid}").status_code == 204
        assert call(acme, "GET").json() == {"webhooks": []}
        assert call(acme, "DELETE", f"{base}/{hid}").status_code == 404
