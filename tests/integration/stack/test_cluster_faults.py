"""The whole pipeline on the 3-node cluster while brokers die: nothing accepted is lost.

`SESSIONSTREAM_KAFKA_BROKERS=3` profile (RF 3, `min.insync.replicas=2`, transaction log RF
3): processor, sink and two reference-agent workers under a paced load
(`SESSIONSTREAM_CLUSTER_RATE`, default 100 commands/s: see `RATE`), while rounds of faults
hit the brokers, as Kafka's own `transactions_test.py` does: kill -9 of the node leading a
commands/events partition, kill -9 of the node that coordinates the transactions of one of
the processor's two producers, in turn (each restarted once the pipeline has recovered
without it), and clean restarts. Then the fault suite's contract
(`faults.assert_consistent`): every acknowledged command has its outcome, every run ends,
no duplicate or gap in (session, run, seq), at most one active run per session at every
point of the log, the state table is the fold of the log, PostgreSQL equals the log.

Each round's recovery is recorded: from the fault until the processor has committed past
its position at the fault on every partition of the commands topic (it decides again
everywhere), and until the node is back in every in-sync replica set. The numbers go to
`bench/results/cluster-faults.md`. The short form (one kill -9 of a leader, one of the
transaction coordinator) runs in `make test` (about 3 minutes here); `make soak`
(`SESSIONSTREAM_SOAK=1`) runs three rounds of each kill and a rolling restart of all three
nodes.
`SESSIONSTREAM_HOLD_ON_FAILURE=<seconds>` keeps the processes and topics of a failed run
that long (or until `.hold-release` exists in the repository) for inspection.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from sessionstream.adapters.kafka import log_bounds, read_topic
from sessionstream.adapters.postgres.migrate import migrate
from sessionstream.adapters.registry import reader_codec
from sessionstream.core.partitioning import partition_for
from sessionstream.errors import KafkaUnavailable
from sessionstream.runtimes.processor.loop import transactional_ids
from sessionstream.settings import Settings, get_settings
from tests.integration.faults import SOAK, Load, Pipeline, Verifier, assert_consistent
from tests.integration.helpers import check_log, fold_log, wait_until
from tests.integration.stack_profiles import (
    REPO,
    Profile,
    isr_full,
    partitions,
    running,
    stack,
    txn_coordinator,
)
from tests.integration.worlds import isolated_world

pytestmark = pytest.mark.integration

#: commands/s offered (SESSIONSTREAM_CLUSTER_RATE): the issue asks 1,000; on two cores the
#: three nodes, the pipeline and the checks fall behind at 1,000 (tens of thousands of
#: commands behind before the first fault) and at 300 (every round waits out a backlog)
RATE = float(os.environ.get("SESSIONSTREAM_CLUSTER_RATE", "100"))
ROUNDS = 3 if SOAK else 1
RESULTS = REPO / "bench" / "results" / "cluster-faults.md"
#: the workers' lease: the default (30 s). A lease must outlast a broker failover plus the
#: pipeline's delay under load, or every holder self-fences during the fault and the runs
#: ping-pong between workers (measured with 5 s on this machine: generations up to 32)
LEASE_MS = 30_000
#: after the load: the runs in flight and the tasks queued behind them (up to 32 a
#: session) end; a run stuck on a lost timer or lease never would
SETTLE_S = float(os.environ.get("SESSIONSTREAM_CLUSTER_SETTLE_S", "600"))
#: how long the pipeline may take to decide again after a fault. After a leader kill
#: librdkafka can leave a transaction's commit stuck (librdkafka#5456): the processor gives
#: that producer up after SEND_OFFSETS_LIMIT_S + COMMIT_LIMIT_S (60 s) and a new one takes
#: its transactional id, so that path alone is 60 s plus the renewal (seen in CI: an abort,
#: the consumer fenced and renewed, then a stuck commit; not yet deciding at 90 s)
RECOVERY_LIMIT_S = 150.0
#: ... and a restarted node to be back in every ISR: its JVM starts on a CPU the other two
#: nodes and the pipeline keep busy (measured 26-88 s here; ~5 s on an idle machine)
REJOIN_LIMIT_S = 240.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Profile]:
    with running("cluster") as profile:
        yield profile


@pytest.fixture
def iso(cluster: Profile, settings: Settings, database_url: str) -> Iterator[Settings]:
    base = settings.model_copy(
        update={"kafka_bootstrap": cluster.bootstrap, "replication_factor": 3}
    )
    with isolated_world(base, "cluster-faults") as s:
        migrate(database_url)  # the workers' action executor writes to the default schema
        yield s


class Progress(threading.Thread):
    """Samples the processor group's committed offsets on the commands topic (5 per s)."""

    def __init__(self, s: Settings) -> None:
        super().__init__(name="cluster-progress", daemon=True)
        self.s = s
        self.halt = threading.Event()
        self.latest: dict[int, int] = {}
        self.lock = threading.Lock()

    def run(self) -> None:
        c = Consumer(
            {
                "bootstrap.servers": self.s.kafka_bootstrap,
                "group.id": self.s.processor_group,
                "enable.auto.commit": False,
            }
        )
        tps = [TopicPartition(self.s.commands_topic, p) for p in range(self.s.partitions)]
        try:
            while not self.halt.is_set():
                try:
                    got = {tp.partition: tp.offset for tp in c.committed(tps, timeout=5)}
                except Exception:  # the coordinator is moving: ask again
                    got = {}
                if got:
                    with self.lock:
                        for p, o in got.items():
                            self.latest[p] = max(o, self.latest.get(p, -1))
                self.halt.wait(0.2)
        finally:
            c.close()

    def positions(self) -> dict[int, int]:
        with self.lock:
            return dict(self.latest)


