"""The processor's local state store against the real broker: a restart reads the changelogs'
tail from the store's checkpoint, a store that does not belong to the log is not trusted,
and the sessions the store holds decide the same as the log says."""

from __future__ import annotations

import contextlib
import re
import shutil
import uuid

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from sessionstream.adapters.kafka import client_config, read_topic
from sessionstream.adapters.topics import ensure_topics
from sessionstream.client import SessionClient
from sessionstream.core.decider import command_digest
from sessionstream.core.log_check import state_table
from sessionstream.core.partitioning import partition_for
from sessionstream.core.state import command_hash
from sessionstream.core.step import DedupRecord, encode_dedup
from sessionstream.errors import SessionstreamError
from sessionstream.settings import Settings
from stack.worlds import world_topics
from tests.integration.helpers import check_log, fold_log, wait_until
from tests.integration.procs import Proc, processor, wait_processed

pytestmark = pytest.mark.integration

RESTORED = re.compile(
    r"restored partitions \[[\d, ]*\]: (\d+) changelog records in [\d.]+s "
    r"\((\d+) from a checkpoint, (\d+) in full\)"
)


def _restores(p: Proc) -> list[tuple[int, int, int]]:
    """(records read, databases from a checkpoint, databases in full) of each restore."""
    return [tuple(map(int, m.groups())) for m in RESTORED.finditer(p.log_text())]  # type: ignore[misc]


def _wait_restored(p: Proc, count: int = 1) -> tuple[int, int, int]:
    wait_until(lambda: len(_restores(p)) >= count, timeout=90, what="restore line")
    return _restores(p)[-1]


def _prompts(s: Settings, sessions: list[str], tag: str) -> list[str]:
    ids = []
    with SessionClient("tenant-a", s) as c:
        for sid in sessions:
            cmd = c.command(sid, "prompt", {"text": f"task {tag}"}, command_id=f"{tag}-{sid}")
            c.submit(cmd, track=False)
            ids.append(cmd.command_id)
        c.flush()
    return ids


def _one_prompt_then_stop(s: Settings, procs: list[Proc], instance: str, prefix: str) -> str:
    """A processor decides one session's prompt and stops; the session's id."""
    p = processor(s, instance)
    procs.append(p)
    sid = f"{prefix}-{uuid.uuid4().hex[:6]}"
    _prompts(s, [sid], "a")
    wait_processed(s, procs=procs)
    assert p.stop() == 0
    return sid


def _assert_log(s: Settings) -> None:
    events = read_topic(s, s.events_topic)
    report = check_log(events)
    assert report.ok, report.violations
    assert state_table(read_topic(s, s.state_topic)) == fold_log(events)


def test_restart_after_kill9_reads_only_the_tail(iso: Settings, procs: list[Proc]) -> None:
    p = processor(iso, "st")
    procs.append(p)
    sessions = [f"st-{i}" for i in range(400)]
    _prompts(iso, sessions, "a")
    wait_processed(iso, procs=procs)
    first = _wait_restored(p)
    assert first[2] == 8, f"a new store restores all 8 databases in full: {first}"

    p.kill9()
    # while it is down: aborts of the runs the store knows about
    aborted = sessions[:25]
    with SessionClient("tenant-a", iso) as c:
        for sid in aborted:
            c.submit(c.command(sid, "abort", {}, command_id=f"abort-{sid}"), track=False)
        c.flush()

    p2 = processor(iso, "st")
    procs.append(p2)
    records, from_checkpoint, full = _wait_restored(p2)
    # 400 sessions -> 400 state records and 400 dedup records on the changelogs; a restart
    # reads only what the store had not applied when it was killed (at most the last batch)
    assert (from_checkpoint, full) == (8, 0)
    assert records < 100, f"restart read {records} changelog records: not just the tail"
    wait_processed(iso, procs=[p2])

    events = read_topic(iso, iso.events_topic)
    report = check_log(events)
    assert report.ok, report.violations
    for sid in aborted:  # each abort found its session's run in the store
        types = [e.type for e in report.outcomes[f"abort-{sid}"]]
        assert "run.cancel_requested" in types or "run.finished" in types, (sid, types)
    _assert_log(iso)


def _recreate_topics(s: Settings) -> None:
    admin = AdminClient(client_config(s))
    for fut in admin.delete_topics(world_topics(s), operation_timeout=30).values():
        fut.result(timeout=60)
    for fut in admin.delete_consumer_groups([s.processor_group], request_timeout=30).values():
        with contextlib.suppress(KafkaException):
            fut.result(timeout=30)

    def created() -> bool:
        try:
            ensure_topics(s)
        except SessionstreamError:
            return False  # still marked for deletion
        return set(world_topics(s)) <= set(admin.list_topics(timeout=10).topics)

    wait_until(created, timeout=60, interval=0.5, what="topics created again")


def test_a_store_of_a_topic_created_again_is_not_trusted(iso: Settings, procs: list[Proc]) -> None:
    sid = _one_prompt_then_stop(iso, procs, "st", "old")

    # the topics are deleted and created again (same names, new ids); the store stays
    _recreate_topics(iso)

    p2 = processor(iso, "st")
    procs.append(p2)
    records, from_checkpoint, full = _wait_restored(p2)
    assert p2.log_text().count("another topic's checkpoint (created again") == 8
    assert full == 8 and from_checkpoint == 0 and records == 0

    # the old session is unknown to the new log: a steer has no run to go to
    with SessionClient("tenant-a", iso) as c:
        c.submit(c.command(sid, "steer", {"text": "x"}, command_id="steer-1"), track=False)
        c.flush()
    wait_processed(iso, procs=[p2])
    report = check_log(read_topic(iso, iso.events_topic))
    assert [e.type for e in report.outcomes["steer-1"]] == ["command.rejected"]
    _assert_log(iso)


