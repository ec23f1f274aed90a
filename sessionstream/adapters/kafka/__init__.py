"""The Kafka adapter: every client sessionstream creates is made, configured, read and
produced through here, and driver errors become sessionstream's own (`KafkaFailed`,
`KafkaUnavailable`). The record types the clients hand out (`Message`, `TopicPartition`)
and the offset sentinels are re-exported: nothing above the adapter imports the driver."""

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Message, TopicPartition

from sessionstream.adapters.kafka.clients import (
    Admin,
    CommandProducer,
    DeliveryCallback,
    GroupConsumer,
    Reader,
    RebalanceCallback,
    TransactionalProducer,
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
from sessionstream.adapters.kafka.errors import (
    failure,
    kafka_cause,
    record_failure,
    translated,
    unavailable,
)
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
    "OFFSET_BEGINNING",
    "OFFSET_END",
    "Admin",
    "CommandProducer",
    "DeadLetter",
    "DeliveryCallback",
    "GroupConsumer",
    "LogRecord",
    "Message",
    "Reader",
    "RebalanceCallback",
    "TopicPartition",
    "TransactionalProducer",
    "aiokafka_config",
    "client_config",
    "command_producer_config",
    "data_messages",
    "dead_letter_headers",
    "end_offset",
    "failure",
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
    "record_failure",
    "security_config",
    "take",
    "transactional_producer_config",
    "translated",
    "unavailable",
]
