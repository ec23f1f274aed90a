"""The faust table trap (faust-streaming#48, robinhood/faust#340), measured on our broker.

A faust app counts records in a tumbling windowed table (`counts[tenant] += 1`, the
textbook faust analytics job). The script produces N records, starts the app as a
subprocess, kills it with SIGKILL `--kills` times while it consumes (each time after its
group committed another share of the input), restarts it, lets it finish, stops it cleanly
and adds up the table's last values read back from its changelog topic. A correct counter
ends at N. Evidence for docs/decisions/0002-analytics.md.

    .venv/bin/python -m bench.faust_trap --guarantee at_least_once [--records 40000] [--kills 2]
    .venv/bin/python -m bench.faust_trap --guarantee exactly_once
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

BOOTSTRAP = os.environ.get("SESSIONSTREAM_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
PARTITIONS = 4
TENANTS = [f"t{i}" for i in range(5)]


def worker(app_id: str, topic: str, guarantee: str, datadir: str) -> None:
    """The naive faust counter (runs in the subprocess)."""
    import faust

    app = faust.App(
        app_id,
        broker=f"kafka://{BOOTSTRAP}",
        processing_guarantee=guarantee,
        store="memory://",
        datadir=datadir,
        topic_partitions=PARTITIONS,
        topic_replication_factor=1,
        web_enabled=False,
        broker_commit_interval=1.0,
    )
    source = app.topic(
        topic, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
    )
    counts = (
        app.Table("counts", default=int, partitions=PARTITIONS, key_type=str, value_type=int)
        .tumbling(60, expires=timedelta(hours=1))
        .relative_to_stream()
    )

    @app.agent(source)
    async def count(stream: Any) -> None:
        async for value in stream:
            counts[value.decode()] += 1

    sys.argv = [sys.argv[0], "worker", "--loglevel", "warn"]
    app.main()


def committed_total(app_id: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": app_id})
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
        return sum(max(tp.offset, 0) for tp in tps)
    finally:
        c.close()


def table_total(changelog: str) -> int:
    """Sum of the last value of every window key, read_committed from the changelog."""
    c = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": f"trap-read-{uuid.uuid4()}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    last: dict[bytes, int] = {}
    try:
        c.assign([TopicPartition(changelog, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        eof: set[int] = set()
        deadline = time.monotonic() + 60
        while len(eof) < PARTITIONS and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is None:
                continue
            if m.error():
                eof.add(m.partition())
                continue
            if m.value() is None:
                last.pop(m.key() or b"", None)
            else:
                last[m.key() or b""] = int(json.loads(m.value()))
    finally:
        c.close()
    return sum(last.values())


def wait_committed(app_id: str, topic: str, target: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 240
    while committed_total(app_id, topic) < target:
        if proc.poll() is not None:
            raise RuntimeError(f"faust worker exited with {proc.returncode}, see its log")
        if time.monotonic() > deadline:
            raise TimeoutError(f"group {app_id} did not commit {target} records")
        time.sleep(0.2)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--guarantee", default="at_least_once")
    ap.add_argument("--records", type=int, default=40_000)
    ap.add_argument("--kills", type=int, default=2)
    ap.add_argument("--worker", nargs=3, metavar=("APP_ID", "TOPIC", "DATADIR"))
    a = ap.parse_args()
    if a.worker:
        worker(a.worker[0], a.worker[1], a.guarantee, a.worker[2])
        return 0

    tag = uuid.uuid4().hex[:8]
    topic, app_id = f"exp.trap.{tag}", f"exp-trap-{tag}"
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    datadir = tempfile.mkdtemp(prefix="faust-trap-")
    log = Path(datadir) / "worker.log"
    try:
        p = Producer({"bootstrap.servers": BOOTSTRAP, "linger.ms": 20})
        for i in range(a.records):
            p.produce(topic, key=str(i).encode(), value=TENANTS[i % len(TENANTS)].encode())
            if i % 10_000 == 0:
                p.flush()
        p.flush()
        cmd = [
            sys.executable,
            __file__,
            "--guarantee",
            a.guarantee,
            "--worker",
            app_id,
            topic,
            datadir,
        ]
        t0 = time.monotonic()
        for k in range(a.kills):
            with log.open("ab") as out:
                proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
            wait_committed(app_id, topic, a.records * (k + 1) // (a.kills + 1), proc)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            print(f"kill -9 #{k + 1} at {committed_total(app_id, topic)} committed", flush=True)
        with log.open("ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        wait_committed(app_id, topic, a.records, proc)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        elapsed = time.monotonic() - t0
        total = table_total(f"{app_id}-counts-changelog")
        result = {
            "guarantee": a.guarantee,
            "records": a.records,
            "kills": a.kills,
            "table_total": total,
            "difference": total - a.records,
            "seconds": round(elapsed, 1),
        }
        print(json.dumps(result), flush=True)
        return 0 if total == a.records else 1
    finally:
        names = [
            t for t in admin.list_topics(timeout=10).topics if t == topic or t.startswith(app_id)
        ]
        for fut in admin.delete_topics(names, operation_timeout=30).values():
            try:
                fut.result(30)
            except Exception as e:  # already gone: nothing to keep
                print(f"cleanup: {e}", file=sys.stderr)
        admin.delete_consumer_groups([app_id])[app_id].exception(30)


if __name__ == "__main__":
    sys.exit(main())
