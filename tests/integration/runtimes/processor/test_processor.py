"""The session processor against the real broker: races, kill -9, scale-out, poison pills."""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from sessionstream.adapters.kafka import TransactionalProducer, read_topic
from sessionstream.adapters.registry import reader_codec
from sessionstream.client import CommandHandle, SessionClient, acknowledged
from sessionstream.core.log_check import state_table
from sessionstream.core.partitioning import partition_for
from sessionstream.runtimes.processor import TransactionalProcessor, failures
from sessionstream.runtimes.processor.batch import Batch
from sessionstream.schemas.commands import Command
from sessionstream.schemas.events import Event
from sessionstream.settings import Settings, get_settings
from tests.integration.helpers import check_log, fold_log, wait_until
from tests.integration.procs import (
    TOPIC_FIELDS,
    Proc,
    committed_offsets,
    processor,
    topic_names,
    wait_processed,
)

pytestmark = pytest.mark.integration


def _assert_log(s: Settings, sent: set[str]) -> None:
    events = read_topic(s, s.events_topic)
    report = check_log(events)
    assert report.ok, report.violations
    missing = sent - set(report.outcomes)
    assert not missing, f"{len(missing)} commands without an outcome, e.g. {sorted(missing)[:3]}"
    table = state_table(read_topic(s, s.state_topic))
    folded = fold_log(events)
    assert table == folded, "state table differs from the fold of the event log"


def test_eight_producers_race_on_one_session(iso: Settings, procs: list[Proc]) -> None:
    procs.append(processor(iso))
    sid = f"race-{uuid.uuid4().hex[:6]}"
    sent: set[str] = set()
    lock = threading.Lock()

    def producer(n: int) -> None:
        rnd = random.Random(n)
        with SessionClient("tenant-a", iso) as c:
            for i in range(130):
                kind = rnd.choice(["prompt", "prompt", "steer", "follow_up", "send", "abort"])
                fields = {"command_id": f"p{n}-{i}"}
                if kind == "prompt":
                    policy = rnd.choice(["reject", "enqueue", "interrupt"])
                    cmd = c.command(
                        sid, "prompt", {"text": f"task {n}/{i}", "policy": policy}, **fields
                    )
                elif kind == "abort":
                    cmd = c.command(sid, "abort", {}, **fields)
                else:
                    cmd = c.command(sid, kind, {"text": f"{kind} {n}/{i}"}, **fields)
                c.submit(cmd, track=False)
                if i % 10 == 0:  # retries: the same command id again
                    c.submit(cmd, track=False)
                with lock:
                    sent.add(cmd.command_id)
            c.flush()

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(sent) == 8 * 130
    wait_processed(iso, procs=procs)
    _assert_log(iso, sent)
    report = check_log(read_topic(iso, iso.events_topic))
    assert report.runs > 1  # the race really started, cancelled and queued runs


def _load(
    s: Settings, sessions: int, commands: int, sent: list[str], stop: threading.Event
) -> None:
    """Numbered commands across many sessions; `sent` grows as the broker acknowledges."""
    rnd = random.Random(7)
    with SessionClient("tenant-a", s) as c:
        for i in range(commands):
            if stop.is_set():
                break
            sid = f"load-{i % sessions}"
            kind = rnd.choice(["prompt", "steer", "follow_up", "abort", "send"])
            payload = {} if kind == "abort" else {"text": f"{kind} #{i}"}
            if kind == "prompt":
                payload["policy"] = rnd.choice(["reject", "enqueue"])
            cmd = c.command(sid, kind, payload, command_id=f"load-{i}")
            c.submit(cmd, track=False)
            sent.append(cmd.command_id)
            if i % 200 == 0:
                c.flush()
        c.flush()


def test_kill9_processor_three_times_under_load(iso: Settings, procs: list[Proc]) -> None:
    p = processor(iso, "crashy")
    procs.append(p)
    sent: list[str] = []
    total = 3000
    stop = threading.Event()
    loader = threading.Thread(target=_load, args=(iso, 60, total, sent, stop))
    loader.start()
    try:
        for round_ in range(3):
            # each kill after at least 20% more of the load was processed
            target = (round_ + 1) * total // 4

            def progressed(target: int = target, p: Proc = p) -> bool:
                p.assert_alive()
                return sum(max(o, 0) for o in committed_offsets(iso).values()) >= target

            wait_until(progressed, timeout=120, interval=0.2, what=f"{target} commands processed")
            p.kill9()
            p = processor(iso, "crashy")  # same instance id: fences the dead one's transaction
            procs.append(p)
    finally:
        loader.join()
    assert len(sent) == total
    wait_processed(iso, procs=[p])
    _assert_log(iso, set(sent))
    # the last restart may find everything processed already (its predecessor got through
    # the load before its kill): it still takes its partitions, restoring them
    wait_until(lambda: "restored partitions" in p.log_text(), timeout=60, what="the last restore")
    # each restart after a kill -9 read its store's changelog tail, not the whole log: the
    # store was never ahead of what had committed (the log above agrees with the state)
    # (a restart can be killed again before it got its partitions: it restored nothing)
    lines = [
        ln
        for restarted in procs[1:]
        for ln in restarted.log_text().splitlines()
        if "restored partitions" in ln
    ]
    assert lines and "restored partitions" in procs[-1].log_text()
    assert all("(8 from a checkpoint, 0 in full)" in ln for ln in lines), lines
    # the CLI settles the process's collector once started (a backlog's CPU, decision 0005)
    assert "garbage collector settled" in procs[-1].log_text(), procs[-1].tail()


