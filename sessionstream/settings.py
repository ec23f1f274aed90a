"""Runtime configuration, read from ``SESSIONSTREAM_*`` environment variables.

The defaults point at the local stack that ``make up`` starts (Kafka on 127.0.0.1:9092,
PostgreSQL on 127.0.0.1:5432). Nothing else in the code knows those addresses: a user with
their own Kafka or PostgreSQL sets ``SESSIONSTREAM_KAFKA_BOOTSTRAP`` /
``SESSIONSTREAM_DATABASE_URL`` and everything follows.
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "get_settings"]


class Settings(BaseSettings):
    """sessionstream's settings; field ``x`` is read from ``SESSIONSTREAM_X``."""

    model_config = SettingsConfigDict(
        env_prefix="SESSIONSTREAM_",
        frozen=True,
        extra="ignore",
        # The docstrings below become the fields' descriptions (shown by --help later).
        use_attribute_docstrings=True,
    )

    kafka_bootstrap: str = "127.0.0.1:9092"
    """Kafka bootstrap servers, a comma-separated ``host:port`` list."""

    database_url: str = "postgresql://sessionstream:sessionstream@127.0.0.1:5432/sessionstream"
    """PostgreSQL connection URL as libpq reads it: ``postgresql://user:pw@host:port/db``."""

    database_schema: str | None = None
    """PostgreSQL schema of sessionstream's tables (default: the search path's, ``public``)."""

    commands_topic: str = "session.commands"
    """Topic of session commands, keyed by ``session_id`` (one partition per session)."""

    events_topic: str = "session.events"
    """Compacted topic of session events, keyed ``{session_id}/{run_id}/{seq:010d}``."""

    dlq_topic: str = "session.dlq"
    """Dead-letter topic for input that cannot be decoded or decided, keyed by the original key."""

    state_topic: str = "session.state"
    """Compacted changelog of the processor's per-session state, keyed by ``session_id``."""

    dedup_topic: str = "session.dedup"
    """Changelog of the command ids each session remembers (duplicate detection), keyed
    ``{session_id}/{digest}``; compacted, and deleted after the dedup window."""

    processor_group: str = "sessionstream-processor"
    """Consumer group of the session processors (also the prefix of their transactional ids)."""

    processor_instance: str | None = None
    """This processor's stable instance id (default: the host name). Two processors on one
    host need distinct ids; a restarted one must keep its id so it fences its predecessor."""

    transaction_timeout_ms: int = Field(default=10_000, ge=1000)
    """How long a dead processor's open transaction may block readers before the broker aborts
    it (a restarted instance aborts it at once)."""

    replication_factor: int = Field(default=1, ge=1)
    """Replication factor of the topics sessionstream creates (1 on the local single broker)."""

    partitions: int = Field(default=4, ge=1)
    """Partition count of the commands and events topics (the two must be equal)."""

    metrics_port: int | None = None
    """Port of the Prometheus ``/metrics`` endpoint of processor, sink and worker (off if unset)."""

    max_payload_bytes: int = Field(default=262144, ge=1024, le=1024 * 1024)
    """Largest accepted command payload in bytes; a larger one is rejected with
    ``payload_too_large`` (records over the codec's 900 KiB go to the DLQ)."""

    max_lease_ms: int = Field(default=300_000, ge=1000)
    """Longest lease the processor grants; a worker asking for more gets this much, and the
    grant says it was capped. A dead holder blocks a takeover at most this long."""

    worker_group: str = "sessionstream-workers"
    """Consumer group of the run workers on the events topic."""

    worker_lease_ms: int = Field(default=30_000, ge=500)
    """Lease a worker asks for; it renews (heartbeats) every third of it."""

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


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read from the environment on first use."""
    return Settings()