def _recovered(progress: Progress, since: dict[int, int], pipe: Pipeline) -> bool:
    """The processor committed past `since` on every commands partition."""
    pipe.assert_alive()
    now = progress.positions()
    return all(now.get(p, -1) > o for p, o in since.items())


def _inputs(s: Settings, load: Load) -> str:
    """What the processor had to decide: the commands partitions' ends, and the load's
    commands not yet acknowledged per partition (a partition with nothing new to decide is
    a stuck producer, not a stuck processor)."""
    try:
        bounds = log_bounds(s, [(s.commands_topic, p) for p in range(s.partitions)], timeout=5)
        ends: object = {p: end for (_t, p), (_low, end) in bounds.items()}
    except KafkaUnavailable as e:  # the diagnosis goes on without them
        ends = repr(e)
    waiting: dict[int, int] = {}
    for h in list(load.handles):
        if not h.acked and h.error is None:
            p = partition_for(h.command.session_id.encode(), s.partitions)
            waiting[p] = waiting.get(p, 0) + 1
    errors = [h.error for h in list(load.handles) if h.error is not None]
    return (
        f"commands topic ends {ends}; the load's unacknowledged commands by partition "
        f"{waiting}, delivery errors {len(errors)} {errors[:3]}"
    )


def _leader_of_commands(admin: AdminClient, s: Settings) -> int:
    """The node leading partition 0 of the commands topic (and, usually, others)."""
    return partitions(admin, s.commands_topic)[0][0]


def _layout(admin: AdminClient, s: Settings) -> dict[str, object]:
    """(leader, in-sync replicas) per partition of the commands and events topics."""
    out: dict[str, object] = {}
    for t in (s.commands_topic, s.events_topic):
        try:
            out[t] = {p: (lead, isr) for p, (lead, _, isr) in partitions(admin, t).items()}
        except Exception as e:  # a diagnostic only
            out[t] = repr(e)
    return out