def test_a_second_live_processor_with_the_same_instance_id_is_refused(
    iso: Settings, procs: list[Proc]
) -> None:
    """A user starts `--instance twin` twice. The group coordinator fences one member for
    the other, and the transaction coordinator one producer for the other, back and forth:
    one of them must stop with a clear error (exit 2), the other go on alone, and every
    command still get its outcome exactly once."""
    first = processor(iso, "twin")
    procs.append(first)
    first.wait_log("assigned", timeout=60)
    sent: list[str] = []
    stop = threading.Event()
    loader = threading.Thread(target=_load, args=(iso, 40, 1500, sent, stop))
    second = processor(iso, "twin")
    procs.append(second)
    loader.start()  # while the two fence each other
    try:
        wait_until(
            lambda: not first.alive() or not second.alive(),
            timeout=120,
            interval=0.2,
            what="one of two processors with the same instance id to stop",
        )
    finally:
        loader.join()
    gone, alive = (first, second) if not first.alive() else (second, first)
    assert gone.popen is not None and gone.popen.wait(10) == 2
    assert "failed fatally" in gone.log_text(), gone.tail()
    assert alive.alive(), alive.tail()
    wait_processed(iso, procs=[alive])
    # every command has its outcome; no event twice, no gap, one active run a session
    _assert_log(iso, set(sent))


def test_two_processors_then_one_killed(iso: Settings, procs: list[Proc]) -> None:
    a = processor(iso, "a")
    b = processor(iso, "b")
    procs += [a, b]
    sent: list[str] = []
    stop = threading.Event()
    loader = threading.Thread(target=_load, args=(iso, 40, 2000, sent, stop))
    loader.start()
    try:
        wait_until(
            lambda: "assigned" in a.log_text() and "assigned" in b.log_text(),
            timeout=60,
            what="both processors to own partitions",
        )
        wait_until(
            lambda: sum(max(o, 0) for o in committed_offsets(iso).values()) >= 500,
            timeout=120,
            what="a quarter of the load processed",
        )
        a.kill9()
        after = len(b.log_text())
        b.wait_log("assigned", timeout=90, after=after)  # b takes a's partitions over
    finally:
        loader.join()
    wait_processed(iso, procs=[b])
    _assert_log(iso, set(sent))
    assert "assigned [0, 1, 2, 3]" in b.log_text()


