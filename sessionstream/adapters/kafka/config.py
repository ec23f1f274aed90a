"""Client configuration: the one place every Kafka client gets its address and credentials,
and the profile of each role.

`client_config` gives confluent-kafka clients bootstrap, credentials and the logger;
`aiokafka_config` and `faust_credentials` give aiokafka and faust the same. The profiles
say once what each kind of client needs: the murmur2 partitioner of every command
producer, read_committed assign-only readers, the processor's transactional producer and
static group member, the sink's group member.
"""

from __future__ import annotations

import logging
import ssl
import uuid
from typing import Any

from sessionstream.settings import Settings

__all__ = [
    "END_FETCH_WAIT_MS",
    "KAFKA_LOG",
    "LIVE_FETCH_WAIT_MS",
    "aiokafka_config",
    "client_config",
    "command_producer_config",
    "faust_credentials",
    "group_consumer_config",
    "reader_config",
    "security_config",
    "transactional_producer_config",
]

#: librdkafka's own log lines go here, not straight to stderr: a broker that is down
#: would otherwise print a line every 50 ms; the error reaches the user as an exception
KAFKA_LOG = logging.getLogger("sessionstream.adapters.kafka")


def _sasl(settings: Settings) -> tuple[str, str] | None:
    """(user, password) when the protocol is SASL_*; Settings guarantees both are set."""
    if not settings.kafka_security_protocol.startswith("SASL"):
        return None
    assert settings.kafka_username is not None and settings.kafka_password is not None
    return settings.kafka_username, settings.kafka_password.get_secret_value()


def security_config(settings: Settings) -> dict[str, str]:
    """librdkafka's security properties for the settings (empty for PLAINTEXT)."""
    sasl = _sasl(settings)
    if sasl is None:
        return {}
    return {
        "security.protocol": settings.kafka_security_protocol.lower(),
        "sasl.mechanism": settings.kafka_sasl_mechanism,
        "sasl.username": sasl[0],
        "sasl.password": sasl[1],
    }


def client_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """bootstrap.servers, credentials, the logger and librdkafka's debug contexts when
    asked for; `overrides` win."""
    conf: dict[str, Any] = {"bootstrap.servers": settings.kafka_bootstrap, "logger": KAFKA_LOG}
    if settings.kafka_debug:
        conf["debug"] = settings.kafka_debug
    conf.update(security_config(settings))
    conf.update(overrides)
    return conf


def aiokafka_config(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for aiokafka's clients: address and credentials."""
    conf: dict[str, Any] = {
        "bootstrap_servers": settings.kafka_bootstrap,
        "security_protocol": settings.kafka_security_protocol,
    }
    sasl = _sasl(settings)
    if sasl is not None:
        conf.update(
            sasl_mechanism=settings.kafka_sasl_mechanism,
            sasl_plain_username=sasl[0],
            sasl_plain_password=sasl[1],
        )
        if settings.kafka_security_protocol == "SASL_SSL":
            conf["ssl_context"] = ssl.create_default_context()
    return conf


def faust_credentials(settings: Settings) -> Any:
    """``faust.App(broker_credentials=...)`` for the settings (None for PLAINTEXT)."""
    sasl = _sasl(settings)
    if sasl is None:
        return None
    import faust

    return faust.SASLCredentials(
        username=sasl[0],
        password=sasl[1],
        mechanism=settings.kafka_sasl_mechanism,
        ssl_context=(
            ssl.create_default_context() if settings.kafka_security_protocol == "SASL_SSL" else None
        ),
    )


# -- profiles ---------------------------------------------------------------------------------
def command_producer_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """Every producer of commands (SDK, gateway, workers): keys placed with murmur2 — the
    partitioner Java and aiokafka use, so a session has one partition whoever writes —
    idempotent, acks=all. No linger: a command is sent at once (interactive producers feel
    every millisecond: 2 ms of linger was 2 ms of each command's p50 at 100/s). One request
    in flight a broker: under load what queues meanwhile goes in the next request, so the
    batches grow with the load and a light load still sends at once (at 64 commands in
    flight: 5.4 commands a request against 4.0 with librdkafka's default of 5, and ~5 % more
    commands/s; docs/decisions/0003-outcome-path.md, thirteenth pass)."""
    return client_config(
        settings,
        **{
            "partitioner": "murmur2_random",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 0,
            "max.in.flight.requests.per.connection": 1,
            "message.max.bytes": 2 * 1024 * 1024,
            **overrides,
        },
    )


#: `fetch.wait.max.ms` of a reader that follows live topics for as long as it runs (the
#: processor's consumer, the gateway's outcome tail and live events, the sink, a worker's
#: feeds, the SDK's tail). A parked fetch is answered as soon as a record (for a
#: read_committed reader, a commit) arrives, so the wait only sets how often an idle reader
#: asks; what it costs and saves: docs/operations.md, "What a quiet deployment asks of the
#: brokers".
LIVE_FETCH_WAIT_MS = 100
#: the wait of a reader that stops at a partition's end (replays, pages, audits): its last
#: fetch is answered only at the end of its wait
END_FETCH_WAIT_MS = 10


def reader_config(
    settings: Settings,
    *,
    group_id: str | None = None,
    read_committed: bool = True,
    eof: bool = False,
    fetch_wait_ms: int = END_FETCH_WAIT_MS,
    **overrides: Any,
) -> dict[str, Any]:
    """A consumer that is only ever assigned partitions: its group id is never joined nor
    committed to (a role's ACLs may still ask for one of its own prefix)."""
    return client_config(
        settings,
        **{
            "group.id": group_id or f"sessionstream-reader-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed" if read_committed else "read_uncommitted",
            "enable.partition.eof": eof,
            "fetch.wait.max.ms": fetch_wait_ms,
            **overrides,
        },
    )


def group_consumer_config(settings: Settings, group_id: str, **overrides: Any) -> dict[str, Any]:
    """A group member reading committed records, committing offsets only on purpose."""
    return client_config(
        settings,
        **{
            "group.id": group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
            "partition.assignment.strategy": "range",
            **overrides,
        },
    )


def transactional_producer_config(
    settings: Settings, transactional_id: str, **overrides: Any
) -> dict[str, Any]:
    """The processor's producer: one transaction per batch."""
    return client_config(
        settings,
        **{
            "transactional.id": transactional_id,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 1,
            "transaction.timeout.ms": settings.transaction_timeout_ms,
            # a transaction begun while the broker still closes the previous one is
            # answered CONCURRENT_TRANSACTIONS (librdkafka speaks EndTxn v1, before
            # KIP-890's epoch bump): the broker needs ~1-4 ms more, so the retry comes
            # soon. Measured on the local broker (send_offsets_to_transaction right after
            # a commit, p50): 100 ms default -> ~100, 10 ms -> 12.2, 2 ms -> 4.5
            "retry.backoff.ms": 2,
            "message.max.bytes": 4 * 1024 * 1024,
            **overrides,
        },
    )
