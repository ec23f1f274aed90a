"""The secured stack (`SESSIONSTREAM_STACK_SECURE=1 make up`): who may write what.

Starts the profile (idempotent `stack.sh up`, next to the default stack) and leaves it
running. Every Kafka check is made with the role's own credentials file, as a process of
that role would: each role can do what `sessionstream.adapters.access` grants and is refused
beyond. Writes that are allowed go to the real topic names of the secured broker, so they
are either aborted transactions or records the processor dead-letters: nothing a sink or
processor of this profile would choke on.
"""

from __future__ import annotations

import logging
import stat
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as TP
from confluent_kafka.admin import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from sessionstream.adapters.kafka import aiokafka_config, client_config
from sessionstream.adapters.topics import align_topics, ensure_topics
from sessionstream.client import SessionClient
from sessionstream.settings import Settings
from tests.integration.helpers import wait_until
from tests.integration.procs import Proc
from tests.integration.stack_profiles import Profile, running, stack

pytestmark = pytest.mark.integration

QUIET = logging.getLogger("tests.secure.librdkafka")
QUIET.addHandler(logging.NullHandler())
QUIET.propagate = False

DENIED_TOPIC = "TOPIC_AUTHORIZATION_FAILED"
DENIED_GROUP = "GROUP_AUTHORIZATION_FAILED"
DENIED_CLUSTER = "CLUSTER_AUTHORIZATION_FAILED"
DENIED_TXN = "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
#: a role without WRITE on any topic gets no idempotent producer id (KIP-679): depending on
#: which request the client sends first, the cluster or the topic refuses it
DENIED_ANY_WRITE = f"{DENIED_TOPIC}|{DENIED_CLUSTER}"


@pytest.fixture(scope="module")
def secure() -> Iterator[Profile]:
    with running("secure") as profile:
        admin = profile.settings("admin")
        ensure_topics(admin)
        align_topics(admin)  # topics left by an earlier version of the profile
        yield profile


def _code(err: KafkaError | None) -> str | None:
    return None if err is None else str(err.name())


def produce(
    s: Settings,
    topic: str,
    *,
    transactional_id: str | None = None,
    value: bytes | None = b"acl-check",
) -> str | None:
    """Produce one record as the SDK does (idempotent, acks=all); None when acknowledged,
    else the error's name. A transaction is aborted after its records were acknowledged.
    `value=None` sends a tombstone (what the sink writes for an erased session)."""
    errors: list[KafkaError] = []
    conf = client_config(
        s,
        logger=QUIET,
        **{
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": 10000,
            "error_cb": errors.append,
        },
    )
    if transactional_id:
        conf["transactional.id"] = transactional_id
    p = Producer(conf)
    delivered: list[KafkaError | None] = []
    try:
        if transactional_id:
            p.init_transactions(20)
            p.begin_transaction()
        p.produce(topic, value, key=b"acl-check", on_delivery=lambda e, _m: delivered.append(e))
        p.flush(15)
        if transactional_id:
            p.abort_transaction(20)
    except KafkaException as e:
        return _code(e.args[0])
    fatal = [e for e in errors if e.fatal()]
    if fatal:
        return _code(fatal[0])
    assert delivered, f"no delivery report for {topic} (errors: {errors})"
    return _code(delivered[0])


def consume(s: Settings, topic: str, group: str, *, join: bool) -> str | None:
    """Read `topic` from its start to its end: in group `group` (`join`: subscribe, which
    needs READ on the group) or by assignment (topic READ only). None or the error."""
    errors: list[KafkaError] = []
    c = Consumer(
        client_config(
            s,
            logger=QUIET,
            **{
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "enable.partition.eof": True,
                "error_cb": errors.append,
            },
        )
    )
    try:
        if join:
            c.subscribe([topic])
        else:
            # a topic the role may not describe is reported as unknown by an assignment
            meta = c.list_topics(topic, timeout=10).topics[topic]
            if meta.error is not None:
                return _code(meta.error)
            c.assign([TP(topic, 0, OFFSET_BEGINNING)])
        found: list[str | None] = []

        def outcome() -> bool:
            msg = c.poll(0.2)
            err = msg.error() if msg is not None else None
            if err is not None:
                found.append(None if err.code() == KafkaError._PARTITION_EOF else _code(err))
            fatal = [e for e in errors if e.code() != KafkaError._TRANSPORT]
            if fatal and not found:
                found.append(_code(fatal[0]))
            return bool(found)

        wait_until(outcome, timeout=30, interval=0, what=f"reading {topic} as {group}")
        return found[0]
    finally:
        c.close()