def test_poison_pills_go_to_the_dlq_and_the_stream_goes_on(
    iso: Settings, procs: list[Proc]
) -> None:
    procs.append(processor(iso))
    codec = reader_codec(get_settings())
    sid = f"poison-{uuid.uuid4().hex[:6]}"
    part = partition_for(sid.encode(), iso.partitions)
    good = Command(
        command_id="good-1",
        session_id=sid,
        tenant_id="t",
        type="prompt",
        ts=1,
        payload={"text": "hello"},
    )
    avro = codec.encode_command(good)
    pills = {
        "random-bytes": (
            sid.encode(),
            bytes(random.Random(1).getrandbits(8) for _ in range(64)),
            "malformed",
        ),
        "truncated-avro": (sid.encode(), avro[:-5], "malformed"),
        "unknown-fingerprint": (
            sid.encode(),
            b"\xc3\x01" + b"\x11" * 8 + avro[10:],
            "unknown_schema",
        ),
        "json-wrong-types": (
            sid.encode(),
            b'{"commandId": 1, "sessionId": "'
            + sid.encode()
            + b'", "tenantId": "t", "type": "prompt", "ts": "x", "payload": {}}',
            "schema_violation",
        ),
        "unknown-type": (
            sid.encode(),
            b'{"commandId": "u1", "sessionId": "'
            + sid.encode()
            + b'", "tenantId": "t", "type": "launch.missiles", "ts": 1, "payload": {}}',
            "unknown_type",
        ),
        "oversized": (sid.encode(), b"{" + b" " * (950 * 1024) + b"}", "oversized"),
        "key-mismatch": (b"another-session", avro, "key_mismatch"),
    }
    prod = Producer(
        {"bootstrap.servers": iso.kafka_bootstrap, "message.max.bytes": 2 * 1024 * 1024}
    )
    for name, (key, value, _reason) in pills.items():
        prod.produce(
            iso.commands_topic,
            key=key,
            value=value,
            partition=part,
            headers=[("pill", name.encode())],
        )
    # a command on a partition its key does not hash to (a producer without murmur2): it is
    # forwarded to the session's partition and decided there, never dead-lettered
    wrong = (part + 1) % iso.partitions
    misplaced = good.model_copy(update={"command_id": "misplaced-1", "type": "steer"})
    misplaced = Command.model_validate({**misplaced.model_dump(), "payload": {"text": "s"}})
    prod.produce(
        iso.commands_topic,
        key=sid.encode(),
        value=codec.encode_command(misplaced),
        partition=wrong,
        headers=[("pill", b"wrong-partition")],
    )
    # the workers' topic alike: a misplaced worker command is forwarded on that topic (and
    # decided as a worker's), undecodable bytes there are dead letters naming that topic
    stray = Command(
        command_id="misplaced-w",
        session_id=sid,
        tenant_id="t",
        type="lease.acquire",
        ts=1,
        run_id="no-such-run",
        worker_id="w1",
        payload={"lease_ms": 1000},
    )
    prod.produce(
        iso.worker_commands_topic,
        key=sid.encode(),
        value=codec.encode_command(stray),
        partition=wrong,
        headers=[("pill", b"wrong-partition-w")],
    )
    prod.produce(
        iso.worker_commands_topic,
        key=sid.encode(),
        value=b"{not json",
        partition=part,
        headers=[("pill", b"malformed-w")],
    )
    prod.flush(30)
    with SessionClient("t", iso) as c:
        outcome = c.wait(c.submit(good), timeout=60)
        assert outcome.status == "accepted" and outcome.run_id
        # through the SDK too: an oversized record is reported as a dead letter, not lost
        huge = c.wait(c.prompt(sid, "x" * (950 * 1024)), timeout=60)
        assert (huge.status, huge.reason) == ("dead_letter", "oversized")
        again = c.wait(c.submit(good), timeout=60)
        assert again.status == "duplicate"
    procs[0].assert_alive()
    wait_until(
        lambda: any(
            codec.decode_event(r.value or b"").command_id == "misplaced-w"
            for r in read_topic(iso, iso.events_topic)
        ),
        timeout=60,
        what="the misplaced worker command decided",
    )
    dlq = read_topic(iso, iso.dlq_topic)
    by_pill = {r.headers["pill"].decode(): r for r in dlq if "pill" in r.headers}
    w = by_pill.pop("malformed-w")
    assert w.headers["source.topic"].decode() == iso.worker_commands_topic
    assert w.headers["error.reason"].decode() == "malformed" and w.value == b"{not json"
    for name, (key, value, reason) in pills.items():
        assert name in by_pill, f"{name}: no dead letter; got {sorted(by_pill)}"
        r = by_pill[name]
        assert r.headers["error.reason"].decode() == reason, (
            f"{name}: {r.headers['error.reason']!r}"
        )
        assert r.value == value and r.key == key, f"{name}: original bytes not kept"
        assert r.headers["source.topic"].decode() == iso.commands_topic
        assert int(r.headers["source.partition"]) == part
        assert int(r.headers["source.offset"]) >= 0
        assert r.headers["error.message"]
    assert "wrong-partition" not in by_pill and "wrong-partition-w" not in by_pill
    assert len(dlq) == len(pills) + 2  # + the SDK's oversized prompt, the worker's bytes
    # each misplaced command: copied once to its session's partition on its own topic, with
    # where it came from, and decided there, once, as its topic's class: the producer's
    # steer (steered, or refused if it came before the prompt); the worker's acquire (its
    # run is unknown, its topic right)
    _forwarded_once(iso, iso.commands_topic, b"wrong-partition", part, wrong)
    _forwarded_once(iso, iso.worker_commands_topic, b"wrong-partition-w", part, wrong)
    decided: dict[str, list[tuple[int, Event]]] = {}
    for r in read_topic(iso, iso.events_topic):
        e = codec.decode_event(r.value or b"")
        decided.setdefault(e.command_id, []).append((r.partition, e))
    ((p1, steer),) = decided["misplaced-1"]
    assert p1 == part and steer.type in ("run.steered", "command.rejected")
    ((p2, acquire),) = decided["misplaced-w"]
    assert p2 == part and acquire.type == "command.rejected"
    assert acquire.payload.reason != "not_allowed_here"  # type: ignore[attr-defined]
    assert "forwarded" in procs[0].log_text() and "murmur2" in procs[0].log_text()
    procs[0].assert_alive()


def _forwarded_once(iso: Settings, topic: str, pill: bytes, part: int, wrong: int) -> None:
    """The record marked `pill`, produced to `topic[wrong]`, was copied once to
    `topic[part]`, naming where it was first read."""
    copies = [
        r for r in read_topic(iso, topic) if r.headers.get("pill") == pill and r.partition == part
    ]
    assert len(copies) == 1, pill
    origin = copies[0].headers["sessionstream.forwarded-from"].decode()
    assert origin.startswith(f"{topic}/{wrong}/")


def test_a_command_acknowledged_without_an_offset_still_gets_its_outcome(
    iso: Settings, procs: list[Proc]
) -> None:
    """An idempotent producer's retry of a record the new leader already has is reported
    delivered with no offset (confluent-kafka: `offset()` None). Such a command was
    accepted by the broker: the SDK must still report its outcome — accepted, duplicate or
    dead letter — from the partition's high watermark, not count it as unsent. Each
    command below is really sent; its delivery report is then replaced by one without an
    offset, as the broker gives it after a leader change."""
    procs.append(processor(iso))
    sid = f"nooffset-{uuid.uuid4().hex[:6]}"

    def without_offset(c: SessionClient, h: CommandHandle) -> CommandHandle:
        c.producer.flush(30)
        assert h.acked and h.offset is not None
        # later commands on the partition: the watermark is a bound, not the offset
        c.producer.produce(iso.commands_topic, key=sid.encode(), value=b"{not json")
        c.producer.flush(30)
        acknowledged(h, h.partition or 0, None, c.codec.encode_command(h.command))
        assert h.offset is None and not h.offset_exact
        return h

    with SessionClient("t", iso) as c:
        first = without_offset(c, c.prompt(sid, "hello"))
        accepted = c.wait(first, timeout=60)
        assert accepted.status == "accepted" and accepted.run_id
        again = without_offset(c, c.submit(first.command))
        assert c.wait(again, timeout=60).status == "duplicate"
        huge = without_offset(c, c.prompt(sid, "x" * (950 * 1024)))
        dead = c.wait(huge, timeout=60)
        assert (dead.status, dead.reason) == ("dead_letter", "oversized")
    # the malformed records between them were dead letters too, not taken for these
    reasons = [r.headers["error.reason"] for r in read_topic(iso, iso.dlq_topic)]
    assert sorted(reasons) == [b"malformed"] * 3 + [b"oversized"]
    procs[0].assert_alive()