def _all_in_sync(admin: AdminClient, s: Settings) -> bool:
    topics = [s.commands_topic, s.worker_commands_topic, s.events_topic, s.state_topic]
    return all(isr_full(admin, t, 3) for t in topics)


def _round(
    what: str,
    node: int,
    fault: str,
    pipe: Pipeline,
    progress: Progress,
    admin: AdminClient,
    load: Load,
) -> dict[str, object]:
    """One fault: `fault` (kill-node / stop-node) on `node`, the pipeline's recovery
    without it, the node started again and back in every ISR."""
    s = pipe.s
    # a fault on a full cluster: every replica in sync before the next node goes
    wait_until(
        lambda: _all_in_sync(admin, s), timeout=REJOIN_LIMIT_S, interval=0.5, what="full ISRs"
    )
    before = _layout(admin, s)
    since = progress.positions()
    assert since, "no committed position of the processor yet"
    t0 = time.monotonic()
    stack("cluster", fault, str(node))
    try:
        wait_until(
            lambda: _recovered(progress, since, pipe),
            timeout=RECOVERY_LIMIT_S,
            interval=0.1,
            what=f"the processor deciding again after {fault} {node} ({what})",
        )
    except AssertionError as e:
        assert pipe.proc is not None
        raise AssertionError(
            f"{e}; committed at the fault {since}, now {progress.positions()}; "
            f"(leader, isr) before {before}, now {_layout(admin, s)}; "
            f"{_inputs(s, load)}; processor log:\n" + pipe.proc.log_text()[-4000:]
        ) from None
    recovered = time.monotonic() - t0
    t1 = time.monotonic()
    stack("cluster", "start-node", str(node), wait_s=REJOIN_LIMIT_S)
    wait_until(
        lambda: _all_in_sync(admin, s),
        timeout=REJOIN_LIMIT_S,
        interval=0.5,
        what=f"node {node} back in every ISR",
    )
    row: dict[str, object] = {
        "round": what,
        "node": node,
        "fault": fault,
        "decides_again_s": round(recovered, 2),
        "rejoined_s": round(time.monotonic() - t1, 2),
    }
    print("cluster fault:", row)
    return row


@pytest.fixture
def pipe(iso: Settings) -> Iterator[Pipeline]:
    p = Pipeline(iso, workers=2, lease_ms=LEASE_MS)
    yield p
    p.stop()


@pytest.mark.timeout(3600 if SOAK else 1500)
def test_the_pipeline_loses_nothing_while_brokers_die(
    cluster: Profile, iso: Settings, pipe: Pipeline
) -> None:
    assert cluster.nodes == 3
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    load = Load(iso, int(RATE * 3600), sessions=200, rate=RATE)
    verifier = Verifier(iso, interval=5.0)
    progress = Progress(iso)
    rows: list[dict[str, object]] = []
    started = time.monotonic()
    try:
        pipe.start()
        # the processor's two producers take turns: the rounds alternate between the
        # coordinators of their ids, the second (`...#1`) first
        txn_ids = transactional_ids(iso.processor_group, "fault-p")[::-1]
        verifier.start()
        progress.start()
        load.start()
        # under way: the processor has committed on every partition
        wait_until(
            lambda: len([o for o in progress.positions().values() if o > 0]) == iso.partitions,
            timeout=90,
            what="the processor committing on every partition",
        )
        for r in range(ROUNDS):
            leader = _leader_of_commands(admin, iso)
            rows.append(
                _round(f"{r + 1}: leader", leader, "kill-node", pipe, progress, admin, load)
            )
            coordinator = txn_coordinator(admin, txn_ids[r % len(txn_ids)])
            rows.append(
                _round(
                    f"{r + 1}: coordinator", coordinator, "kill-node", pipe, progress, admin, load
                )
            )
        # clean restarts, of every node in turn: soak only (the short form's time goes to
        # the kills, which is where the defects were; a stopped node hands its leaderships
        # over before it goes)
        for node in (1, 2, 3) if SOAK else ():
            rows.append(_round("clean restart", node, "stop-node", pipe, progress, admin, load))
        assert load.error is None, load.error
    except BaseException:
        # a failed round: no helper thread outlives the test (they would poll a cluster
        # that is stopped next, beside the rest of the suite)
        progress.halt.set()
        verifier.halt.set()
        raise
    finally:
        load.halt.set()
        load.join(120)
    faults_s = time.monotonic() - started
    try:
        counts = assert_consistent(iso, pipe, load, verifier, settle_s=SETTLE_S)
    except AssertionError as e:
        try:
            diagnosis = _diagnosis(pipe)
        except Exception as d:  # the cluster may still be moving leaders
            diagnosis = f"(no diagnosis: {d!r})"
        hold = float(os.environ.get("SESSIONSTREAM_HOLD_ON_FAILURE", "0"))
        if hold:
            print(f"{e}\n{diagnosis}\nHOLDING the world {hold:.0f} s", flush=True)
            release = REPO / ".hold-release"
            deadline = time.monotonic() + hold
            while time.monotonic() < deadline and not release.exists():
                time.sleep(1)
        raise AssertionError(f"{e}\n{diagnosis}") from None
    finally:
        progress.halt.set()
    counts["rate_achieved"] = round(load.n / faults_s)
    print("cluster faults:", counts)
    _write_results(rows, counts, faults_s)


