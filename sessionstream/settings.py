"""Runtime configuration, read from ``SESSIONSTREAM_*`` environment variables.

The defaults point at the local stack that ``make up`` starts (Kafka on 127.0.0.1:9092,
PostgreSQL on 127.0.0.1:5432). Nothing else in the code knows those addresses: a user with
their own Kafka or PostgreSQL sets ``SESSIONSTREAM_KAFKA_BOOTSTRAP`` /
``SESSIONSTREAM_DATABASE_URL`` and everything follows.
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field
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

    max_payload_bytes: int = Field(default=262144, ge=1024)
    """Largest accepted command payload in bytes; a larger one is rejected with
    ``payload_too_large`` (records over the codec's 900 KiB go to the DLQ)."""

    worker_group: str = "sessionstream-workers"
    """Consumer group of the run workers on the events topic."""

    worker_lease_ms: int = Field(default=30_000, ge=500)
    """Lease a worker asks for; it renews (heartbeats) every third of it."""

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


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read from the environment on first use."""
    return Settings()