def _delete_topics(s: Settings) -> None:
    """Every topic of `s`'s world that exists (CI reuses the broker: none may pile up)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": s.kafka_bootstrap})
    topics = [getattr(s, f) for f in TOPIC_FIELDS]
    for fut in admin.delete_topics(topics, operation_timeout=30).values():
        with contextlib.suppress(Exception):  # a topic the processor never created
            fut.result(timeout=30)


@pytest.mark.parametrize(
    ("field", "partitions", "policy", "problem", "extra"),
    [
        ("events_topic", 2, "compact", "partition counts differ", {}),
        ("events_topic", 4, "delete", "cleanup.policy is 'delete'", {}),
        # the three input topics are co-partitioned: one processor owns p of all of them
        ("worker_commands_topic", 2, "delete", "partition counts differ", {}),
        ("timers_topic", 8, "delete", "partition counts differ", {}),
        # the outcome records hold the dedup records: a day is less than the two dedup
        # windows a restore reads
        (
            "outcomes_topic",
            4,
            "compact,delete",
            "retention.ms is '86400000', must be at least 172800000",
            {"retention.ms": "86400000", "max.message.bytes": str(2 << 20)},
        ),
    ],
)
def test_misconfigured_topics_stop_the_processor_at_startup(
    settings: Settings,
    kafka_bootstrap: str,
    field: str,
    partitions: int,
    policy: str,
    problem: str,
    extra: dict[str, str],
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    from sessionstream.adapters.topics import check_topics
    from sessionstream.errors import TopicMisconfigured

    tag = uuid.uuid4().hex[:8]
    s = settings.model_copy(
        update={**topic_names(f"it.bad.{tag}"), "processor_group": f"it-bad-{tag}"}
    )
    admin = AdminClient({"bootstrap.servers": s.kafka_bootstrap})
    # one topic exists first, wrongly; the processor creates the rest
    topic = getattr(s, field)
    config = {"cleanup.policy": policy, **extra}
    if field != "events_topic":
        config["message.timestamp.type"] = "LogAppendTime"
    admin.create_topics([NewTopic(topic, partitions, 1, config=config)])[topic].result(timeout=30)
    p = Proc(s, "processor", "--instance", "bad").start()
    assert p.popen is not None
    try:
        code = p.popen.wait(90)
        assert code == 2, p.log_text()
        assert problem in p.log_text() and topic in p.log_text(), p.log_text()
        with pytest.raises(TopicMisconfigured, match=problem):
            check_topics(s)
    finally:  # the processor created the other topics: none may pile up on the broker
        _delete_topics(s)


def test_a_topics_configs_are_asked_again_while_a_broker_does_not_know_it(
    kafka_admin: AdminClient,
) -> None:
    """On a cluster, the broker asked for a just-created topic's configs may not know it
    yet (UNKNOWN_TOPIC_OR_PART; seen on the 3-node profile right after `ensure_topics`):
    `check_topics` asks again until its timeout, and only then fails."""
    from confluent_kafka.admin import NewTopic

    from sessionstream.adapters.topics import _describe_topics

    name = f"it-late-{uuid.uuid4().hex[:8]}"
    with pytest.raises(KafkaException) as gone:  # never there: the error, after the timeout
        _describe_topics(kafka_admin, [name], timeout=0.5)
    assert gone.value.args[0].code() == 3
    creator = threading.Timer(
        1.0,
        lambda: kafka_admin.create_topics(
            [NewTopic(name, 1, 1, config={"cleanup.policy": "compact"})]
        )[name].result(timeout=30),
    )
    creator.start()
    try:
        got = _describe_topics(kafka_admin, [name], timeout=30)
        assert got[name]["cleanup.policy"] == "compact"
    finally:
        creator.join()
        kafka_admin.delete_topics([name])[name].result(timeout=30)


def test_a_commands_topic_stamped_by_producers_stops_the_processor(
    settings: Settings, kafka_bootstrap: str
) -> None:
    """The decider's clock is the broker's append time: CreateTime would hand it to
    producers, so the processor refuses to start on such a topic."""
    from confluent_kafka.admin import AdminClient, NewTopic

    tag = uuid.uuid4().hex[:8]
    s = settings.model_copy(
        update={**topic_names(f"it.ct.{tag}"), "processor_group": f"it-ct-{tag}"}
    )
    admin = AdminClient({"bootstrap.servers": s.kafka_bootstrap})
    bad = NewTopic(s.commands_topic, 4, 1, config={"message.timestamp.type": "CreateTime"})
    admin.create_topics([bad])[s.commands_topic].result(timeout=30)
    p = Proc(s, "processor", "--instance", "ct").start()
    assert p.popen is not None
    try:
        assert p.popen.wait(90) == 2, p.log_text()
        assert "LogAppendTime" in p.log_text() and s.commands_topic in p.log_text()
    finally:
        _delete_topics(s)


def test_a_topic_the_broker_refuses_to_create_is_a_clear_error(settings: Settings) -> None:
    """The broker's refusal reaches the user as sessionstream's error, naming the topic and
    the broker's reason, not as a driver exception (`processor` and `topics create` print
    it and exit 2 / 1)."""
    from sessionstream.adapters.topics import ensure_topics
    from sessionstream.errors import KafkaUnavailable

    # one broker here: a replication factor of 5 is refused (INVALID_REPLICATION_FACTOR)
    s = settings.model_copy(
        update={f: f"it.refused.{uuid.uuid4().hex[:8]}.{f}" for f in TOPIC_FIELDS}
        | {"replication_factor": 5}
    )
    with pytest.raises(KafkaUnavailable) as err:
        ensure_topics(s)
    assert "cannot create topic it.refused." in str(err.value)
    assert "replication factor" in str(err.value).lower(), err.value


def test_a_group_member_reading_other_topics_stops_the_processor(iso: Settings) -> None:
    """A member of the processor group subscribed to the commands topic only (a processor
    of the version before the worker-commands topic, in a rolling upgrade): the range
    assignor then gives our processor worker and timer partitions whose commands partition
    another member decides. Two writers for a session: the processor refuses to go on."""
    from confluent_kafka import Consumer

    from sessionstream.adapters.topics import ensure_topics

    ensure_topics(iso)
    old = Consumer(
        {
            "bootstrap.servers": iso.kafka_bootstrap,
            "group.id": iso.processor_group,
            "partition.assignment.strategy": "range",
            "enable.auto.commit": False,
        }
    )
    old.subscribe([iso.commands_topic])
    p = Proc(iso, "processor", "--instance", "new").start()
    assert p.popen is not None
    try:
        # the old member keeps polling (it stays in the group and rejoins the rebalance)
        def exited() -> int | None:
            old.poll(0.2)
            return p.popen.poll() if p.popen is not None else None

        wait_until(lambda: exited() is not None, timeout=120, what="the processor exits")
        assert p.popen.returncode == 2, p.log_text()
        text = p.log_text()
        assert "not co-partitioned" in text and iso.worker_commands_topic in text, text
        assert old.assignment(), "the old member lost its partitions"
    finally:
        old.close()
        p.stop()


def test_a_state_in_an_older_form_is_rebuilt_from_the_log(iso: Settings, procs: list[Proc]) -> None:
    """An upgrade: the changelog holds a state this version cannot read. The processor folds
    that session again from the events log and decides on as if nothing happened."""
    p = processor(iso)
    procs.append(p)
    sid = f"old-{uuid.uuid4().hex[:6]}"
    with SessionClient("t", iso) as c:
        started = c.wait(c.prompt(sid, "long task"), timeout=60)
        assert started.status == "accepted"
        wait_processed(iso, procs=[p])
        assert p.stop() == 0
        # what an earlier version wrote: a field this one refuses
        old = json.dumps({"sessionId": sid, "recentCommands": [1, 2, 3]}).encode()
        prod = Producer({"bootstrap.servers": iso.kafka_bootstrap})
        part = partition_for(sid.encode(), iso.partitions)
        prod.produce(iso.state_topic, key=sid.encode(), value=old, partition=part)
        prod.flush(30)
        again = processor(iso, "p0")
        procs.append(again)
        out = c.wait(c.abort(sid, run_id=started.run_id), timeout=60)
    assert out.status == "accepted", out
    assert [e.type for e in out.events] == ["run.cancel_requested", "run.finished"]
    assert "rebuilt 1 session states from the events log" in again.log_text()


class _OneAtATime:
    """A consumer that hands out at most one record per non-blocking run of polls."""

    def __init__(self, consumer: Any) -> None:
        self._c = consumer

    def poll(self, timeout: float = -1) -> Any:
        return None if timeout == 0 else self._c.poll(timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._c, name)


class OneEventPerRound(SessionClient):
    """A client whose outcome tail reads one event per `collect` round: the events of one
    transaction reach it in separate rounds, as they do when a fetch ends among them."""

    def _consumer(self) -> Any:
        return _OneAtATime(super()._consumer())


def test_an_earlier_send_of_the_same_id_decided_later_is_not_the_outcome(
    iso: Settings, procs: list[Proc]
) -> None:
    """Two sends under one session and command id, the second with other content, both
    produced before the processor decides the first (two producers racing, or a retry
    with other content after a timed-out wait). The first's events come after where the
    second's outcome may start, and carry its `ts` as `producerTs`; the second's outcome
    is its own `command.rejected` (`command_id_reused`), not the first's acceptance."""
    sid = f"reuse-{uuid.uuid4().hex[:6]}"

    def outcome_of(client: SessionClient, handle: CommandHandle) -> Any:
        got: list[Any] = []
        wait_until(
            lambda: got.extend(client.collect([handle], 0.1)) or got,
            timeout=60,
            what=f"the outcome of {handle.command.type}",
        )
        return got[0][1]

    with SessionClient("t", iso) as first, SessionClient("t", iso) as second:
        # the second client's tail reads the session's partition already, so its next
        # send starts from the end the tail's last fetch reported (no request)
        p0 = processor(iso)
        (warm,) = second.submit_many([second.command(sid, "abort", {})])
        assert outcome_of(second, warm).reason == "no_active_run"
        p0.stop()
        cid = str(uuid.uuid4())
        original = first.command(sid, "prompt", {"text": "the original"}, command_id=cid)
        first.submit(original, track=False)
        first.flush()
        other = second.command(
            sid, "prompt", {"text": "other content"}, command_id=cid, ts=original.ts + 1
        )
        (handle,) = second.submit_many([other])
        procs.append(processor(iso, "p1"))
        outcome = outcome_of(second, handle)
    assert outcome.status == "rejected" and outcome.reason == "command_id_reused", outcome
    assert [e.type for e in outcome.events] == ["command.rejected"]
    assert all(e.producer_ts == other.ts for e in outcome.events)