def test_up_is_idempotent_and_secrets_stay_private(secure: Profile) -> None:
    first = stack("secure", "up")
    second = stack("secure", "up")
    assert "already running" in second and "started" not in second and "formatting" not in second
    assert first.split("(pid ")[1].split(",")[0] == second.split("(pid ")[1].split(",")[0]
    assert "0 added, 0 removed" in second
    creds = secure.credentials("admin").parent
    assert stat.S_IMODE(creds.stat().st_mode) == 0o700
    for role in ("admin", "processor", "sink", "worker", "producer", "analytics", "broker"):
        path = secure.credentials(role)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        s = secure.settings(role)
        assert s.kafka_password is not None
        secret = s.kafka_password.get_secret_value()
        assert secret not in first + second and secret not in repr(s), role
        if s.database_password is not None:
            assert s.database_password.get_secret_value() not in repr(s)
    jaas = secure.credentials("admin").parents[1] / "kafka" / "jaas.conf"
    assert stat.S_IMODE(jaas.stat().st_mode) == 0o600
    props = (jaas.parent / "server.properties").read_text()
    broker_pw = secure.settings("broker").kafka_password
    assert broker_pw is not None and broker_pw.get_secret_value() not in props
    assert "allow.everyone.if.no.acl.found=false" in props


def test_the_secured_profile_has_its_own_registry_that_refuses_anonymous_clients(
    secure: Profile,
) -> None:
    """Its schemas are read and written with the roles' credentials only (HTTP basic, one
    user whose password is in every role's file); anonymous or wrong: 401."""
    import httpx

    from sessionstream.adapters.registry import SchemaRegistry

    s = secure.settings("producer")
    assert s.schema_registry_url.startswith("http://127.0.0.1:8181/")
    assert s.schema_registry_username and s.schema_registry_password is not None
    password = s.schema_registry_password.get_secret_value()
    subjects = f"{s.schema_registry_url}/subjects"
    assert httpx.get(subjects, timeout=10).status_code == 401
    assert (
        httpx.get(subjects, auth=(s.schema_registry_username, "wrong"), timeout=10).status_code
        == 401
    )
    ok = httpx.get(subjects, auth=(s.schema_registry_username, password), timeout=10)
    assert ok.status_code == 200 and isinstance(ok.json(), list)
    # the SDK's adapter with the role's settings registers and resolves through it
    ids = SchemaRegistry(
        s.model_copy(update={"events_topic": f"auth-{uuid.uuid4().hex[:6]}"})
    ).resolve(("event",))
    assert ids["event"] > 0
    conf = secure.credentials("admin").parents[1] / "registry" / "config" / "application.properties"
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600 and password in conf.read_text()
    assert stat.S_IMODE(conf.parent.stat().st_mode) == 0o700


def _login(s: Settings, limit_s: float = 8.0) -> tuple[bool, list[KafkaError]]:
    """Whether a metadata request succeeds within `limit_s`, and the errors librdkafka
    reported meanwhile. A refused login is known at its first authentication error."""
    errors: list[KafkaError] = []
    admin = AdminClient(client_config(s, logger=QUIET, error_cb=errors.append))
    deadline = time.monotonic() + limit_s
    while True:
        try:
            admin.list_topics(timeout=0.5)
        except KafkaException:
            admin.poll(0.1)  # error_cb runs from poll
            refused = any(e.code() == KafkaError._AUTHENTICATION for e in errors)
            if refused or time.monotonic() > deadline:
                return False, errors
            continue
        return True, errors


