"""The Kafka adapter: every client sessionstream creates is configured, read and produced
through here, and driver errors become sessionstream's own (`sessionstream.errors`)."""

from sessionstream.adapters.kafka.clients import (
    new_admin,
    new_command_producer,
    new_group_consumer,
    new_reader,
    new_transactional_producer,
)
from sessionstream.adapters.kafka.config import (
    KAFKA_LOG,
    aiokafka_config,
    client_config,
    command_producer_config,
    faust_credentials,
    group_consumer_config,
    reader_config,
    security_config,
    transactional_producer_config,
)
from sessionstream.adapters.kafka.dlq import DeadLetter, dead_letter_headers
from sessionstream.adapters.kafka.errors import kafka_cause, unavailable, unmasked
from sessionstream.adapters.kafka.producer import produce
from sessionstream.adapters.kafka.reader import (
    METADATA_WAIT_S,
    LogRecord,
    data_messages,
    end_offset,
    log_bounds,
    partitions_of,
    read_messages,
    read_records,
    read_topic,
    take,
)

__all__ = [
    "KAFKA_LOG",
    "METADATA_WAIT_S",
    "DeadLetter",
    "LogRecord",
    "aiokafka_config",
    "client_config",
    "command_producer_config",
    "data_messages",
    "dead_letter_headers",
    "end_offset",
    "faust_credentials",
    "group_consumer_config",
    "kafka_cause",
    "log_bounds",
    "new_admin",
    "new_command_producer",
    "new_group_consumer",
    "new_reader",
    "new_transactional_producer",
    "partitions_of",
    "produce",
    "read_messages",
    "read_records",
    "read_topic",
    "reader_config",
    "security_config",
    "take",
    "transactional_producer_config",
    "unavailable",
    "unmasked",
]
