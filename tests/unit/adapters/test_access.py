"""The ACL and grant spec (`sessionstream.adapters.access`): least privilege, checked as data.

The secured stack's integration tests check the same against a real broker; these fail
fast, and name the rule, when someone widens a role or adds a topic without its ACLs."""

from __future__ import annotations

from sessionstream.adapters.access import (
    KAFKA_ROLES,
    Grant,
    db_grants,
    kafka_grants,
    main,
)
from sessionstream.adapters.topics import topic_specs
from sessionstream.settings import Settings

S = Settings()
GRANTS = kafka_grants(S)


def _allowed(role: str, op: str, resource: str, name: str) -> bool:
    def matches(g: Grant) -> bool:
        if g.resource != resource or g.operation != op:
            return False
        return g.name == name if g.pattern == "literal" else name.startswith(g.name)

    return any(matches(g) for g in GRANTS[role])


def test_only_the_processor_writes_events_state_and_dead_letters() -> None:
    for topic in (S.state_topic, S.dlq_topic):
        writers = [r for r in KAFKA_ROLES if _allowed(r, "WRITE", "topic", topic)]
        assert writers == ["processor"], topic
    # the sink too: the tombstones of an erased session's keys (ACLs cannot say "only
    # tombstones"; its code writes nothing else: docs/operations.md, erasure)
    writers = [r for r in KAFKA_ROLES if _allowed(r, "WRITE", "topic", S.events_topic)]
    assert writers == ["processor", "sink"]


def test_who_writes_the_command_topics() -> None:
    commands = [r for r in KAFKA_ROLES if _allowed(r, "WRITE", "topic", S.commands_topic)]
    assert commands == ["processor", "producer"]  # the processor forwards misplaced ones
    wc = S.worker_commands_topic
    assert [r for r in KAFKA_ROLES if _allowed(r, "WRITE", "topic", wc)] == ["processor", "worker"]
    # a timer.fired from anyone but the processor never reaches it
    assert [r for r in KAFKA_ROLES if _allowed(r, "WRITE", "topic", S.timers_topic)] == [
        "processor"
    ]
    for role in KAFKA_ROLES:
        if role != "processor":
            assert not _allowed(role, "READ", "topic", S.timers_topic), role


def test_nobody_but_the_processor_has_transactional_ids_or_creates_our_topics() -> None:
    for role in KAFKA_ROLES:
        txn = [g for g in GRANTS[role] if g.resource == "transactional_id"]
        assert bool(txn) is (role == "processor"), role
        for spec in topic_specs(S):
            assert not _allowed(role, "CREATE", "topic", spec.name), (role, spec.name)
    assert _allowed("processor", "WRITE", "transactional_id", f"{S.processor_group}-host-1")
    assert not _allowed("processor", "WRITE", "transactional_id", "other-1")


def test_the_processor_can_check_every_topic_it_checks_at_startup() -> None:
    """check_topics lists and describes the configs of every topic in topic_specs: a new
    topic there needs its processor ACLs in sessionstream/adapters/access.py."""
    for spec in topic_specs(S):
        assert _allowed("processor", "DESCRIBE_CONFIGS", "topic", spec.name), spec.name


def test_readers_and_their_groups() -> None:
    assert _allowed("sink", "READ", "topic", S.events_topic)
    assert _allowed("sink", "READ", "group", f"{S.processor_group}-sink")
    assert not _allowed("sink", "READ", "group", S.processor_group)
    assert _allowed("producer", "READ", "group", "sessionstream-client-1234")
    # the SDK fetches the processor's committed offsets, it must not join or commit
    # outcomes come from session.outcomes: the processor's offsets are none of its business
    assert not _allowed("producer", "DESCRIBE", "group", S.processor_group)
    assert _allowed("producer", "READ", "topic", S.outcomes_topic)
    assert not _allowed("producer", "READ", "topic", S.dlq_topic)
    assert not _allowed("producer", "READ", "group", S.processor_group)
    assert not _allowed("producer", "READ", "topic", S.state_topic)
    assert not _allowed("worker", "READ", "topic", S.state_topic)
    assert _allowed("worker", "READ", "topic", S.open_runs_topic)
    assert _allowed("worker", "WRITE", "topic", S.workers_topic)
    assert not _allowed("worker", "WRITE", "topic", S.open_runs_topic)
    assert not _allowed("worker", "READ", "topic", S.commands_topic)
    assert _allowed("analytics", "CREATE", "topic", "sessionstream-analytics-table-changelog")
    # the control topic: a producer or a worker can never send `session.erase` there; the
    # sink writes only the tombstones of erased keys on the events topic
    for role in ("producer", "worker", "sink", "analytics"):
        assert not _allowed(role, "WRITE", "topic", S.timers_topic), role
    assert _allowed("sink", "WRITE", "topic", S.events_topic)
    assert not _allowed("analytics", "READ", "topic", S.commands_topic)


def test_database_roles() -> None:
    by_role: dict[str, set[str]] = {}
    for g in db_grants():
        if "INSERT" in g.privileges:
            by_role.setdefault(g.role, set()).add(g.table)
    assert by_role == {
        "ss_sink": {
            "agent_sessions",
            "agent_runs",
            "agent_run_events",
            "sink_offsets",
            "session_erasures",
            "erasure_pointers",
        },
        "ss_worker": {"agent_actions", "agent_outbox", "agent_run_fences"},
    }
    # only the sink deletes, and only what an erasure removes (docs/protocol.md, erasure)
    deleters = {(g.role, g.table) for g in db_grants() if "DELETE" in g.privileges}
    assert {r for r, _t in deleters} == {"ss_sink"}
    assert {t for _r, t in deleters} >= {"agent_run_events", "agent_runs", "agent_sessions"}
    assert ("ss_sink", "sink_offsets") not in deleters


def test_printing_the_spec(capsys: object) -> None:
    assert main([]) == 0
    assert main(["--kafka-acls"]) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "--operation DescribeConfigs" in out and "User:producer" in out