def test_unauthenticated_and_wrong_password_are_refused(secure: Profile) -> None:
    ok, _ = _login(secure.settings(None))  # PLAINTEXT on a SASL listener
    assert not ok
    for wrong in (
        secure.settings("producer", kafka_password="not-the-password"),
        secure.settings("producer", kafka_username="nobody"),
        secure.settings("producer", kafka_sasl_mechanism="PLAIN"),  # only SCRAM is enabled
    ):
        ok, errors = _login(wrong)
        assert not ok
        assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
        # the error names the user, never the password tried
        assert all("not-the-password" not in e.str() for e in errors)
    ok, errors = _login(secure.settings("producer"))
    assert ok, errors


# (role, topic setting, expected): idempotent producers as the SDK and workers use them
WRITES = [
    ("producer", "commands_topic", None),
    ("producer", "events_topic", DENIED_TOPIC),
    ("producer", "state_topic", DENIED_TOPIC),
    ("producer", "worker_commands_topic", DENIED_TOPIC),
    ("producer", "timers_topic", DENIED_TOPIC),
    ("worker", "worker_commands_topic", None),
    ("worker", "timers_topic", DENIED_TOPIC),
    ("worker", "commands_topic", DENIED_TOPIC),
    ("worker", "events_topic", DENIED_TOPIC),
    ("worker", "state_topic", DENIED_TOPIC),
    ("worker", "open_runs_topic", DENIED_TOPIC),
    ("worker", "workers_topic", None),
    ("producer", "workers_topic", DENIED_TOPIC),
    ("sink", "commands_topic", DENIED_ANY_WRITE),
    ("sink", "state_topic", DENIED_ANY_WRITE),
    ("sink", "dlq_topic", DENIED_ANY_WRITE),
    ("analytics", "events_topic", DENIED_ANY_WRITE),
    ("analytics", "commands_topic", DENIED_ANY_WRITE),
]


def _topic(s: Settings, which: str) -> str:
    return str(getattr(s, which))


def test_the_sink_writes_tombstones_on_the_events_topic(secure: Profile) -> None:
    """Erasure (docs/protocol.md#erasure-and-retention): the sink tombstones an erased
    session's event keys, so its principal may write the events topic (Kafka's ACLs cannot
    hold it to tombstones; operations.md says so). A tombstone of a key nobody wrote is
    what this sends: every reader of the topic skips tombstones."""
    s = secure.settings("sink")
    assert produce(s, s.events_topic, value=None) is None


@pytest.mark.parametrize(("role", "which", "expected"), WRITES)
def test_writes(secure: Profile, role: str, which: str, expected: str | None) -> None:
    s = secure.settings(role)
    got = produce(s, _topic(s, which))
    assert got == expected if expected is None else got in expected.split("|")


def test_only_the_processor_writes_events_and_state_in_its_transactions(secure: Profile) -> None:
    s = secure.settings("processor")
    txn = f"{s.processor_group}-acl-check-{uuid.uuid4().hex[:6]}"
    # events, state, dead letters, fired timers; the input topics for forwarded records
    for topic in (
        s.events_topic,
        s.state_topic,
        s.dlq_topic,
        s.timers_topic,
        s.commands_topic,
        s.worker_commands_topic,
    ):
        assert produce(s, topic, transactional_id=txn) is None, topic
    # its transactional ids are {processor_group}-*, nothing else
    assert produce(s, s.events_topic, transactional_id="elsewhere-1") == DENIED_TXN
    # nobody else may take the processor's transactional ids
    producer = secure.settings("producer")
    assert produce(producer, producer.commands_topic, transactional_id=txn) == DENIED_TXN


