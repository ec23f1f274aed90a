"""The baselines of `bench_baselines.py`: what sessionstream is measured against.

* Ceiling: a raw confluent-kafka transactional consume -> produce pass-through, no logic,
  the limit for our processor.
* Baseline A, the seed's anti-pattern: the session as one JSONB document, read-modify-write
  (`select doc`, append in Python, `update`) under read committed, no row lock.
* Baseline B, the seed's SQL design without Kafka: per command one transaction that locks the
  session's state row (`select ... for update`), decides with OUR pure decider
  (`sessionstream.core.decider.apply`), appends the events and projects `agent_runs` /
  `agent_sessions`
  with the sink's own statements (so the partial unique index is the backstop), and stores the
  new state — the same semantics and the same rows, without the log.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg.types.json import Jsonb

from bench._harness import percentiles
from bench._sink_harness import connect, delete_groups, fresh_schema
from sessionstream.adapters.kafka import (
    LIVE_FETCH_WAIT_MS,
    client_config,
    command_producer_config,
    reader_config,
    take,
    transactional_producer_config,
)
from sessionstream.core.decider import apply
from sessionstream.core.step import decode_state, encode_state
from sessionstream.runtimes.sink.writer import (
    PendingEvent,
    _insert_events,
    _load,
    _write_projection,
)
from sessionstream.schemas.commands import Command
from sessionstream.settings import Settings

now = time.perf_counter
Conn = psycopg.Connection[tuple[Any, ...]]


def split(commands: list[Command], writers: int) -> list[list[Command]]:
    """Round-robin shares: every writer works on every session at once."""
    return [commands[i::writers] for i in range(writers)]


def run_writers(
    url: str, schema: str, shares: list[list[Command]], op: Callable[[Conn, Command], None]
) -> tuple[float, list[float], int]:
    """One thread and connection per share, as fast as they go; (seconds, per-command
    seconds, errors). A failed command (serialization, unique violation) counts as an error."""
    lat: list[float] = []
    errors = [0]
    lock = threading.Lock()
    start = threading.Barrier(len(shares) + 1)

    def writer(share: list[Command]) -> None:
        mine: list[float] = []
        with connect(url, schema) as conn:
            start.wait()
            for cmd in share:
                t = now()
                try:
                    op(conn, cmd)
                except psycopg.Error:
                    conn.rollback()
                    with lock:
                        errors[0] += 1
                    continue
                mine.append(now() - t)
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=writer, args=(s,), daemon=True) for s in shares]
    for t in threads:
        t.start()
    start.wait()
    t0 = now()
    for t in threads:
        t.join()
    return now() - t0, lat, errors[0]


# -- ceiling ---------------------------------------------------------------------------------
def passthrough(s: Settings, out_topic: str, n: int, batch_size: int = 500) -> dict[str, Any]:
    """The processor's transaction shape with no logic; timed from its first commit."""
    group = f"bench-ceiling-{uuid.uuid4().hex[:8]}"
    # the processor's own producer settings (transactional_producer_config): the ceiling
    # differs from `sessionstream processor` by the work per record, nothing else
    producer = Producer(transactional_producer_config(s, f"{group}-0"))
    consumer = Consumer(
        client_config(
            s,
            **{
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 10,
                "session.timeout.ms": 6000,
            },
        )
    )
    c0, t_start = os.times(), now()
    producer.init_transactions(60)
    consumer.subscribe([s.commands_topic])
    done = txns = n_first = 0
    t_first = 0.0
    deadline = now() + 120
    while done < n:
        if now() > deadline:
            raise TimeoutError(f"pass-through moved {done} of {n} records in 120 s")
        first = consumer.poll(0.05)
        if first is None:
            continue
        batch = [first, *consumer.consume(batch_size - 1, timeout=0)]
        offsets: dict[int, int] = {}
        producer.begin_transaction()
        for m in batch:
            if m.error() is not None:
                raise KafkaException(m.error())
            p = m.partition()
            assert p is not None
            producer.produce(out_topic, key=m.key(), value=m.value(), partition=p)
            offsets[p] = (m.offset() or 0) + 1
        producer.send_offsets_to_transaction(
            [TopicPartition(s.commands_topic, p, o) for p, o in offsets.items()],
            consumer.consumer_group_metadata(),
        )
        producer.commit_transaction()
        done, txns = done + len(batch), txns + 1
        if not t_first:
            t_first, n_first = now(), done
    secs, c1 = now() - t_first, os.times()
    consumer.close()
    delete_groups(s, [group])
    return {
        "records": n,
        "measured_records": n - n_first,
        "seconds": round(secs, 2),
        "records_per_s": round((n - n_first) / secs),
        "startup_to_first_commit_s": round(t_first - t_start, 2),
        "transactions": txns,
        "avg_batch": round(n / txns, 1),
        "cores": round((c1.user + c1.system - c0.user - c0.system) / (now() - t_start), 2),
    }


