"""The settings of each component, one model each; field ``x`` is read from
``SESSIONSTREAM_X``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from sessionstream.core.approvals import parse_approval_kinds
from sessionstream.settings._base import LIBRDKAFKA_DEBUG_CONTEXTS, Part, check_instance_id


def parse_prices(value: str) -> tuple[float, float]:
    """``INPUT/OUTPUT`` US dollars per million tokens, or ValueError saying the form."""
    try:
        low, high = (float(x) for x in value.split("/"))
    except ValueError:
        raise ValueError(
            f"model prices {value!r}: write INPUT/OUTPUT dollars per million tokens, e.g. 0.15/0.60"
        ) from None
    if low < 0 or high < 0:
        raise ValueError(f"model prices {value!r} must not be negative")
    return low, high


__all__ = [
    "AnalyticsSettings",
    "DatabaseSettings",
    "GatewaySettings",
    "KafkaSettings",
    "LimitSettings",
    "MetricsSettings",
    "ModelSettings",
    "ProcessorSettings",
    "RegistrySettings",
    "SinkSettings",
    "TopicSettings",
    "WorkerSettings",
    "parse_prices",
]


class KafkaSettings(Part):
    """Kafka: how every process reaches the brokers."""

    kafka_bootstrap: str = "127.0.0.1:9092"
    """Kafka bootstrap servers, a comma-separated ``host:port`` list."""

    kafka_security_protocol: Literal["PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    """How clients talk to Kafka. ``SASL_*`` needs ``kafka_username`` and ``kafka_password``;
    ``SASL_SSL`` trusts the system's CA certificates."""

    kafka_sasl_mechanism: Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"] = "SCRAM-SHA-512"
    """SASL mechanism (only read with a ``SASL_*`` protocol)."""

    kafka_debug: str | None = None
    """librdkafka debug contexts for every confluent-kafka client of the process, e.g.
    ``cgrp,consumer`` or ``eos``; its lines are logged at DEBUG, so run with
    ``--log-level DEBUG`` too. Off when unset."""

    kafka_username: str | None = None
    """SASL user name: the Kafka principal ``User:<name>`` whose ACLs apply."""

    kafka_password: SecretStr | None = None
    """SASL password."""

    transaction_timeout_ms: int = Field(default=10_000, ge=1000)
    """How long a dead processor's open transaction may block readers before the broker aborts
    it (a restarted instance aborts it at once)."""

    @field_validator("kafka_debug")
    @classmethod
    def _known_debug_contexts(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        contexts = [c.strip() for c in value.split(",") if c.strip()]
        unknown = [c for c in contexts if c not in LIBRDKAFKA_DEBUG_CONTEXTS]
        if unknown:
            raise ValueError(
                f"unknown librdkafka debug context(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(LIBRDKAFKA_DEBUG_CONTEXTS))}"
            )
        return ",".join(contexts)

    @model_validator(mode="after")
    def _sasl_needs_credentials(self) -> KafkaSettings:
        if self.kafka_security_protocol.startswith("SASL") and not (
            self.kafka_username and self.kafka_password
        ):
            raise ValueError(
                f"kafka_security_protocol={self.kafka_security_protocol} needs kafka_username "
                "and kafka_password (SESSIONSTREAM_KAFKA_USERNAME/_PASSWORD, or a "
                "SESSIONSTREAM_CREDENTIALS_FILE)"
            )
        return self


class DatabaseSettings(Part):
    """PostgreSQL: the sink's projection, the workers' actions, the gateway's keys and reads."""

    database_url: str = "postgresql://sessionstream:sessionstream@127.0.0.1:5432/sessionstream"
    """PostgreSQL connection URL as libpq reads it: ``postgresql://user:pw@host:port/db``.
    Prefer ``database_password`` over a password inside the URL."""

    database_password: SecretStr | None = None
    """Password for ``database_url``'s user (wins over one in the URL)."""

    database_schema: str | None = None
    """PostgreSQL schema of sessionstream's tables (default: the search path's, ``public``)."""

    @property
    def database_conninfo(self) -> str:
        """What to hand psycopg: ``database_url`` with ``database_password`` applied."""
        if self.database_password is None:
            return self.database_url
        from psycopg.conninfo import make_conninfo

        return make_conninfo(self.database_url, password=self.database_password.get_secret_value())


class RegistrySettings(Part):
    """The schema registry every record's schema id is resolved against."""

    schema_registry_url: str = "http://127.0.0.1:8081/apis/ccompat/v7"
    """The schema registry's Confluent-compatible API (Apicurio's ``/apis/ccompat/v7``, or a
    Confluent Schema Registry's root): where the Avro schemas of commands, events and
    outcomes are registered and every record's schema id is resolved. Empty: no registry;
    Avro is written in the single-object encoding of earlier versions (read as before,
    but not by Kafka's registry-aware tools)."""

    schema_registry_username: str | None = None
    """User for the registry's HTTP basic authentication (none: no authentication)."""

    schema_registry_password: SecretStr | None = None
    """Password for ``schema_registry_username``."""


class TopicSettings(Part):
    """The topics, and how sessionstream creates them."""

    commands_topic: str = "session.commands"
    """Topic of producers' commands (``prompt``, ``steer``, ``follow_up``, ``send``,
    ``abort``), keyed by ``session_id`` (one partition per session)."""

    worker_commands_topic: str = "session.worker-commands"
    """Topic of workers' commands (leases, progress, actions, cancel acks, run ends): the
    commands topic's partition count and placement, read by the processor in the same
    transactions. A command of the other class on either topic is rejected
    ``not_allowed_here``."""

    timers_topic: str = "session.timers"
    """The processor's own ``timer.fired`` commands (co-partitioned like the commands topic);
    no other process writes it, and a timer found on any other topic is rejected."""

    events_topic: str = "session.events"
    """Compacted topic of session events, keyed ``{session_id}/{run_id}/{seq:010d}``."""

    dlq_topic: str = "session.dlq"
    """Dead-letter topic for input that cannot be decoded or decided, keyed by the original key."""

    state_topic: str = "session.state"
    """Compacted changelog of the processor's per-session state, keyed by ``session_id``."""

    open_runs_topic: str = "session.open-runs"
    """Compacted topic of the runs that need a holder, keyed by ``session_id``: written by the
    processor, read whole by every worker (run discovery without a consumer group)."""

    workers_topic: str = "session.workers"
    """Compacted topic of worker presence, keyed by worker id (who is alive to take a run)."""

    dedup_topic: str = "session.dedup"
    """The dedup changelog of versions before the outcome records carried what each
    command id is remembered as: no longer written or created; a processor's full restore
    still reads it while it exists (its records go within two days of an upgrade, then it
    may be deleted)."""

    outcomes_topic: str = "session.outcomes"
    """One record per command the processor reads (accepted, rejected, duplicate, dead
    letter, forwarded), in the transaction of its events; keyed ``{session_id}/{command_id}``
    on the command's partition (co-partitioned with the commands). Each also says what its
    command id is remembered as: the processor's dedup store is restored from this topic."""

    deltas_topic: str = "session.deltas"
    """Token deltas: pieces of a model's answer as it streams, published by the workers
    outside any transaction (a view for the console and SSE clients, never the record: the
    finished step holds the full text); keyed ``{session_id}/{run_id}/{call_id}`` on the
    session's partition, kept ``deltas_retention_ms``."""

    deltas_retention_ms: int = Field(default=3_600_000, ge=60_000)
    """How long the deltas topic keeps a delta (set when the topic is created)."""

    replication_factor: int = Field(default=1, ge=1)
    """Replication factor of the topics sessionstream creates (1 on the local single broker)."""

    partitions: int = Field(default=4, ge=1)
    """Partition count of the commands and events topics (the two must be equal)."""


class ProcessorSettings(Part):
    """The session processor (`sessionstream processor`): its group, store, transactions
    and the bounds it enforces."""

    processor_group: str = "sessionstream-processor"
    """Consumer group of the session processors (also the prefix of their transactional ids)."""

    processor_instance: str | None = None
    """This processor's stable instance id (default: the host name). Two processors on one
    host need distinct ids; a restarted one must keep its id so it fences its predecessor.
    It may not contain ``#`` (it separates the id from the number of the instance's second
    transactional producer)."""

    store_dir: Path | None = None
    """The processor's local state store (RocksDB, one per assigned partition, under
    ``{store_dir}/{processor_group}/{instance}/``); default
    ``$XDG_STATE_HOME/sessionstream/store`` (``~/.local/state/...``). A copy of the states
    and the remembered command ids (from the state and outcomes topics) with a checkpoint,
    so a restart reads only the topics' tail; safe to delete (the next start restores in
    full)."""

    state_cache_sessions: int = Field(default=20_000, ge=1)
    """Decoded session states the processor keeps in memory (least recently used go; the
    rest are on disk in the store)."""

    @property
    def store_path(self) -> Path:
        """``store_dir`` or its default."""
        if self.store_dir is not None:
            return self.store_dir
        base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        return Path(base) / "sessionstream" / "store"

    processor_batch_size: int = Field(default=500, ge=1, le=100_000)
    """Most commands one processor transaction decides."""

    processor_linger_ms: int = Field(default=0, ge=0, le=10_000)
    """Least time between the starts of two processor transactions while there is no full
    batch: commands arriving meanwhile join the next transaction. 0: a transaction starts as
    soon as the previous one's records are in (lowest latency). Each transaction costs the broker
    a fixed amount of work (markers on every partition it wrote), so a linger trades latency
    for broker CPU under a steady trickle (bench/results/gateway.md: 20 ms at 500 POST/s)."""

    @field_validator("processor_instance")
    @classmethod
    def _instance_id(cls, value: str | None) -> str | None:
        # empty (`VAR=${X:-}` in compose and env files): the host name, as before
        return None if value is None or not value.strip() else check_instance_id(value)


class LimitSettings(Part):
    """The protocol's bounds: the processor enforces them; workers and the gateway check
    them before they send."""

    max_payload_bytes: int = Field(default=262144, ge=1024, le=768 * 1024)
    """Largest accepted command payload in bytes; a larger one is rejected with
    ``payload_too_large`` (records over the codec's 900 KiB go to the DLQ, so at most
    768 KiB: the rest of the record must fit)."""

    max_lease_ms: int = Field(default=300_000, ge=1000)
    """Longest lease the processor grants; a worker asking for more gets this much, and the
    grant says it was capped. A dead holder blocks a takeover at most this long."""

    approval_kinds: str = ""
    """Action kinds that wait for a person's approval at the gate: comma-separated ``kind``
    (every tenant) or ``tenant:kind`` entries, ``*`` a wildcard on either side (e.g.
    ``send_email,acme:payment``). Empty: none (a prompt may still add kinds for its run).
    Part of the decider's input: changing it changes what a replay decides."""

    approval_ttl_ms: int = Field(default=900_000, ge=1000)
    """How long a pending approval waits for a person, by the log's clock; then it is denied
    ``approval_expired``."""

    question_ttl_ms: int = Field(default=900_000, ge=1000)
    """How long a run's question (``ctx.ask_user``) waits for a person's answer, by the log's
    clock; then it is closed ``question_expired``."""
    session_retention_ms: int | None = Field(default=None, ge=1000)
    """Erase a session this long after its last run finished and nothing started after it
    (by the log's clock: the processor's ``retention`` timer, honoured by the decider). Unset:
    sessions are kept until an administrator erases them (``sessionstream sessions erase``).
    Part of the decider's input: changing it changes what a replay decides."""
    max_schedules: int = Field(default=16, ge=0, le=1000)
    """Schedules one session may keep; one more is rejected ``too_many_schedules``. Part of
    the decider's input."""

    schedule_min_interval_ms: int = Field(default=60_000, ge=1000)
    """Shortest interval an interval schedule may have (a cron fires at most once a
    minute); a shorter one is rejected ``invalid_schedule``. Part of the decider's input."""

    @field_validator("approval_kinds")
    @classmethod
    def _approval_kinds(cls, value: str) -> str:
        parse_approval_kinds(value)  # raises on an entry without a tenant or a kind
        return value


class SinkSettings(Part):
    """The PostgreSQL sink (`sessionstream sink`)."""

    sink_stall_s: float = Field(default=60.0, ge=5.0)
    """A sink whose consumer is out of the group's steady state this long (rejoining, or its
    client silent) replaces its consumer: a new member joins and resumes from PostgreSQL's
    offsets. Covers a consumer that never rejoins after a coordinator restart."""


class WorkerSettings(Part):
    """Run workers (`sessionstream worker`)."""

    worker_lease_ms: int = Field(default=30_000, ge=500)
    """Lease a worker asks for; it renews (heartbeats) every third of it."""

    worker_delta_interval_ms: int = Field(default=50, ge=0, le=10_000)
    """How often a worker publishes the token deltas of a streaming model call (one record
    per call per interval, on ``deltas_topic``); 0: none are published."""


class ModelSettings(Part):
    """The model the workers call (OpenAI-compatible)."""

    model_base_url: str | None = None
    """Base URL of an OpenAI-compatible chat-completions API, e.g. ``https://api.openai.com/v1``
    (requests go to ``{base}/chat/completions``). Unset: workers use the offline FakeModel."""

    model_name: str = "sessionstream-echo"
    """Model id sent with each request (``gpt-4o-mini``, ``llama3.1``, ...); the demo's local
    server accepts any."""

    model_api_key: SecretStr | None = None
    """Bearer token for the model API, from ``SESSIONSTREAM_MODEL_API_KEY``; never logged."""

    model_timeout_s: float = Field(default=30.0, gt=0)
    """Longest the model API may stay silent: to connect, and between two streamed chunks."""

    model_retries: int = Field(default=2, ge=0, le=10)
    """Times a model request that failed retryably before its reply began (no answer, 408,
    409, 429, 5xx) is asked again, after the provider's ``Retry-After`` (at most 30 s) or a
    doubling back-off from 0.5 s; a run's cancel ends the wait."""

    model_prices: str | None = None
    """The model's prices in US dollars per million tokens, ``INPUT/OUTPUT`` (e.g.
    ``0.15/0.60``): each ``model.request.finished`` then records its cost. Unset: no cost."""

    @field_validator("model_prices")
    @classmethod
    def _prices(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        parse_prices(value)
        return value.strip()


class MetricsSettings(Part):
    """Metrics of the long-running processes."""

    metrics_port: int | None = None
    """Port of the Prometheus ``/metrics`` endpoint of processor, sink and worker (off if unset)."""


class AnalyticsSettings(Part):
    """Live analytics (`sessionstream analytics`) and the Kafka Connect sink
    (`sessionstream connect`)."""

    analytics_app_id: str = "sessionstream-analytics"
    """faust app id of ``sessionstream analytics``: its consumer group and the prefix of the
    topics faust creates for it (``{id}-analytics-changelog``, ``{id}-__assignor-__leader``)."""

    analytics_host: str = "127.0.0.1"
    """Address the analytics JSON endpoints (``/stats/...``) listen on."""

    analytics_port: int = Field(default=6066, ge=1, le=65535)
    """Port of the analytics JSON endpoints."""

    analytics_state_dir: str | None = None
    """faust's data directory for the analytics app (default:
    ``$XDG_CACHE_HOME/sessionstream/analytics/{analytics_app_id}``)."""

    analytics_retention_minutes: int = Field(default=180, ge=1)
    """Finished runs and rejections older than this (event time, behind the newest event of
    their partition) are dropped from the analytics table; the stats cover at most this."""

    connect_url: str = "http://127.0.0.1:8083"
    """REST address of the Kafka Connect worker ``sessionstream connect`` deploys the
    analytics sink to (``make connect`` starts one here)."""


class GatewaySettings(Part):
    """The HTTP gateway and console (`sessionstream gateway`)."""

    gateway_host: str = "127.0.0.1"
    """Address ``sessionstream gateway`` (the HTTP API and the web console) listens on."""

    gateway_port: int = Field(default=8080, ge=1, le=65535)
    """Port of the gateway."""

    gateway_wait_s: float = Field(default=10.0, gt=0, le=120)
    """Longest a ``POST .../commands`` waits for the command's outcome before it answers
    ``202 pending`` (a request may ask for less with ``?wait=``)."""

    gateway_max_body_bytes: int = Field(default=262_144, ge=1024, le=1024 * 1024)
    """Largest request body the gateway reads; a larger one is refused ``413`` before it
    is read whole."""

    gateway_rate_per_s: float = Field(default=20.0, gt=0)
    """Requests per second each API key may make on average (a token bucket)."""

    gateway_rate_burst: int = Field(default=40, ge=1)
    """Requests an API key may make at once after being idle (the bucket's size)."""

    gateway_key_cache_s: float = Field(default=5.0, ge=0)
    """How long the gateway trusts what it read about a key (so a revoked key stops
    working within this time)."""

    gateway_sse_queue: int = Field(default=1000, ge=10)
    """Events buffered per Server-Sent-Events client; a client that falls this far behind
    is disconnected (it resumes with ``Last-Event-ID``)."""

    gateway_sse_ping_s: float = Field(default=15.0, gt=0)
    """Seconds between keep-alive comments on an idle event stream."""

    gateway_sse_queue_bytes: int = Field(default=8 << 20, ge=64 << 10)
    """Bytes of events (as stored in Kafka) buffered per event stream; one that falls this
    far behind is disconnected like one past ``gateway_sse_queue`` events."""

    gateway_sse_send_timeout_s: float = Field(default=5.0, gt=0)
    """An event stream whose client takes nothing for this long (one write waits this
    long on a full socket) is closed; the client resumes with ``Last-Event-ID``."""

    gateway_sse_per_key: int = Field(default=16, ge=1)
    """Open event streams per API key; one more is ``429`` with ``Retry-After``."""

    gateway_sse_per_tenant: int = Field(default=64, ge=1)
    """Open event streams per tenant (all its keys); one more is ``429``."""

    gateway_catch_up_threads: int = Field(default=8, ge=1, le=64)
    """Threads that read resumed streams' catch-ups from Kafka, a page at a time (a
    thread is held only while a page is read, never while a client is slow)."""

    gateway_catch_up_per_tenant: int = Field(default=2, ge=1)
    """Catch-up pages one tenant reads at once: the other threads stay free for the other
    tenants, however many streams one tenant resumes."""

    gateway_catch_up_page_bytes: int = Field(default=1 << 20, ge=64 << 10)
    """Bytes of a session's events read into memory per catch-up page (at least one event)."""

    gateway_header_timeout_s: float = Field(default=10.0, gt=0)
    """A connection must send a request's whole head (line and headers) within this of
    opening, or of its previous response; else ``408`` and closed."""

    gateway_body_timeout_s: float = Field(default=15.0, gt=0)
    """A request's whole body must arrive within this of its head; else ``408`` and closed."""

    gateway_idle_timeout_s: int = Field(default=5, ge=1)
    """A kept-alive connection with no request for this long is closed."""

    gateway_max_connections: int = Field(default=2048, ge=16)
    """Open connections in all (lowered to what the open-files limit allows); one more is
    answered ``503`` with ``Retry-After`` and closed."""

    gateway_max_connections_per_address: int = Field(default=128, ge=1)
    """Open connections from one client address; one more is ``429`` and closed."""

    gateway_unauthenticated_per_s: float = Field(default=5.0, gt=0)
    """Requests per second one client address may make without a key the gateway already
    knows (no key, a bad one, or one it must look up): each may cost a database query.
    Beyond it (after ``gateway_unauthenticated_burst``) ``429`` with ``Retry-After``."""

    gateway_unauthenticated_burst: int = Field(default=20, ge=1)
    """Such requests one client address may make at once."""

    gateway_forwarded_allow_ips: str = ""
    """Proxies whose ``X-Forwarded-For`` names the client (comma-separated addresses, or
    ``*``); empty: the connection's own address is the client, whatever headers say."""

    gateway_docs: bool = False
    """Serve the API's Swagger UI at ``/docs`` (from the package, no CDN);
    ``/openapi.json`` is always served."""

    gateway_analytics_url: str | None = None
    """Where the gateway reads the live analytics (``sessionstream analytics``); default
    ``http://{analytics_host}:{analytics_port}``."""

    gateway_cursor_secret: SecretStr | None = Field(default=None, min_length=32)
    """Secret the search cursors are signed with (``nextCursor`` of ``GET /v1/runs`` and
    ``GET /v1/sessions``, and of ``sessionstream runs list``): HMAC-SHA256, so a cursor
    that was altered, cut or made elsewhere is refused ``400``. At least 32 characters
    (``openssl rand -base64 32``); give every gateway behind one address the same. Unset:
    each gateway process draws a random one at start, so its cursors do not survive a
    restart nor pass to another process (the client starts again from the first page),
    and ``runs list`` signs with a key derived from its database credentials."""