# (role, topic setting, group, join): reads, in the role's groups and outside them
READS = [
    ("producer", "events_topic", "sessionstream-client-{u}", True, None),
    ("producer", "outcomes_topic", "sessionstream-client-{u}", True, None),
    ("producer", "dlq_topic", "sessionstream-client-{u}", True, DENIED_TOPIC),
    ("producer", "state_topic", "sessionstream-client-{u}", True, DENIED_TOPIC),
    ("producer", "commands_topic", "sessionstream-client-{u}", True, DENIED_TOPIC),
    ("producer", "events_topic", "somebody-else-{u}", True, DENIED_GROUP),
    ("worker", "events_topic", "sessionstream-worker-{u}", True, None),
    ("worker", "open_runs_topic", "sessionstream-worker-{u}", True, None),
    ("worker", "workers_topic", "sessionstream-worker-{u}", True, None),
    # workers find runs in the open-runs topic; the state changelog is the processor's
    ("worker", "state_topic", "sessionstream-worker-{u}", True, DENIED_TOPIC),
    ("worker", "commands_topic", "sessionstream-worker-{u}", True, DENIED_TOPIC),
    ("worker", "events_topic", "sessionstream-client-{u}", True, DENIED_GROUP),
    ("sink", "events_topic", "sessionstream-client-{u}", True, DENIED_GROUP),
    ("sink", "events_topic", "sessionstream-processor-sink", False, None),
    ("sink", "commands_topic", "sessionstream-processor-sink", False, DENIED_TOPIC),
    ("analytics", "events_topic", "sessionstream-analytics-{u}", True, None),
    ("analytics", "commands_topic", "sessionstream-analytics-{u}", True, DENIED_TOPIC),
    ("analytics", "events_topic", "sessionstream-client-{u}", True, DENIED_GROUP),
    ("processor", "commands_topic", "sessionstream-processor-restore", False, None),
    ("processor", "worker_commands_topic", "sessionstream-processor-restore", False, None),
    ("processor", "timers_topic", "sessionstream-processor-restore", False, None),
    ("producer", "timers_topic", "sessionstream-client-{u}", True, DENIED_TOPIC),
    ("worker", "timers_topic", "sessionstream-worker-{u}", True, DENIED_TOPIC),
    ("processor", "state_topic", "sessionstream-processor-restore", False, None),
]


@pytest.mark.parametrize(("role", "which", "group", "join", "expected"), READS)
def test_reads(
    secure: Profile, role: str, which: str, group: str, join: bool, expected: str | None
) -> None:
    s = secure.settings(role)
    assert consume(s, _topic(s, which), group.format(u=uuid.uuid4().hex[:8]), join=join) == expected