def test_a_store_restored_in_full_remembers_from_the_outcomes(
    iso: Settings, procs: list[Proc]
) -> None:
    """The dedup records come back from `session.outcomes` (no other topic holds them):
    after the store is lost, a re-sent command is still a duplicate, another content under
    its id is still refused, and an erased session's earlier ids are still forgotten."""
    p = processor(iso, "dd")
    procs.append(p)
    sid, gone = f"dd-{uuid.uuid4().hex[:6]}", f"gone-{uuid.uuid4().hex[:6]}"
    with SessionClient("tenant-a", iso) as c:
        first = c.wait(c.submit(c.command(sid, "prompt", {"text": "go"}, command_id="A")))
        assert first.status == "accepted"
        # a re-send before the loss: its outcome is the last record under A's key
        dup = c.wait(c.submit(c.command(sid, "prompt", {"text": "go"}, command_id="A")))
        assert dup.status == "duplicate"
        assert c.wait(c.submit(c.command(sid, "abort", {}, command_id="B"))).status == "accepted"
        before = c.wait(c.submit(c.command(gone, "prompt", {"text": "x"}, command_id="C")))
        assert before.status == "accepted"
        assert c.wait(c.submit(c.command(gone, "abort", {}, command_id="C2"))).status == "accepted"
        erased = c.wait(c.submit(c.command(gone, "session.erase", {}, actor="ops")))
        assert erased.status == "accepted"
    wait_processed(iso, procs=procs)
    assert p.stop() == 0
    assert iso.store_dir is not None
    store = iso.store_dir / iso.processor_group / "dd"
    assert store.is_dir()
    shutil.rmtree(store)

    p2 = processor(iso, "dd")
    procs.append(p2)
    _records, from_checkpoint, full = _wait_restored(p2)
    assert (from_checkpoint, full) == (0, 8)
    with SessionClient("tenant-a", iso) as c:
        again = c.wait(c.submit(c.command(sid, "prompt", {"text": "go"}, command_id="A")))
        assert again.status == "duplicate", again
        reused = c.wait(c.submit(c.command(sid, "steer", {"text": "no"}, command_id="A")))
        assert (reused.status, reused.reason) == ("rejected", "command_id_reused")
        assert c.wait(c.submit(c.command(sid, "abort", {}, command_id="B"))).status == "duplicate"
        # the erasure forgot C: decided again, as a new session's first prompt
        anew = c.wait(c.submit(c.command(gone, "prompt", {"text": "x"}, command_id="C")))
        assert anew.status == "accepted" and anew.run_id != before.run_id
    _assert_log(iso)


def test_an_older_processors_outcomes_after_the_checkpoint_are_named(
    iso: Settings, procs: list[Proc]
) -> None:
    """A partition that went to a processor of an older version (a rolling upgrade) comes
    back with outcome records that carry no dedup header: the restore says so."""
    sid = _one_prompt_then_stop(iso, procs, "ov", "ov")
    # what an older version writes for an accepted command: no sessionstream.dedup header
    producer = Producer(client_config(iso))
    producer.produce(
        iso.outcomes_topic,
        key=f"{sid}/older-1".encode(),
        value=b"{}",
        partition=partition_for(sid.encode(), iso.partitions),
        headers=[("ce_type", b"sessionstream.outcome.accepted")],
    )
    assert producer.flush(10) == 0

    p2 = processor(iso, "ov")
    procs.append(p2)
    _records, from_checkpoint, full = _wait_restored(p2)
    assert (from_checkpoint, full) == (8, 0)
    assert "1 accepted outcome records after this store's checkpoint" in p2.log_text()


def test_the_first_start_after_the_upgrade_takes_the_older_dedup_topic(
    iso: Settings, procs: list[Proc]
) -> None:
    """What an older version remembered in `session.dedup` (its changelog, still there after
    the upgrade) stays a duplicate: a full restore reads it before the outcomes."""
    sid = f"up-{uuid.uuid4().hex[:6]}"
    with SessionClient("tenant-a", iso) as c:
        old = c.command(sid, "prompt", {"text": "decided before the upgrade"}, command_id="U")
    admin = AdminClient(client_config(iso))
    p = partition_for(sid.encode(), iso.partitions)
    topic = NewTopic(iso.dedup_topic, num_partitions=iso.partitions, replication_factor=1)
    admin.create_topics([topic])[iso.dedup_topic].result(timeout=30)
    # the older version's record: key {session}/{id digest}, value content digest + time
    record = DedupRecord(sid, command_hash("U", "tenant-a"), command_digest(old), old.ts)
    producer = Producer(client_config(iso))
    producer.produce(
        iso.dedup_topic,
        key=f"{sid}/{record.id_hash:016x}".encode(),
        value=encode_dedup(record),
        partition=p,
    )
    assert producer.flush(10) == 0

    proc = processor(iso, "up")
    procs.append(proc)
    _records, _from_checkpoint, full = _wait_restored(proc)
    assert full == 8
    assert f"took 1 dedup records of {iso.dedup_topic}" in proc.log_text()
    with SessionClient("tenant-a", iso) as c:
        assert c.wait(c.submit(old)).status == "duplicate"
        # another id on that session is decided as usual
        fresh = c.command(sid, "prompt", {"text": "after"}, command_id="V")
        assert c.wait(c.submit(fresh)).status == "accepted"
