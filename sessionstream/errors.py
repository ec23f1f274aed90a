"""sessionstream's exceptions: one root, typed subclasses carrying what a caller needs.

Driver errors (confluent-kafka, psycopg, httpx) are translated into these at the adapter boundary
(`raise ... from e`), so callers never need to import a driver to handle a failure.
"""

from __future__ import annotations

__all__ = [
    "CommandTimeout",
    "ConfigurationError",
    "DatabaseError",
    "DatabaseUnavailable",
    "ErasureIncomplete",
    "IncompatibleEvent",
    "KafkaFailed",
    "KafkaUnavailable",
    "ModelError",
    "ModelUnavailable",
    "QueryFailed",
    "RegistryUnavailable",
    "SchemaIncompatible",
    "SessionstreamError",
    "SingleWriterViolation",
    "TopicMisconfigured",
]


class SessionstreamError(Exception):
    """Root of every error sessionstream raises on purpose."""


class ConfigurationError(SessionstreamError):
    """A setting is missing or inconsistent."""


class KafkaUnavailable(SessionstreamError):
    """The broker did not answer; `bootstrap` says where we looked."""

    def __init__(self, message: str, *, bootstrap: str) -> None:
        super().__init__(
            f"{message}\n  Kafka bootstrap: {bootstrap} (SESSIONSTREAM_KAFKA_BOOTSTRAP); "
            "start the local stack with `make up`."
        )
        self.bootstrap = bootstrap


class KafkaFailed(SessionstreamError):
    """A call into the Kafka client failed, or a record it delivered carries an error. The
    Kafka adapter (`sessionstream.adapters.kafka`) translates every driver error into this,
    once, and says what it means: callers decide on the flags, never on the driver's codes.

    `reason` is the driver's text; `name` librdkafka's error name (e.g. `_TIMED_OUT`,
    `PRODUCER_FENCED`; `str()` shows both), and `code` its number, for the adapter's own
    finer distinctions.
    `fatal`: the client can do nothing more (a transactional producer is replaced);
    `retriable`: asking again may succeed; `requires_abort`: the open transaction must be
    aborted; `fenced`: a newer producer has our transactional id (or the coordinator
    bumped its epoch); `timed_out`: no answer in time; `coordinator_busy`: the transaction
    coordinator is not (yet) serving; `partition_eof`: a read reached a partition's end (an
    event, not a failure)."""

    def __init__(
        self,
        reason: str,
        *,
        name: str = "",
        code: int = -1,
        fatal: bool = False,
        retriable: bool = False,
        requires_abort: bool = False,
        fenced: bool = False,
        timed_out: bool = False,
        coordinator_busy: bool = False,
        partition_eof: bool = False,
    ) -> None:
        super().__init__(f"{reason} ({name})" if name and name not in reason else reason)
        self.reason = reason
        self.name = name
        self.code = code
        self.fatal = fatal
        self.retriable = retriable
        self.requires_abort = requires_abort
        self.fenced = fenced
        self.timed_out = timed_out
        self.coordinator_busy = coordinator_busy
        self.partition_eof = partition_eof


class RegistryUnavailable(SessionstreamError):
    """The schema registry did not answer; `url` says where we looked."""

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(
            f"{message}\n  schema registry: {url} (SESSIONSTREAM_SCHEMA_REGISTRY_URL); "
            "start the local stack with `make up`."
        )
        self.url = url


class SchemaIncompatible(ConfigurationError):
    """This version's schema of a subject is not compatible with what the registry holds
    under it (`subject`; `detail` is the registry's own reason)."""

    def __init__(self, message: str, *, subject: str, detail: str) -> None:
        super().__init__(message)
        self.subject = subject
        self.detail = detail


class DatabaseError(SessionstreamError):
    """A call into PostgreSQL failed: the database did not answer (`DatabaseUnavailable`)
    or refused a statement (`QueryFailed`). The PostgreSQL adapter
    (`sessionstream.adapters.postgres`) translates the driver's errors into these; `reason`
    is the failure's own text (the driver's, for a translated error) without what the
    subclass adds to the message."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class DatabaseUnavailable(DatabaseError):
    """PostgreSQL did not answer; `url` (without password) says where we looked."""

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(
            f"{message}\n  database: {url} (SESSIONSTREAM_DATABASE_URL); "
            "start the local stack with `make up`.",
            reason=message,
        )
        self.url = url


class TopicMisconfigured(ConfigurationError):
    """A topic exists with settings that would break the protocol (e.g. not compacted)."""

    def __init__(self, topic: str, problem: str) -> None:
        super().__init__(f"topic {topic!r}: {problem}")
        self.topic = topic
        self.problem = problem


class CommandTimeout(SessionstreamError):
    """A command's outcome did not appear in time."""

    def __init__(self, command_id: str, detail: str) -> None:
        super().__init__(f"command {command_id}: {detail}")
        self.command_id = command_id


class IncompatibleEvent(SessionstreamError):
    """An event this version cannot decode (written by a newer processor): upgrade first."""


class ErasureIncomplete(SessionstreamError):
    """The sink could not put an erased session's tombstones on the broker: nothing of the
    erasure was committed, and the sink stops rather than delete the rows without them."""


class SingleWriterViolation(SessionstreamError):
    """Two active runs for one session: the protocol's invariant is broken."""


class ModelError(SessionstreamError):
    """A model provider failed a request: an HTTP error status, or a reply that is not a
    chat-completions stream. `status` is the HTTP status (None when no answer came)."""

    def __init__(
        self,
        message: str,
        *,
        url: str,
        status: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(f"{message}\n  model endpoint: {url} (SESSIONSTREAM_MODEL_BASE_URL)")
        self.url = url
        self.status = status
        #: how long the provider asked to wait before asking again (its Retry-After)
        self.retry_after_s = retry_after_s

    @property
    def retryable(self) -> bool:
        """The same request may succeed later (no answer, rate limited, a server error)."""
        return self.status is None or self.status in (408, 409, 429) or self.status >= 500


class ModelUnavailable(ModelError):
    """The provider did not answer: no connection, or silent for longer than the timeout."""


class QueryFailed(DatabaseError):
    """A SQL statement failed in the database; `sqlstate` is PostgreSQL's code (None when
    the driver refused it before it reached the server)."""

    def __init__(self, message: str, *, sqlstate: str | None) -> None:
        super().__init__(f"query failed ({sqlstate}): {message}", reason=message)
        self.sqlstate = sqlstate