def test_collected_outcomes_hold_every_event_of_their_command_while_others_commit(
    iso: Settings, procs: list[Proc]
) -> None:
    """An outcome is complete once the tail reaches the partition's last stable offset read
    after its first event (not its high watermark, which would wait for the transactions
    still open). Under a second producer keeping the processor's next transactions open on
    the same partitions, and a tail that gets one event per round, every outcome `collect`
    gives must hold exactly its command's events as the log has them."""
    procs.append(processor(iso))
    halt = threading.Event()

    def noise() -> None:  # other sessions' commands, on every partition, all the while
        with SessionClient("noise", iso) as n:
            i = 0
            while not halt.is_set():
                sid = f"noise-{i % 40}"
                n.submit(n.command(sid, "prompt", {"text": "x"}), track=False)
                n.submit(n.command(sid, "abort", {}), track=False)
                n.producer.poll(0.002)
                i += 1
            n.flush()

    bg = threading.Thread(target=noise, daemon=True)
    got: dict[str, list[tuple[str, int, str]]] = {}

    def collect_all(c: SessionClient, handles: list[CommandHandle]) -> None:
        left = list(handles)

        def collected() -> bool:
            for h, out in c.collect(left, 0.005):
                assert not isinstance(out, Exception), out
                got[h.command.command_id] = [(e.session_id, e.seq, e.type) for e in out.events]
                left.remove(h)
            return not left

        wait_until(
            collected,
            timeout=60,
            interval=0,
            what=lambda: f"every outcome ({len(left)} outcomes missing)",
        )

    try:
        with OneEventPerRound("t", iso) as c:
            c.wait(c.prompt("warm", "w"), timeout=60)
            bg.start()
            for r in range(15):
                sids = [f"o{r}-{k}" for k in range(8)]
                handles = c.submit_many([c.command(s, "prompt", {"text": "p"}) for s in sids])
                handles += c.submit_many([c.command(s, "abort", {}) for s in sids])
                collect_all(c, handles)
    finally:
        halt.set()
        bg.join(30)
    in_log: dict[str, list[tuple[str, int, str]]] = {}
    codec = reader_codec(get_settings())
    for rec in read_topic(iso, iso.events_topic):
        e = codec.decode_event(rec.value or b"")
        if e.command_id in got:
            in_log.setdefault(e.command_id, []).append((e.session_id, e.seq, e.type))
    assert got == in_log
    assert sum(len(v) > 1 for v in got.values()) >= 100  # aborts: cancel_requested + finished


