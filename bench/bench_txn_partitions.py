"""What a transaction's commit costs per partition it wrote, on the local broker.

The processor's transaction writes up to four topics of four partitions each (events, the
state changelog, open runs, outcomes; five with the dedup changelog before decision 0003's
eleventh pass) where the raw pass-through it is measured against writes one. This
isolates that difference: the same transactional producer as the processor's
(`transactional_producer_config`), `--records` records per transaction spread
over 4, 8, 12 or 16 partitions (1-4 topics of 4), the input offset joined with
`send_offsets_to_transaction`, then the commit. Timed: `send_offsets_to_transaction` +
`commit_transaction` (what the processor's commit thread does). The partition counts
alternate within each round (A B C D A B C D ...) to tame the machine's noise.

`--producers 1,2` also alternates the number of transactional producers the transactions
take turns on, as the processor's two do (`sessionstream/runtimes/processor/loop.py`): one producer
that
begins its next transaction right after a commit has its AddPartitionsToTxn refused
CONCURRENT_TRANSACTIONS until the broker has written the commit's markers, and librdkafka
retries that after a fixed 20 ms; with two, each producer's last transaction ended one
transaction earlier.

    .venv/bin/python -m bench.bench_txn_partitions [--transactions 300] [--rounds 2]
        [--producers 1,2] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench._harness import percentiles
from sessionstream.adapters.kafka import client_config, transactional_producer_config
from sessionstream.settings import Settings

PARTITIONS = 4


def commit_times(
    producers: list[Producer],
    meta: Any,
    source: str,
    topics: list[str],
    n: int,
    records: int,
    first_offset: int,
) -> list[float]:
    """Seconds of send_offsets + commit for `n` transactions writing `records` records
    round-robin over every partition of `topics`, the producers taking turns."""
    targets = [(t, p) for t in topics for p in range(PARTITIONS)]
    value = b"x" * 120  # about an event's size
    out = []
    for i in range(n):
        producer = producers[i % len(producers)]
        producer.begin_transaction()
        for r in range(records):
            topic, partition = targets[r % len(targets)]
            producer.produce(topic, value, partition=partition)
        t0 = time.perf_counter()
        producer.send_offsets_to_transaction(
            [TopicPartition(source, 0, first_offset + i + 1)], meta, 30
        )
        producer.commit_transaction(30)
        out.append(time.perf_counter() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transactions", type=int, default=300, help="per partition count, round")
    ap.add_argument("--records", type=int, default=40, help="records per transaction")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--producers", default="1", help="producers taking turns, a comma-separated list"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)

    s = Settings()
    run = uuid.uuid4().hex[:8]
    topics = [f"bench.txnp.{run}.{i}" for i in range(4)]
    source = f"bench.txnp.{run}.in"
    group = f"bench.txnp.{run}"
    admin = AdminClient(client_config(s))
    for f in admin.create_topics(
        [NewTopic(t, PARTITIONS, 1) for t in [*topics, source]], operation_timeout=30
    ).values():
        f.result()
    consumer = Consumer(client_config(s, **{"group.id": group, "enable.auto.commit": False}))
    counts = [int(n) for n in args.producers.split(",")]
    producers = {
        n: [Producer(transactional_producer_config(s, f"{group}-{n}-{j}")) for j in range(n)]
        for n in counts
    }
    results: dict[tuple[int, int], list[float]] = {}
    rows = []
    try:
        for ps in producers.values():
            for producer in ps:
                producer.init_transactions(60)
        meta = consumer.consumer_group_metadata()
        offset = 0
        for rnd in range(1, args.rounds + 1):
            for n in counts:
                for k in range(1, len(topics) + 1):
                    times = commit_times(
                        producers[n],
                        meta,
                        source,
                        topics[:k],
                        args.transactions,
                        args.records,
                        offset,
                    )
                    offset += args.transactions
                    results.setdefault((k * PARTITIONS, n), []).extend(times)
                    row = {
                        "round": rnd,
                        "partitions": k * PARTITIONS,
                        "producers": n,
                        **percentiles(times),
                        "load_average": round(os.getloadavg()[0], 2),
                    }
                    rows.append(row)
                    if not args.json:
                        print(
                            f"round {rnd}: {k * PARTITIONS:2d} partitions/txn, {n} "
                            f"producer(s): send_offsets + commit p50 {row['p50_ms']:.2f} / "
                            f"p90 {row['p90_ms']:.2f} / p99 {row['p99_ms']:.2f} ms (load "
                            f"{row['load_average']})",
                            flush=True,
                        )
    finally:
        consumer.close()
        for ps in producers.values():
            for producer in ps:
                producer.flush(10)
        for f in admin.delete_topics([*topics, source], operation_timeout=30).values():
            f.result()
        for f in admin.delete_consumer_groups([group], request_timeout=30).values():
            # the group holds the offsets the transactions committed; gone already is fine
            with contextlib.suppress(KafkaException):
                f.result()
    summary = {f"{k}x{n}": percentiles(v) for (k, n), v in sorted(results.items())}
    if args.json:
        print(json.dumps({"rounds": rows, "all": summary}))
    else:
        print("all rounds (partitions x producers):")
        for key, p in summary.items():
            print(f"  {key:>5}: p50 {p['p50_ms']:.2f} / p99 {p['p99_ms']:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