#: transaction shapes of `passthrough_latency`: (output topics each record is copied to,
#: whether a record per input follows once those are acknowledged). "raw": one output
#: topic. "outcome": the least a transaction keeping the stream contract needs — the
#: record, then its outcome record, which names the offsets the first got, so it waits
#: for their acknowledgement (a second produce round inside the transaction). "ours": the
#: processor's shape — the events and two changelogs (states, open runs) on the record's
#: partition, then the outcome records (which carry the command ids to remember; decision
#: 0003, eleventh pass). "one-changelog": the same with one changelog topic in place of
#: two (events and a changelog, then the outcome records): what putting the open runs
#: into the states' topic could reach (decision 0003, tenth pass).
SHAPES: dict[str, tuple[int, bool]] = {
    "raw": (1, False),
    "outcome": (1, True),
    "one-changelog": (2, True),
    "ours": (3, True),
}


def passthrough_latency(
    s: Settings, rate: float, seconds: float, warmup: float = 3.0, shape: str = "raw"
) -> dict[str, Any]:
    """The latency ceiling: records paced at `rate`/s through the pass-through above
    (polled the same way, the processor's producer settings, one transaction per poll
    batch) to a `read_committed` reader; produce -> visible, after `warmup`. `shape`
    (`SHAPES`): what each transaction writes besides the input offsets; the reader reads
    the last topic written (the outcome records when there are any). No logic, no
    overlapping of transactions (the processor overlaps two)."""
    k, follow = SHAPES[shape]
    tag = uuid.uuid4().hex[:8]
    t_in, group = f"bench.lat-in.{tag}", f"bench-lat-{tag}"
    outs = [f"bench.lat-out{j}.{tag}" for j in range(k)]
    t_follow = f"bench.lat-outcome.{tag}"
    t_out = t_follow if follow else outs[-1]
    topics = [t_in, *outs] + ([t_follow] if follow else [])
    admin = AdminClient(client_config(s))
    for f in admin.create_topics([NewTopic(t, s.partitions, 1) for t in topics]).values():
        f.result()
    sent: dict[bytes, float] = {}
    seen: dict[bytes, float] = {}
    commit_s: list[float] = []
    halt = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            producer = Producer(transactional_producer_config(s, f"{group}-0"))
            consumer = Consumer(reader_config(s, group_id=group, fetch_wait_ms=LIVE_FETCH_WAIT_MS))
            producer.init_transactions(60)
            consumer.subscribe([t_in])
            while not halt.is_set():
                batch = take(consumer, 500, 0.05)
                if not batch:
                    continue
                offsets: dict[int, int] = {}
                producer.begin_transaction()
                good = []
                for m in batch:
                    p = m.partition()
                    if m.error() is not None:  # e.g. the new topic not yet known
                        if m.error().fatal():
                            raise KafkaException(m.error())
                        continue
                    assert p is not None
                    for t in outs:
                        producer.produce(t, key=m.key(), value=m.value(), partition=p)
                    offsets[p] = (m.offset() or 0) + 1
                    good.append(m)
                t0 = now()
                producer.send_offsets_to_transaction(
                    [TopicPartition(t_in, p, o) for p, o in offsets.items()],
                    consumer.consumer_group_metadata(),
                )
                if follow and good:
                    # as the processor's outcome records: made from the delivery reports
                    producer.flush(30)
                    for m in good:
                        p = m.partition()
                        producer.produce(t_follow, key=m.key(), value=m.value(), partition=p)
                producer.commit_transaction()
                commit_s.append(now() - t0)
            consumer.close()
        except BaseException as e:
            errors.append(e)

    def tail() -> None:
        try:
            consumer = Consumer(reader_config(s, fetch_wait_ms=LIVE_FETCH_WAIT_MS))
            consumer.assign([TopicPartition(t_out, p, 0) for p in range(s.partitions)])
            while not halt.is_set():
                batch = take(consumer, 1000, 0.05)
                t = now()
                for m in batch:
                    if m.error() is None:
                        seen.setdefault(m.value() or b"", t)
            consumer.close()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=f, daemon=True) for f in (loop, tail)]
    for t in threads:
        t.start()
    producer = Producer(command_producer_config(s))
    try:
        start, i = now(), 0
        while now() - start < warmup + seconds and not errors:
            wait = start + i / rate - now()
            if wait > 0:
                time.sleep(wait)
            value = f"{i:09d}".encode()
            sent[value] = now()
            producer.produce(t_in, key=str(i % 1000).encode(), value=value)
            producer.poll(0)
            i += 1
        producer.flush(30)
        cut = start + warmup
        measured = [v for v, t in sent.items() if t >= cut]
        deadline = now() + 30
        while any(v not in seen for v in measured) and now() < deadline and not errors:
            time.sleep(0.05)
    finally:
        halt.set()
        for t in threads:
            t.join(30)
        admin.delete_topics(topics, operation_timeout=30)
        delete_groups(s, [group])
    if errors:
        raise errors[0]
    lat = [seen[v] - sent[v] for v in measured if v in seen]
    return {
        "target_rate": rate,
        "shape": shape,
        "sent": i,
        "measured": len(lat),
        "missing": len(measured) - len(lat),
        **percentiles(lat),
        "transactions": len(commit_s),
        "send_offsets_and_commit_ms": round(1000 * sum(commit_s) / max(len(commit_s), 1), 2),
    }