class _FailsAt:
    """The processor's real producers, except that their commit_transaction calls numbered
    `at` (counted over all of them) fail with an error that requires aborting the
    transaction (as a partition moving away mid-transaction does): the transaction is
    aborted and read again. `after_commit`: they commit, and then report a fatal error
    (the outcome of a commit the broker did take is lost, as when a commit retried across
    a broker restart outlives the processor's wait)."""

    def __init__(self, at: set[int], *, after_commit: bool = False) -> None:
        self.at, self.calls, self.failed = at, 0, 0
        self.after_commit = after_commit

    def wrap(self, producer: TransactionalProducer) -> TransactionalProducer:
        """The adapter's client around the failing stand-in of `producer`'s driver: the
        injected errors are the driver's own, translated by the adapter as real ones are."""
        return TransactionalProducer(_Failing(producer.driver, self))  # type: ignore[arg-type]


class _Failing:
    def __init__(self, producer: Any, plan: _FailsAt) -> None:
        self._p, self._plan = producer, plan

    def commit_transaction(self, *args: Any, **kwargs: Any) -> None:
        plan = self._plan
        plan.calls += 1
        if plan.calls not in plan.at:
            self._p.commit_transaction(*args, **kwargs)
            return
        plan.failed += 1
        if not plan.after_commit:
            raise KafkaException(KafkaError(KafkaError._STATE, "injected", txn_requires_abort=True))
        self._p.commit_transaction(*args, **kwargs)
        raise KafkaException(
            KafkaError(KafkaError._TIMED_OUT, "injected: the commit's outcome lost", fatal=True)
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._p, name)


