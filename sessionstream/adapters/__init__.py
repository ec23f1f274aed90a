"""The adapters: Kafka, the schema registry, Kafka Connect, topics, access grants, metrics and
logging — everything that talks to the world outside the process."""