# -- Baseline A ---------------------------------------------------------------------------------
def doc_schema(url: str, prefix: str, session_ids: set[str]) -> str:
    schema = fresh_schema(url, prefix)
    with connect(url, schema, autocommit=True) as conn:
        conn.execute("create table session_docs (session_id text primary key, doc jsonb)")
        conn.cursor().executemany(
            "insert into session_docs values (%s, %s)",
            [(sid, Jsonb({"events": []})) for sid in sorted(session_ids)],
        )
    return schema


def doc_append(conn: Conn, cmd: Command) -> None:
    """The anti-pattern: read the whole document, append, write it back (no lock)."""
    row = conn.execute(
        "select doc from session_docs where session_id = %s", (cmd.session_id,)
    ).fetchone()
    doc = row[0] if row else {"events": []}
    doc["events"].append(
        {
            "commandId": cmd.command_id,
            "type": cmd.type,
            "ts": cmd.ts,
            "payload": cmd.payload.model_dump(mode="json"),
        }
    )
    conn.execute(
        "update session_docs set doc = %s where session_id = %s", (Jsonb(doc), cmd.session_id)
    )
    conn.commit()


def doc_count(url: str, schema: str) -> tuple[int, int]:
    """(events kept in the documents, document bytes)."""
    with connect(url, schema) as conn:
        row = conn.execute(
            "select coalesce(sum(jsonb_array_length(doc->'events')), 0),"
            " coalesce(sum(pg_column_size(doc)), 0) from session_docs"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


# -- Baseline B ---------------------------------------------------------------------------------
def sql_schema(url: str, prefix: str) -> str:
    """The seed's tables (the sink's migrations) plus the decider's state per session."""
    schema = fresh_schema(url, prefix)
    with connect(url, schema, autocommit=True) as conn:
        conn.execute("create table session_state (session_id text primary key, state bytea)")
    return schema


def sql_decide(conn: Conn, cmd: Command) -> None:
    """One command, one transaction: lock the session, decide, append, project, store."""
    with conn.transaction(), conn.cursor() as cur:
        q = "select state from session_state where session_id = %s for update"
        row = cur.execute(q, (cmd.session_id,)).fetchone()
        if row is None:
            cur.execute(
                "insert into session_state values (%s, null) on conflict do nothing",
                (cmd.session_id,),
            )
            row = cur.execute(q, (cmd.session_id,)).fetchone()
        assert row is not None
        state = decode_state(row[0]) if row[0] is not None else None
        events, new_state = apply(state, cmd)
        if not events:
            return  # a duplicate command id: nothing to write
        batch = [PendingEvent(e, "postgres", 0, 0) for e in events]
        _insert_events(cur, batch, "executemany")
        proj = _load(cur, batch)
        for p in batch:
            proj.apply(p.event)
        _write_projection(cur, proj)
        cur.execute(
            "update session_state set state = %s where session_id = %s",
            (encode_state(new_state), cmd.session_id),
        )


def sql_paced(
    url: str, schema: str, commands: list[Command], writers: int, rate: float
) -> tuple[dict[str, float], list[float], float, int]:
    """Commands offered at `rate`/s to `writers` threads (open loop); per command, the
    scheduled send time -> its transaction committed. Returns (sent time per command id,
    latencies, achieved rate, errors)."""
    q: queue.Queue[tuple[Command, float] | None] = queue.Queue()
    lat: list[float] = []
    errors = [0]
    lock = threading.Lock()

    def writer() -> None:
        with connect(url, schema) as conn:
            while (item := q.get()) is not None:
                cmd, t_sent = item
                try:
                    sql_decide(conn, cmd)
                except psycopg.Error:
                    conn.rollback()
                    with lock:
                        errors[0] += 1
                    continue
                done = now()
                with lock:
                    lat.append(done - t_sent)

    threads = [threading.Thread(target=writer, daemon=True) for _ in range(writers)]
    for t in threads:
        t.start()
    sent: dict[str, float] = {}
    t0 = now()
    for i, cmd in enumerate(commands):
        wait = t0 + i / rate - now()
        if wait > 0:
            time.sleep(wait)
        sent[cmd.command_id] = t_sent = now()
        q.put((cmd, t_sent))
    t_last = now()
    for _ in threads:
        q.put(None)
    for t in threads:
        t.join()
    return sent, lat, (len(commands) - 1) / (t_last - t0), errors[0]


def sql_check(url: str, schema: str) -> dict[str, int]:
    """Rows written and the single-writer backstop: sessions with more than one active run."""
    with connect(url, schema) as conn:
        row = conn.execute(
            "select (select count(*) from agent_run_events),"
            " (select count(distinct command_id) from agent_run_events),"
            " (select count(*) from agent_runs),"
            " (select count(*) from (select session_id from agent_runs where status in"
            "  ('running', 'compacting', 'cancelling') group by 1 having count(*) > 1) x)"
        ).fetchone()
    assert row is not None
    return dict(
        zip(("events", "commands_with_rows", "runs", "double_active"), map(int, row), strict=True)
    )