def _diagnosis(pipe: Pipeline) -> str:
    """Where the processor is on each input topic, every session whose run did not end
    (its events, timers and worker commands), and the tails of the process logs."""
    s = pipe.s
    try:
        open_runs = _explain_open_runs(pipe)
    except Exception as e:  # the cluster may still be moving leaders
        open_runs = f"(no open-run diagnosis: {e!r})"
    c = Consumer({"bootstrap.servers": s.kafka_bootstrap, "group.id": s.processor_group})
    lines = []
    try:
        for t in (s.commands_topic, s.worker_commands_topic, s.timers_topic):
            tps = [TopicPartition(t, p) for p in range(s.partitions)]
            done = {tp.partition: tp.offset for tp in c.committed(tps, timeout=10)}
            ends = {p: c.get_watermark_offsets(TopicPartition(t, p), timeout=10)[1] for p in done}
            lines.append(f"{t}: committed {done}, ends {ends}")
    finally:
        c.close()
    # an open transaction holds a partition's last stable offset below its end
    for iso in ("read_committed", "read_uncommitted"):
        c = Consumer(
            {
                "bootstrap.servers": s.kafka_bootstrap,
                "group.id": s.processor_group,
                "isolation.level": iso,
            }
        )
        try:
            for t in (s.events_topic, s.state_topic, s.timers_topic):
                tps = [TopicPartition(t, p) for p in range(s.partitions)]
                high = {tp.partition: c.get_watermark_offsets(tp, timeout=10)[1] for tp in tps}
                lines.append(f"{t} {iso} end: {high}")
        finally:
            c.close()
    lines.append(open_runs)
    for proc in pipe.current:
        lines.append(f"--- {' '.join(proc.args[:3])}:\n{proc.log_text()[-2500:]}")
    return "\n".join(lines)