def test_the_producer_can_neither_read_nor_commit_the_processors_offsets(
    secure: Profile,
) -> None:
    """Outcomes come from `session.outcomes`; the SDK once read the processor group's
    committed offsets to infer them, and no longer needs to."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    s = secure.settings("producer")
    admin = AdminClient(client_config(s, logger=QUIET))
    request = ConsumerGroupTopicPartitions(s.processor_group, [TP(s.commands_topic, 0)])
    # refused, or no coordinator ever found: the latter is known only when the request
    # times out (librdkafka's default is 30 s; 5 s is plenty for an idle local broker)
    fut = admin.list_consumer_group_offsets([request], request_timeout=5)[s.processor_group]
    with pytest.raises(KafkaException) as info:
        fut.result(timeout=30)
    # refused at FindCoordinator: librdkafka reports the group denied, or (as here) never
    # finding its coordinator
    assert info.value.args[0].name() in (DENIED_GROUP, "_WAIT_COORD"), info.value
    c = Consumer(
        client_config(
            s,
            logger=QUIET,
            **{
                "group.id": s.processor_group,
                "enable.auto.commit": False,
                # the commit waits for a coordinator it is never given as long as the
                # session timeout (45 s by default; measured): the least brokers accept
                "session.timeout.ms": 6000,
            },
        )
    )
    try:
        with pytest.raises(KafkaException) as info:
            c.commit(offsets=[TP(s.commands_topic, 0, 0)], asynchronous=False)
        assert info.value.args[0].name() in (DENIED_GROUP, "_WAIT_COORD"), info.value
    finally:
        c.close()


def test_roles_cannot_administer(secure: Profile) -> None:
    for role in ("producer", "processor", "worker", "sink", "analytics"):
        s = secure.settings(role)
        admin = AdminClient(client_config(s, logger=QUIET))
        name = f"acl-check-{uuid.uuid4().hex[:8]}"
        with pytest.raises(KafkaException) as info:
            admin.create_topics([NewTopic(name, 1, 1)])[name].result(timeout=15)
        assert info.value.args[0].name() in (DENIED_TOPIC, DENIED_CLUSTER), role
        # None matches any name, principal and host (documented; the stubs say str)
        everything = AclBindingFilter(
            ResourceType.ANY,
            None,  # type: ignore[arg-type]
            ResourcePatternType.ANY,
            None,  # type: ignore[arg-type]
            None,  # type: ignore[arg-type]
            AclOperation.ANY,
            AclPermissionType.ANY,
        )
        # the ACLs are not for the roles to read: the broker shows them none
        assert admin.describe_acls(everything, request_timeout=15).result() == [], role


# -- PostgreSQL -------------------------------------------------------------------------------
def _can(s: Settings, statement: str) -> bool:
    """Whether the role may run `statement` (in a transaction that is rolled back)."""
    with psycopg.connect(s.database_conninfo, connect_timeout=10) as conn:
        try:
            conn.execute(statement)
        except psycopg.errors.InsufficientPrivilege:
            return False
        finally:
            conn.rollback()
    return True


INSERT_SESSION = (
    "insert into agent_sessions (session_id, tenant_id, created_at, updated_at)"
    " values ('grant-check', 't', now(), now())"
)
INSERT_ACTION = (
    "insert into agent_actions (idempotency_key, kind, session_id, run_id, generation,"
    " worker_id, status) values ('grant-check', 'k', 's', 'r', 1, 'w', 'executing')"
)
INSERT_EVENT = (
    "insert into agent_run_events (session_id, run_id, seq, type, payload, generation,"
    " command_id, tenant_id, ts, kafka_partition, kafka_offset)"
    " values ('s', 'r', 1, 't', '{}', 1, 'c', 't', now(), 0, 0)"
)


@pytest.mark.parametrize(
    ("role", "statement", "allowed"),
    [
        ("sink", INSERT_SESSION, True),
        ("sink", INSERT_EVENT, True),  # also the serial column's sequence
        ("sink", "update sink_offsets set next_offset = 0", True),
        ("sink", INSERT_ACTION, False),
        ("sink", "delete from agent_runs", True),  # an erased session's rows
        ("sink", "delete from api_keys", False),
        ("sink", "create table grant_check (a int)", False),
        ("worker", INSERT_ACTION, True),
        ("worker", "select count(*) from agent_outbox", True),
        ("worker", INSERT_SESSION, False),
        ("worker", "select count(*) from agent_runs", False),
        ("producer", "select count(*) from agent_runs", True),  # the gateway reads
        ("producer", INSERT_SESSION, False),
        ("producer", "select count(*) from agent_actions", False),
        ("analytics", "select count(*) from agent_actions", True),
        ("analytics", "select count(*) from agent_run_events", True),
        ("analytics", INSERT_SESSION, False),
        ("analytics", "update agent_runs set prompt = ''", False),
        ("admin", "create table grant_check (a int)", True),  # the owner migrates
    ],
)
def test_database_roles(secure: Profile, role: str, statement: str, allowed: bool) -> None:
    assert _can(secure.settings(role), statement) is allowed


def test_database_is_closed_to_other_roles(secure: Profile, settings: Settings) -> None:
    """The dev stack's role (and PUBLIC) cannot connect to the secured database."""
    db = secure.values["SECURE_DATABASE"]
    dev = psycopg.conninfo.make_conninfo(settings.database_conninfo, dbname=db)
    with pytest.raises(psycopg.OperationalError) as info:
        psycopg.connect(dev, connect_timeout=10).close()
    assert "permission denied" in str(info.value)


