"""Who may read and write what: Kafka ACLs and PostgreSQL grants, one set per role.

One Kafka principal (``User:<role>``) and at most one PostgreSQL role per kind of process.
The secured local stack (``SESSIONSTREAM_STACK_SECURE=1 make up``) applies exactly these;
on a real cluster ``python -m sessionstream.adapters.access`` prints them (``--kafka-acls`` as
``kafka-acls.sh`` commands) for an operator to apply. Names come from the settings, so a
deployment with other topic or group names gets ACLs for those.

- `admin`: a Kafka super user (topics, users, ACLs), and the only one besides the processor
  who writes the control topic (`session.timers`: an administrator's `session.erase`);
  `ss_owner` owns the tables (migrate).
- `processor`: reads commands, worker commands and timers; the only writer of events,
  state, the DLQ and timers (and of commands it forwards to their partition), with its
  transactional ids; no database.
- `sink`: reads events, and writes the tombstones of erased sessions' event keys;
  `ss_sink` writes the projection tables and deletes an erased session's rows.
- `worker`: writes worker commands and its presence, reads events and open runs;
  `ss_worker` has only `agent_actions`, `agent_outbox` and `agent_run_fences`.
- `producer` (the SDK, and the gateway): writes commands, reads events and dead letters
  (outcomes); `ss_gateway` reads the projection and `api_keys`.
- `analytics`: reads events, owns its faust app's groups and topics; `ss_reader` reads all.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Literal

from sessionstream.settings import Settings

__all__ = [
    "KAFKA_ROLES",
    "PG_ROLES",
    "DbGrant",
    "Grant",
    "db_grants",
    "kafka_grants",
    "processor_own_topics",
]

#: the Kafka principals of the processes; `admin` (a super user) needs no ACLs
KAFKA_ROLES = ("processor", "sink", "worker", "producer", "analytics")

#: the PostgreSQL role each credentials role logs in as (the processor has none)
PG_ROLES: dict[str, str] = {
    "admin": "ss_owner",
    "sink": "ss_sink",
    "worker": "ss_worker",
    "producer": "ss_gateway",
    "analytics": "ss_reader",
}

#: prefixes of the ad-hoc consumer groups (a uuid follows) and of the analytics app
CLIENT_GROUP_PREFIX = "sessionstream-client-"
WORKER_GROUP_PREFIX = "sessionstream-worker-"
ANALYTICS_PREFIX = "sessionstream-analytics"

Resource = Literal["topic", "group", "transactional_id"]
Pattern = Literal["literal", "prefixed"]
Operation = Literal["READ", "WRITE", "CREATE", "DESCRIBE", "DESCRIBE_CONFIGS"]


@dataclass(frozen=True, order=True)
class Grant:
    """ALLOW ``operation`` on a resource for ``User:<role>``, from any host."""

    role: str
    resource: Resource
    name: str
    pattern: Pattern
    operation: Operation

    @property
    def principal(self) -> str:
        return f"User:{self.role}"


def processor_own_topics(settings: Settings) -> list[str]:
    """Topics only the processor reads and writes besides state: the dedup changelog of
    versions before the outcome records carried the dedup records (read on a full restore
    while it exists) and its fired timers (no one else may write a `timer.fired`; an
    administrator, a super user, writes `session.erase` there)."""
    return [settings.dedup_topic, settings.timers_topic]


def _topic(role: str, name: str, *ops: Operation, pattern: Pattern = "literal") -> list[Grant]:
    return [Grant(role, "topic", name, pattern, op) for op in ops]


def _group(role: str, name: str, op: Operation = "READ", *, prefixed: bool = False) -> Grant:
    return Grant(role, "group", name, "prefixed" if prefixed else "literal", op)


def kafka_grants(settings: Settings) -> dict[str, list[Grant]]:
    """The ACLs of each role in `KAFKA_ROLES`, least privilege for what its code does.

    READ/WRITE imply DESCRIBE on a topic in Kafka; DESCRIBE is still listed where the code
    only needs metadata or offsets, so the list says what each role touches."""
    s = settings
    commands, events, state, dlq = s.commands_topic, s.events_topic, s.state_topic, s.dlq_topic
    worker_commands = s.worker_commands_topic
    group = s.processor_group
    out: dict[str, list[Grant]] = {
        "processor": [
            # input; WRITE for misplaced commands it forwards to their session's partition
            *_topic("processor", commands, "READ", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS"),
            *_topic("processor", worker_commands, "READ", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS"),
            # READ: a state written by an older version is folded again from the log
            *_topic("processor", events, "READ", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS"),
            # READ: the state changelog is restored on assignment
            *_topic("processor", state, "READ", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS"),
            *_topic("processor", dlq, "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS"),
            # one outcome record per command read; READ: its dedup store is restored from
            # them on assignment
            *_topic("processor", s.outcomes_topic, "READ", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS"),
            # the runs that need a holder, for workers; it only checks the presence topic
            *_topic("processor", s.open_runs_topic, "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS"),
            *_topic("processor", s.workers_topic, "DESCRIBE", "DESCRIBE_CONFIGS"),
            # token deltas are the workers'; the processor only checks the topic
            *_topic("processor", s.deltas_topic, "DESCRIBE", "DESCRIBE_CONFIGS"),
            *(
                g
                for t in processor_own_topics(s)
                for g in _topic("processor", t, "READ", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS")
            ),
            _group("processor", group),
            _group("processor", f"{group}-restore"),  # the restore reader's group.id
            # transactional ids are {processor_group}-{instance} and ...-{instance}#1
            Grant("processor", "transactional_id", f"{group}-", "prefixed", "WRITE"),
            Grant("processor", "transactional_id", f"{group}-", "prefixed", "DESCRIBE"),
        ],
        "sink": [
            # WRITE: the tombstones of an erased session's event keys
            *_topic("sink", events, "READ", "WRITE", "DESCRIBE"),
            _group("sink", f"{group}-sink"),  # Sink's default group
        ],
        "worker": [
            *_topic("worker", worker_commands, "WRITE", "DESCRIBE"),
            *_topic("worker", events, "READ", "DESCRIBE"),  # its runs' grants, cancels, steers
            *_topic("worker", s.open_runs_topic, "READ", "DESCRIBE"),  # run discovery
            *_topic("worker", s.workers_topic, "READ", "WRITE", "DESCRIBE"),  # presence
            *_topic("worker", s.deltas_topic, "WRITE", "DESCRIBE"),  # token deltas
            # its readers assign partitions; the group id is never joined
            _group("worker", WORKER_GROUP_PREFIX, prefixed=True),
        ],
        "producer": [
            *_topic("producer", commands, "WRITE", "DESCRIBE"),
            *_topic("producer", events, "READ", "DESCRIBE"),  # the events of its commands
            *_topic("producer", s.outcomes_topic, "READ", "DESCRIBE"),  # their outcomes
            # token deltas, for the gateway's event streams
            *_topic("producer", s.deltas_topic, "READ", "DESCRIBE"),
            # its readers assign partitions; the group id is never joined
            _group("producer", CLIENT_GROUP_PREFIX, prefixed=True),
        ],
        "analytics": [
            *_topic("analytics", events, "READ", "DESCRIBE"),
            # a faust app with id sessionstream-analytics*: its group and internal topics
            _group("analytics", ANALYTICS_PREFIX, prefixed=True),
            *_topic(
                "analytics",
                ANALYTICS_PREFIX,
                "CREATE",
                "READ",
                "WRITE",
                "DESCRIBE",
                "DESCRIBE_CONFIGS",
                pattern="prefixed",
            ),
        ],
    }
    return {role: sorted(set(grants)) for role, grants in out.items()}


@dataclass(frozen=True)
class DbGrant:
    """Privileges of a PostgreSQL role on a table; absent tables are skipped (a hook)."""

    role: str
    table: str
    privileges: tuple[str, ...]


PROJECTION = ("agent_sessions", "agent_runs", "agent_run_events")
#: the gateway's API keys (migration 0005); grants on a table apply once it exists
GATEWAY_HOOK_TABLES = ("api_keys",)
#: what stays of an erasure (migration 0013)
ERASURE_RECORDS = ("session_erasures", "erasure_pointers")
#: other tables an erased session's rows are deleted from (by the sink)
ERASED_ELSEWHERE = (
    "agent_actions",
    "agent_outbox",
    "agent_run_fences",
    "step_results",
    "webhook_dead_letters",
    "session_aliases",
)


def db_grants() -> list[DbGrant]:
    """Table privileges of the process roles. `ss_reader` gets SELECT on every table
    (including future ones, by default privileges) on top of these."""
    rw = ("SELECT", "INSERT", "UPDATE")
    grants = [DbGrant("ss_sink", t, rw) for t in (*PROJECTION, "sink_offsets")]
    # erasure (sessionstream.runtimes.sink.erasure): the sink deletes an erased session's
    # rows wherever they are, and records the erasure
    grants = [
        DbGrant(g.role, g.table, (*g.privileges, "DELETE")) if g.table in PROJECTION else g
        for g in grants
    ]
    grants += [DbGrant("ss_sink", t, ("SELECT", "INSERT")) for t in ERASURE_RECORDS]
    grants += [DbGrant("ss_sink", t, ("SELECT", "DELETE")) for t in ERASED_ELSEWHERE]
    grants += [
        DbGrant("ss_worker", t, rw) for t in ("agent_actions", "agent_outbox", "agent_run_fences")
    ]
    grants += [DbGrant("ss_gateway", t, ("SELECT",)) for t in PROJECTION]
    grants += [DbGrant("ss_gateway", t, ("SELECT",)) for t in GATEWAY_HOOK_TABLES]
    # sink and workers run `migrate` at start: it reads what was applied
    grants += [DbGrant(r, "schema_migrations", ("SELECT",)) for r in ("ss_sink", "ss_worker")]
    return grants


def _kafka_acls_command(g: Grant) -> str:
    flag = {"topic": "--topic", "group": "--group", "transactional_id": "--transactional-id"}
    op = "".join(w.capitalize() for w in g.operation.split("_"))  # DescribeConfigs
    return (
        f"kafka-acls.sh --bootstrap-server $BOOTSTRAP --command-config admin.properties "
        f"--add --allow-principal {g.principal} --operation {op} "
        f"{flag[g.resource]} '{g.name}' --resource-pattern-type {g.pattern}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sessionstream.adapters.access",
        description="Print the Kafka ACLs and PostgreSQL grants of each role.",
    )
    parser.add_argument("--kafka-acls", action="store_true", help="as kafka-acls.sh commands")
    args = parser.parse_args(argv)
    grants = kafka_grants(Settings())
    for role in KAFKA_ROLES:
        for g in grants[role]:
            if args.kafka_acls:
                print(_kafka_acls_command(g))
            else:
                print(f"{g.principal:16} {g.operation:16} {g.resource:16} {g.pattern:8} {g.name}")
    if not args.kafka_acls:
        for d in db_grants():
            print(f"{d.role:16} {','.join(d.privileges):16} {'table':16} {'':8} {d.table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