def _trickle(
    iso: Settings, failing: _FailsAt, name: str, *, at_least: int, sessions: int, pause_s: float
) -> tuple[set[str], TransactionalProcessor]:
    """A processor with `failing`'s producers under light load: at least `at_least`
    prompts and aborts over `sessions` sessions, and on until two injected failures
    happened (on a loaded machine the recovery from the first can take seconds, and the
    batches after it are large: 1,500 commands once ended before the 14th commit; bounded
    at 60 s). Returns the command ids sent, once the processor has decided them all, and the
    (stopped) processor."""
    proc = TransactionalProcessor(iso, instance_id=f"{name}-{uuid.uuid4().hex[:6]}")
    proc.start()
    proc._producers = [failing.wrap(p) for p in proc._producers]  # type: ignore[misc]
    # a fatal failure renews producers (the failed one, and the idle one made before it):
    # the new ones fail as planned too
    made = proc._transactional_producer
    proc._transactional_producer = (  # type: ignore[method-assign]
        lambda slot, patience_s=0.0: failing.wrap(made(slot, patience_s))
    )
    stop = threading.Event()
    runner = threading.Thread(target=proc.run, args=(stop,), daemon=True)
    runner.start()
    sent: set[str] = set()
    try:
        wait_until(
            lambda: len(proc.partitions) == iso.partitions, timeout=60, what="partitions assigned"
        )
        with SessionClient("t", iso) as c:
            deadline = time.monotonic() + 60
            i = -1
            while i < at_least - 1 or (failing.failed < 2 and time.monotonic() < deadline):
                i += 1
                sid = f"{name}-{i % sessions}"
                kind = "prompt" if (i // sessions) % 2 == 0 else "abort"
                cmd = c.command(sid, kind, {"text": "x"} if kind == "prompt" else {})
                c.submit(cmd, track=False)
                sent.add(cmd.command_id)
                c.producer.poll(0)
                time.sleep(pause_s)
            c.flush()
        wait_processed(iso)
    finally:
        stop.set()
        runner.join(60)
    # how many of the planned failures come depends on the recovery (an abort can cost
    # the next transaction too: librdkafka then bumps the epoch)
    assert failing.failed >= 2, (
        f"{failing.failed} injected failures in {failing.calls} commits of {len(sent)} "
        f"commands (producers wrapped still: "
        f"{[isinstance(p.driver, _Failing) for p in proc._producers]})"
    )
    assert proc.stats.aborts >= failing.failed or failing.after_commit
    return sent, proc


def test_failed_commits_under_light_load_read_their_batches_again(
    iso: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under light load the processor decides a poll while a transaction commits, and once
    that commit is done takes the records that arrived during it into the same batch. When
    that commit fails, the transaction is aborted and both its batch and the one decided on
    top of it are read again: every command still gets exactly one outcome, the log has no
    gap or duplicate, and the state table equals the fold of the log."""
    light: list[int] = []
    real_absorb = Batch.absorb

    def counting(self: Batch, later: Batch) -> None:
        light.append(len(later.messages))
        real_absorb(self, later)

    monkeypatch.setattr(Batch, "absorb", counting)
    sent, _ = _trickle(
        iso, _FailsAt(at=set(range(8, 60, 6))), "light", at_least=1500, sessions=30, pause_s=0.001
    )
    assert light, "no records joined a batch after a commit"
    _assert_log(iso, sent)


def test_a_consumer_that_stops_rejoining_its_group_is_replaced(
    iso: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen in CI after a broker restart: the processor's consumer lost its partitions and
    never sent JoinGroup again; the coordinator expired the member and the processor, alive,
    decided nothing for three minutes. Here the consumer leaves the same way, unsubscribed
    behind the processor's back (a static member sends no LeaveGroup: the coordinator
    expires it after the session timeout). The processor finds itself missing from the
    group and a new consumer takes the partitions back; a command sent meanwhile is
    decided. Without the watch the command waits forever."""
    # a shorter watch than the default 30 s, still past the coordinator's 6 s expiry
    monkeypatch.setattr(failures, "REJOIN_CHECK_S", 10.0)
    proc = TransactionalProcessor(iso, instance_id=f"rejoin-{uuid.uuid4().hex[:6]}")
    leave, left = threading.Event(), []
    watch = proc._watch_rejoin

    def unsubscribe_then_watch() -> None:  # on the processor's thread, before each poll
        if leave.is_set() and not left:
            assert proc._consumer is not None
            left.append(proc._consumer)
            proc._consumer.driver.unsubscribe()
        watch()

    monkeypatch.setattr(proc, "_watch_rejoin", unsubscribe_then_watch)
    stop = threading.Event()
    runner = threading.Thread(target=proc.run, args=(stop,), daemon=True)
    runner.start()
    try:
        wait_until(
            lambda: len(proc.partitions) == iso.partitions, timeout=60, what="partitions assigned"
        )
        leave.set()
        wait_until(lambda: not proc.partitions, timeout=30, what="the partitions revoked")
        stuck = left[0]
        with SessionClient("t", iso) as c:
            out = c.wait(c.submit(c.command("rejoin-s", "prompt", {"text": "x"})), 60)
        assert out.status == "accepted", out
        assert proc._consumer is not stuck
        assert len(proc.partitions) == iso.partitions
    finally:
        stop.set()
        runner.join(60)
    assert not runner.is_alive()


def test_a_commit_whose_outcome_was_lost_counts_as_committed(iso: Settings) -> None:
    """A transaction commits, but the processor hears a fatal error instead (as when
    librdkafka hangs in a commit the coordinator took, after a broker restart). It renews
    the producer — whose init_transactions ends the old transaction either way — and asks
    the group's committed offsets: they hold the batch, so the batch counts as committed
    and is not decided again. Decided again on a store that never took it in, its records
    would be written a second time, and any other order of the commands read with it (the
    three input topics interleave as they are fetched) could decide differently on top of
    what committed. Every command has one outcome, no run has a gap, the state table is
    the fold of the log, and nothing was written twice."""
    lost = _FailsAt(at={6, 15}, after_commit=True)
    sent, proc = _trickle(iso, lost, "lost", at_least=800, sessions=20, pause_s=0.002)
    _assert_log(iso, sent)
    assert proc.stats.committed_after_all == lost.failed
    assert check_log(read_topic(iso, iso.events_topic)).identical_duplicates == 0


def test_a_restarted_instance_fences_both_of_its_predecessors_producers(iso: Settings) -> None:
    """Transactions alternate between an instance's two producers, so a crashed instance
    can leave an open transaction on either transactional id. The second one's, left open
    with a record in the events partition, would hold every read_committed reader of that
    partition for its whole timeout (2 minutes here). The restarted instance must abort it
    at start: a command to that partition gets its outcome at once, the zombie's record is
    never visible, and the zombie is fenced when it tries to commit."""
    from sessionstream.adapters.kafka import transactional_producer_config
    from sessionstream.runtimes.processor.loop import transactional_ids

    instance = f"fence-{uuid.uuid4().hex[:6]}"
    sid = next(
        s for s in (f"z-{i}" for i in range(1000)) if partition_for(s.encode(), iso.partitions) == 0
    )
    second = transactional_ids(iso.processor_group, instance)[1]
    assert second != transactional_ids(iso.processor_group, instance)[0]
    zombie = Producer(
        transactional_producer_config(iso, second, **{"transaction.timeout.ms": 120_000})
    )
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(iso.events_topic, key=b"zombie", value=b"not an event", partition=0)
    assert zombie.flush(30) == 0

    proc = TransactionalProcessor(iso, instance_id=instance)
    stop = threading.Event()
    runner = threading.Thread(target=proc.run, args=(stop,), daemon=True)
    runner.start()
    try:
        wait_until(lambda: proc.ready.is_set(), timeout=60, what="partitions assigned")
        with SessionClient("t", iso) as c:
            out = c.wait(c.submit(c.command(sid, "prompt", {"text": "after the crash"})), 30)
            assert out.status == "accepted", out
    finally:
        stop.set()
        runner.join(60)
    assert all(rec.key != b"zombie" for rec in read_topic(iso, iso.events_topic))
    with pytest.raises(KafkaException) as fenced:
        zombie.commit_transaction(30)
    assert fenced.value.args[0].fatal() or fenced.value.args[0].code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    ), fenced.value


def test_every_outcome_names_exactly_its_commands_events_in_big_batches(
    iso: Settings, procs: list[Proc]
) -> None:
    """A backlog (so a transaction carries hundreds of commands of each partition) of
    prompts, steers, aborts and retried ids: one outcome record per command read, and an
    outcome's `first/last_event_offset` name exactly the events its command made — from
    the spec (docs/producers.md), not from how the processor finds them."""
    rnd = random.Random(7)
    sids = [f"ob-{i}-{uuid.uuid4().hex[:4]}" for i in range(24)]
    sent = 0
    with SessionClient("tenant-a", iso) as c:
        for i in range(700):
            sid = rnd.choice(sids)
            kind = rnd.choice(["prompt", "prompt", "steer", "abort", "follow_up"])
            payload: dict[str, Any] = {} if kind == "abort" else {"text": f"{kind} {i}"}
            if kind == "prompt":
                payload["policy"] = rnd.choice(["reject", "enqueue", "interrupt"])
            cmd = c.command(sid, kind, payload, command_id=f"ob-{i}")
            c.submit(cmd, track=False)
            sent += 1
            if i % 9 == 0:  # a retry: the same id again, a duplicate outcome
                c.submit(cmd, track=False)
                sent += 1
        c.flush()
    procs.append(processor(iso))
    wait_processed(iso, procs=procs)
    codec = reader_codec(get_settings())
    events = {
        (r.partition, r.offset): codec.decode_event(r.value or b"")
        for r in read_topic(iso, iso.events_topic)
    }
    records = sorted(read_topic(iso, iso.outcomes_topic), key=lambda r: (r.partition, r.offset))
    outcomes = [codec.decode_outcome(r.value or b"") for r in records]
    assert len(outcomes) == sent
    # each input partition's outcomes in its order: the two transactions in flight keep it
    # in the outcomes topic too (docs/operations.md, "Pipelined")
    order: dict[tuple[str, int], list[int]] = {}
    for o in outcomes:
        order.setdefault((o.source_topic, o.source_partition), []).append(o.source_offset)
    assert all(offs == sorted(offs) for offs in order.values()), order
    by_command: dict[str, list[tuple[int, int]]] = {}
    for (p, off), e in events.items():
        by_command.setdefault(e.command_id or "", []).append((p, off))
    decided: set[str] = set()
    for o in outcomes:
        assert o.command_id is not None
        if o.status == "duplicate":
            assert o.event_count == 0 and o.first_event_offset is None
            continue
        assert o.command_id not in decided, f"{o.command_id} decided twice"
        decided.add(o.command_id)
        assert o.status in ("accepted", "rejected"), o
        p = o.source_partition
        assert o.first_event_offset is not None and o.last_event_offset is not None, o
        named = [
            (p, off)
            for off in range(o.first_event_offset, o.last_event_offset + 1)
            if (p, off) in events
        ]
        assert len(named) == o.event_count > 0
        assert sorted(by_command[o.command_id]) == named, o
        if o.run_id is not None:
            assert o.run_id in {events[k].run_id for k in named}, o
    assert len(decided) == 700