def _explain_open_runs(pipe: Pipeline, most: int = 3) -> str:
    """For up to `most` sessions with a run still active: the tail of its events, the
    timers fired for it and its worker commands (offset, append time, outcome), and the
    process log lines that name it."""
    s, codec = pipe.s, reader_codec(get_settings())
    events = read_topic(s, s.events_topic, timeout=30)
    folded = fold_log(events)
    stuck = [st for st in folded.values() if st.active is not None][:most]
    if not stuck:
        return "no run is active now"
    timers = read_topic(s, s.timers_topic, timeout=30)
    worker = read_topic(s, s.worker_commands_topic, timeout=30)
    outcomes = check_log(events).outcomes
    out = []
    for st in stuck:
        sid = st.session_id
        key = sid.encode()
        assert st.active is not None
        a = st.active
        out.append(
            f"=== {sid} (partition {partition_for(key, s.partitions)}): run {a.run_id} "
            f"{a.status} gen {a.generation} holder {a.lease_owner} until {a.lease_expires_at}"
        )
        for r in [r for r in events if r.key and r.key.startswith(key + b"/")][-12:]:
            assert r.value is not None
            e = codec.decode_event(r.value)
            out.append(
                f"  event @{r.offset} t={r.timestamp} {e.type} {e.run_id}#{e.seq} gen "
                f"{e.generation} cmd {e.command_id} ts {e.ts}"
            )
        for name, recs in (("timer", timers), ("worker", worker)):
            for r in [r for r in recs if r.key == key][-8:]:
                assert r.value is not None
                c = codec.decode_command(r.value)
                got = [e.type for e in outcomes.get(c.command_id, [])]
                out.append(
                    f"  {name} @{r.offset} t={r.timestamp} {c.type} {c.command_id} gen "
                    f"{c.generation} worker {c.worker_id} -> {got}"
                )
        for proc in pipe.current:
            named = [ln for ln in proc.log_text().splitlines() if sid in ln or a.run_id in ln][-6:]
            if named:
                out.append(f"  log {' '.join(proc.args[:3])}: " + "\n    ".join(named))
    return "\n".join(out)


def _write_results(rows: list[dict[str, object]], counts: dict[str, int], seconds: float) -> None:
    """Recovery per round, appended to bench/results/cluster-faults.md (newest first)."""
    load1, load5, _ = os.getloadavg()
    head = (
        f"## {datetime.now(UTC):%Y-%m-%d %H:%M} UTC — {'soak' if SOAK else 'short'} run, "
        f"{counts['commands']:,} commands at {RATE:,.0f}/s offered "
        f"({counts['rate_achieved']:,}/s sent) over {seconds:.0f} s; load average "
        f"{load1:.2f} / {load5:.2f} (1 / 5 min)\n\n"
        "| round | node | fault | decides again after | back in every ISR after |\n"
        "|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {r['round']} | {r['node']} | {r['fault']} | {r['decides_again_s']} s "
        f"| {r['rejoined_s']} s |\n"
        for r in rows
    )
    tail = (
        f"\nContract held: {counts['commands']:,} acknowledged commands, all with outcomes; "
        f"{counts['events']:,} events, {counts['runs']:,} runs, {counts['rows']:,} rows in "
        "PostgreSQL equal to the log; no duplicate or gap; at most one active run per session. "
        f"Counts: `{json.dumps(counts, sort_keys=True)}`\n\n"
    )
    title = "# Cluster faults (tests/integration/stack/test_cluster_faults.py)\n\n"
    intro = (
        "Three KRaft nodes on loopback (`SESSIONSTREAM_KAFKA_BROKERS=3`: RF 3, "
        "min.insync.replicas 2, transaction log RF 3 / min ISR 2, broker session timeout "
        "5 s), processor + sink + 2 reference workers (30 s leases), one 2-core machine "
        "for all of it. *Decides again*: "
        "from the fault until the processor committed past its position at the fault on "
        "every commands partition. *Back in every ISR*: from `start-node` until the node "
        "is in-sync again on the commands, worker-commands, events and state topics "
        "(nearly all of it is the JVM starting on a CPU the other nodes keep busy). A "
        "failed run writes nothing here; its diagnosis is in the test's output.\n\n"
    )
    old = RESULTS.read_text() if RESULTS.exists() else ""
    # the last few runs stay, each ending in one blank line
    earlier = ["## " + r.rstrip("\n") + "\n\n" for r in old.split("\n## ")[1:]][:8]
    RESULTS.write_text((title + intro + head + body + tail + "".join(earlier)).rstrip("\n") + "\n")