# -- the real processes, each with its own role -----------------------------------------------
def test_processor_sink_worker_and_sdk_run_on_their_credentials_only(secure: Profile) -> None:
    """A prompt through SessionClient (producer), run by a worker (worker: its commands on
    the worker-commands topic, its actions in PostgreSQL as ss_worker), decided by the
    processor and projected by the sink, each process with nothing but its role's
    credentials file, ends as a completed run the reader role sees. A timer the producer
    forges is refused; no process prints a password."""
    instance = f"secure-it-{uuid.uuid4().hex[:6]}"
    processor = Proc(secure.settings("processor"), "processor", "--instance", instance).start()
    sink = Proc(secure.settings("sink"), "sink").start()
    worker = Proc(
        secure.settings("worker"), "worker", "--worker-id", f"w-{instance}", "--lease-ms", "5000"
    ).start()
    procs = ((processor, "processor"), (sink, "sink"), (worker, "worker"))
    try:
        processor.wait_log("assigned", timeout=90)
        session = f"secure-{uuid.uuid4().hex[:8]}"
        with SessionClient("tenant-secure", secure.settings("producer")) as client:
            outcome = client.wait(client.prompt(session, "steps=1 tool_ms=0 email=no"), 60)
            assert outcome.status == "accepted", outcome
            # the producer's principal may write commands: a timer it forges lands on the
            # commands topic, where timers are not taken
            forged = client.command(
                session,
                "timer.fired",
                {"kind": "run_deadline", "dueAt": 0},
                run_id=outcome.run_id,
                generation=1,
            )
            refused = client.wait(client.submit(forged), 60)
            assert (refused.status, refused.reason) == ("rejected", "not_allowed_here")
        reader = secure.settings("analytics")

        def done() -> object:
            for p, _ in procs:
                p.assert_alive()
            with psycopg.connect(reader.database_conninfo) as conn:
                return conn.execute(
                    "select session_id, terminal_status from agent_runs"
                    " where run_id = %s and terminal_status is not null",
                    (outcome.run_id,),
                ).fetchone()

        assert wait_until(done, timeout=90, what="the run completed in agent_runs") == (
            session,
            "completed",
        )
        # no process printed a password (its own, or the database's)
        for proc, role in procs:
            rs = secure.settings(role)
            text = proc.log_text()
            for secret in (rs.kafka_password, rs.database_password):
                assert secret is None or secret.get_secret_value() not in text, role
    finally:
        for p, _ in procs:
            assert p.stop() == 0, p.log_text()[-3000:]


async def test_aiokafka_clients_log_in_with_the_same_settings(secure: Profile) -> None:
    """What analytics (faust on aiokafka) gets from `aiokafka_config`: its reads work, and
    the broker holds it to its ACLs."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.errors import KafkaError as AIOKafkaError

    s = secure.settings("analytics")
    consumer = AIOKafkaConsumer(
        s.events_topic,
        group_id=f"sessionstream-analytics-it-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        **aiokafka_config(s),
    )
    await consumer.start()
    try:
        await consumer.getmany(timeout_ms=3000)
        assert consumer.assignment(), "no partitions assigned"
    finally:
        await consumer.stop()
    producer = AIOKafkaProducer(**aiokafka_config(s), request_timeout_ms=10000)
    await producer.start()
    try:
        with pytest.raises(AIOKafkaError) as info:
            await producer.send_and_wait(s.commands_topic, b"acl-check")
        assert "Authorization" in type(info.value).__name__, info.value
    finally:
        await producer.stop()


def test_down_then_up_keeps_credentials_users_and_acls(secure: Profile) -> None:
    """Last in this file: the broker restarts from its data; passwords, SCRAM users and ACLs
    are the same afterwards (nothing to add, nothing to remove)."""
    before = {r: secure.credentials(r).read_text() for r in ("admin", "producer", "sink")}
    down = stack("secure", "down")
    assert "kafka-secure: stopped" in down and "postgres" not in down  # PostgreSQL is shared
    again = stack("secure", "up")
    assert "kafka-secure: started" in again and "formatting" not in again
    assert "0 added, 0 removed" in again
    assert {r: secure.credentials(r).read_text() for r in before} == before
    producer = secure.settings("producer")
    assert produce(producer, producer.events_topic) == DENIED_TOPIC
    ok, errors = _login(secure.settings("sink"))
    assert ok, errors
