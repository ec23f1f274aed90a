"""The topics of the protocol: their settings, creation, and the checks made at startup.

| topic            | key                         | cleanup | why                                   |
|------------------|-----------------------------|---------|---------------------------------------|
| session.commands | session_id                  | delete  | input; long retention                 |
| session.events   | session/run/seq (unique)    | compact | the log: compaction only drops copies |
| session.state    | session_id                  | compact | the processor's state changelog       |
| session.outcomes | session_id/command_id       | compact,delete | an outcome per command, 7 days |
| session.open-runs| session_id                  | compact | runs that need a holder (workers)     |
| session.workers  | worker id                   | compact,delete | worker presence                |
| session.dlq      | the original key            | delete  | dead letters with their bytes         |

Commands, events and state must have the same partition count: a session's events and
state live on the partition number of its commands.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from sessionstream.adapters.kafka import client_config
from sessionstream.adapters.kafka.errors import unavailable
from sessionstream.core.decider import DEFAULT_CONFIG
from sessionstream.errors import KafkaUnavailable, TopicMisconfigured
from sessionstream.schemas.commands import (
    ADMIN_COMMAND_TYPES,
    TIMER_COMMAND_TYPES,
    WORKER_COMMAND_TYPES,
)
from sessionstream.settings import Settings

__all__ = [
    "TopicReport",
    "TopicSpec",
    "align_topics",
    "check_topics",
    "command_topic",
    "ensure_topics",
    "topic_ids",
    "topic_specs",
]


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]
    #: must have the same partition count as the commands topic
    co_partitioned: bool = True
    #: set when the topic is created (and by `--align`), not checked: a topic of an
    #: earlier version without it still works
    preferred: dict[str, str] = field(default_factory=dict)


#: how long the log cleaner may leave a superseded record of a compacted topic (an erased
#: session's, behind its tombstone or a later record) once its segment is closed
ERASURE_LAG_MS = 24 * 3600 * 1000


def topic_specs(settings: Settings) -> list[TopicSpec]:
    n = settings.partitions
    within_a_day = {"max.compaction.lag.ms": str(ERASURE_LAG_MS)}
    commands = {
        "cleanup.policy": "delete",
        "retention.ms": str(7 * 24 * 3600 * 1000),
        "max.message.bytes": str(2 * 1024 * 1024),
        # the decider's clock: the broker stamps every command as it appends it
        "message.timestamp.type": "LogAppendTime",
    }
    return [
        # the three input topics, one per command class, placed alike (murmur2 over the
        # session id, same partition count): one processor owns partition p of all three
        TopicSpec(settings.commands_topic, n, commands),
        TopicSpec(settings.worker_commands_topic, n, dict(commands)),
        TopicSpec(settings.timers_topic, n, dict(commands)),
        TopicSpec(
            settings.events_topic,
            n,
            {
                "cleanup.policy": "compact",
                "min.compaction.lag.ms": "60000",
                "max.message.bytes": str(2 * 1024 * 1024),
            },
            # replay by time: the broker's append time, monotonic per partition; an erased
            # session's records leave the log within a day of their tombstones (the cleaner
            # never compacts the active segment: this rolls it)
            preferred={"message.timestamp.type": "LogAppendTime", **within_a_day},
        ),
        # one record per session matters; compact often so a restore reads little. Sized
        # to the largest state the decider's bounds allow (sessionstream.core.step)
        TopicSpec(
            settings.state_topic,
            n,
            {
                "cleanup.policy": "compact",
                "segment.ms": "60000",
                "min.cleanable.dirty.ratio": "0.1",
                "max.message.bytes": str(4 * 1024 * 1024),
            },
            # an erased session's earlier states go within a day, however few sessions
            # change (the dirty ratio alone may not be reached for a long time)
            preferred=dict(within_a_day),
        ),
        # one record per command read; unique keys (compaction only drops re-emitted copies),
        # kept longer than twice the dedup window (24 h): a duplicate's first outcome is
        # still there, and the processor restores its dedup store from these records
        TopicSpec(
            settings.outcomes_topic,
            n,
            {
                "cleanup.policy": "compact,delete",
                "retention.ms": str(7 * 24 * 3600 * 1000),
                "min.compaction.lag.ms": "60000",
                "max.message.bytes": str(2 * 1024 * 1024),
            },
            preferred={"message.timestamp.type": "LogAppendTime"},
        ),
        # small: one record per session whose run waits for a holder; every worker reads all
        TopicSpec(
            settings.open_runs_topic,
            n,
            {
                "cleanup.policy": "compact",
                "segment.ms": "60000",
                "min.cleanable.dirty.ratio": "0.1",
                "delete.retention.ms": "60000",
                "max.message.bytes": str(2 * 1024 * 1024),
            },
            preferred=dict(within_a_day),
        ),
        # token deltas: a short-lived view of streaming answers, written outside any
        # transaction; on the session's partition like its events
        TopicSpec(
            settings.deltas_topic,
            n,
            {
                "cleanup.policy": "delete",
                "retention.ms": str(settings.deltas_retention_ms),
                "segment.ms": str(min(settings.deltas_retention_ms, 3600 * 1000)),
                "max.message.bytes": str(1024 * 1024),
            },
        ),
        # presence: the broker stamps it (workers judge liveness by it), dead workers' last
        # records are deleted after an hour
        TopicSpec(
            settings.workers_topic,
            1,
            {
                "cleanup.policy": "compact,delete",
                "retention.ms": str(3600 * 1000),
                "segment.ms": "60000",
                "min.cleanable.dirty.ratio": "0.1",
                "message.timestamp.type": "LogAppendTime",
            },
            co_partitioned=False,
        ),
        TopicSpec(
            settings.dlq_topic,
            1,
            {
                "cleanup.policy": "delete",
                "retention.ms": str(30 * 24 * 3600 * 1000),
                "max.message.bytes": str(4 * 1024 * 1024),
            },
            co_partitioned=False,
        ),
    ]


def command_topic(settings: Settings, command_type: str) -> str:
    """The topic a command of `command_type` is written to: workers' commands to the
    worker-commands topic, an administrator's (`session.erase`) to the control topic (the
    timers topic: only the processor and administrators may write it), everything else to
    the commands topic (a `timer.fired` sent there is rejected `not_allowed_here`: only the
    processor fires timers)."""
    if command_type in WORKER_COMMAND_TYPES:
        return settings.worker_commands_topic
    if command_type in ADMIN_COMMAND_TYPES and command_type not in TIMER_COMMAND_TYPES:
        return settings.timers_topic
    return settings.commands_topic


def _admin(settings: Settings) -> AdminClient:
    return AdminClient(client_config(settings))


def topic_ids(
    settings: Settings, topics: list[str], timeout: float = 30.0, *, missing_ok: bool = False
) -> dict[str, str]:
    """Each topic's id: a topic deleted and created again under its name has a new one.
    With `missing_ok`, a topic that does not exist is left out instead of raising."""

    admin = _admin(settings)
    out: dict[str, str] = {}
    for name, fut in admin.describe_topics(
        TopicCollection(topics), request_timeout=timeout
    ).items():
        try:
            out[name] = str(fut.result(timeout=timeout).topic_id)
        except KafkaException as e:
            if missing_ok and e.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                continue
            raise KafkaUnavailable(
                f"describing topic {name}: {e.args[0]}", bootstrap=settings.kafka_bootstrap
            ) from e
    return out


def ensure_topics(settings: Settings, timeout: float = 30.0) -> list[str]:
    """Create the missing topics; returns the names created. Existing ones are not altered."""
    admin = _admin(settings)
    try:
        existing = set(admin.list_topics(timeout=timeout).topics)
    except KafkaException as e:
        raise KafkaUnavailable(
            f"cannot list topics: {e}", bootstrap=settings.kafka_bootstrap
        ) from e
    new = [
        NewTopic(
            s.name, s.partitions, settings.replication_factor, config={**s.config, **s.preferred}
        )
        for s in topic_specs(settings)
        if s.name not in existing
    ]
    created = []
    if new:
        for name, fut in admin.create_topics(new, operation_timeout=timeout).items():
            try:
                fut.result()
                created.append(name)
            except KafkaException as e:
                if e.args[0].code() != 36:  # TOPIC_ALREADY_EXISTS: another process won the race
                    raise unavailable(f"cannot create topic {name}", e, settings) from e
    if created:
        _wait_for_leaders(admin, created, timeout)
    return created


#: the settings `check_topics` requires, which `align_topics` may set on existing topics
_REQUIRED = ("cleanup.policy", "message.timestamp.type", "max.message.bytes")


def align_topics(settings: Settings, timeout: float = 30.0) -> dict[str, dict[str, str]]:
    """Set the protocol's required settings on topics that exist with others (an upgrade, a
    topic made by hand); returns what was changed, per topic. Never run implicitly: the
    processor refuses misconfigured topics, `sessionstream topics create --align` fixes them."""
    try:
        return _align(settings, timeout)
    except KafkaException as e:
        raise unavailable("cannot align the topics' settings", e, settings) from e


def _align(settings: Settings, timeout: float) -> dict[str, dict[str, str]]:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry

    admin = _admin(settings)
    existing = set(admin.list_topics(timeout=timeout).topics)
    specs = [sp for sp in topic_specs(settings) if sp.name in existing]
    res = [ConfigResource(ConfigResource.Type.TOPIC, sp.name) for sp in specs]
    current = {
        r.name: {k: v.value for k, v in f.result().items()}
        for r, f in admin.describe_configs(res).items()
    }
    changed: dict[str, dict[str, str]] = {}
    for sp in specs:
        todo = {}
        for key in _REQUIRED:
            want = sp.config.get(key)
            if want is None:
                continue
            try:
                _check_config(TopicSpec(sp.name, sp.partitions, {key: want}), current[sp.name])
            except TopicMisconfigured:
                todo[key] = want
        for key, want in sp.preferred.items():
            if current[sp.name].get(key) != want:
                todo[key] = want
        if not todo:
            continue
        entries = [
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in todo.items()
        ]
        resource = ConfigResource(ConfigResource.Type.TOPIC, sp.name, incremental_configs=entries)
        for fut in admin.incremental_alter_configs([resource]).values():
            fut.result(timeout)
        changed[sp.name] = todo
    return changed


def _wait_for_leaders(admin: AdminClient, topics: list[str], timeout: float) -> None:
    """New topics answer requests only once every partition has a leader."""
    deadline = time.monotonic() + timeout
    while True:
        meta = admin.list_topics(timeout=timeout)
        ready = all(
            t in meta.topics
            and meta.topics[t].error is None
            and all(p.leader >= 0 for p in meta.topics[t].partitions.values())
            for t in topics
        )
        if ready:
            return
        if time.monotonic() > deadline:
            raise KafkaUnavailable(f"topics {topics} have no leader after {timeout}s", bootstrap="")
        time.sleep(0.1)


#: how long `check_topics` asks again for a topic the metadata it got does not list
MISSING_GRACE_S = 5.0

#: UNKNOWN_TOPIC_OR_PART: from a broker whose metadata has not caught up with a new topic
_UNKNOWN_TOPIC = 3


def _describe_topics(
    admin: AdminClient, names: list[str], timeout: float
) -> dict[str, dict[str, str]]:
    """The topics' effective configs. On a cluster, a topic just created (listed by the
    broker that answered the metadata request) may be unknown for a moment to the broker
    asked for its configs: asked again until `timeout`."""
    deadline = time.monotonic() + timeout
    configs: dict[str, dict[str, str]] = {}
    todo = list(names)
    while todo:
        resources = [ConfigResource(ConfigResource.Type.TOPIC, n) for n in todo]
        retry = []
        for res, fut in admin.describe_configs(resources, request_timeout=timeout).items():
            try:
                configs[res.name] = {k: v.value for k, v in fut.result().items()}
            except KafkaException as e:
                if e.args[0].code() != _UNKNOWN_TOPIC or time.monotonic() > deadline:
                    raise
                retry.append(res.name)
        todo = retry
        if todo:
            time.sleep(0.1)
    return configs


@dataclass(frozen=True)
class TopicReport:
    """What `check_topics` found: partition counts and effective configs per topic."""

    partitions: dict[str, int]
    configs: dict[str, dict[str, str]]


def check_topics(
    settings: Settings, timeout: float = 30.0, *, dedup_ttl_ms: int = DEFAULT_CONFIG.dedup_ttl_ms
) -> TopicReport:
    """Verify the protocol's invariants; raise `TopicMisconfigured` naming the problem.
    `dedup_ttl_ms`: the decider's dedup window, which the outcomes topic's retention must
    cover twice (a full restore of the processor's dedup records reads that far back)."""
    admin = _admin(settings)
    specs = topic_specs(settings)
    # on a cluster, a topic just created (ensure_topics waited for its leaders, as one
    # broker saw them) can be missing from another broker's metadata for a moment: seen on
    # the 3-node cluster right after its start. A topic still missing after MISSING_GRACE_S
    # is missing
    grace = time.monotonic() + min(timeout, MISSING_GRACE_S)
    while True:
        try:
            meta = admin.list_topics(timeout=timeout)
        except KafkaException as e:
            raise KafkaUnavailable(
                f"cannot list topics: {e}", bootstrap=settings.kafka_bootstrap
            ) from e
        missing = [s.name for s in specs if s.name not in meta.topics]
        if not missing:
            break
        if time.monotonic() > grace:
            raise TopicMisconfigured(missing[0], "missing (run `sessionstream topics create`)")
        time.sleep(0.2)
    counts = {s.name: len(meta.topics[s.name].partitions) for s in specs if s.co_partitioned}
    if len(set(counts.values())) != 1:
        expected = counts[settings.commands_topic]
        odd = next(k for k, v in counts.items() if v != expected)
        raise TopicMisconfigured(
            odd,
            "partition counts differ: "
            + ", ".join(f"{k}={v}" for k, v in counts.items())
            + " — a session's events and state must sit on its commands' partition number",
        )
    try:
        configs = _describe_topics(admin, [s.name for s in specs], timeout)
    except KafkaException as e:
        raise unavailable("cannot read the topics' configs", e, settings) from e
    for spec in specs:
        _check_config(spec, configs[spec.name])
    _check_outcomes_retention(
        settings.outcomes_topic, configs[settings.outcomes_topic], dedup_ttl_ms
    )
    partitions = {s.name: len(meta.topics[s.name].partitions) for s in specs}
    return TopicReport(partitions=partitions, configs=configs)


#: why each required setting matters, for the error that names it
_WHY = {
    "cleanup.policy": "compaction/deletion is part of the protocol (events are keyed uniquely; "
    "'delete' would lose history; state and open runs must keep the latest per key)",
    "message.timestamp.type": "the decider's clock is the broker's append time, never a producer's",
    "max.message.bytes": "the decider's bounds size the records to it; a smaller limit fails "
    "whole transactions",
}


def _check_config(spec: TopicSpec, actual: dict[str, str]) -> None:
    """The settings the protocol relies on, as `topic_specs` creates them."""
    for key in ("cleanup.policy", "message.timestamp.type", "max.message.bytes"):
        want = spec.config.get(key)
        if want is None:
            continue
        got = actual.get(key, "")
        if key == "max.message.bytes":
            ok = got.isdigit() and int(got) >= int(want)
        elif key == "cleanup.policy":
            ok = set(got.split(",")) == set(want.split(","))
        else:
            ok = got == want
        if not ok:
            raise TopicMisconfigured(
                spec.name,
                f"{key} is {got!r}, must be {'at least ' if key == 'max.message.bytes' else ''}"
                f"{want!r}: {_WHY[key]} (kafka-configs --alter --entity-type topics "
                f"--entity-name {spec.name} --add-config {key}={want})",
            )


def _check_outcomes_retention(topic: str, actual: dict[str, str], dedup_ttl_ms: int) -> None:
    """The outcome records are the only copy of the processor's dedup records in Kafka: a
    full restore reads the last two dedup windows of them. A shorter retention would let a
    restored processor decide a retried command a second time."""
    need = 2 * dedup_ttl_ms
    got = actual.get("retention.ms", "")
    try:
        ms = int(got)
    except ValueError:
        ms = None
    if ms is not None and (ms < 0 or ms >= need):
        return
    raise TopicMisconfigured(
        topic,
        f"retention.ms is {got!r}, must be at least {need} (twice the dedup window of "
        f"{dedup_ttl_ms} ms): a restore of the processor's dedup records reads that far back, "
        "and a command retried after a shorter retention would be decided again "
        f"(kafka-configs --alter --entity-type topics --entity-name {topic} "
        f"--add-config retention.ms={7 * 24 * 3600 * 1000})",
    )
