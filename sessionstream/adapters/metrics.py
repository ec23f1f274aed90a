"""Prometheus metrics of the processor, the sink, the workers and the webhook deliverer.

Each process serves them on `--metrics-port` (or SESSIONSTREAM_METRICS_PORT) at `/metrics`;
nothing is served when neither is set. Names are prefixed `sessionstream_`.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

__all__ = [
    "ACTIVE_RUNS",
    "CANCEL_LATENCY",
    "COMMANDS",
    "COMMAND_AGE",
    "DEAD_LETTERS",
    "EVENTS",
    "FORWARDED",
    "LEASE_EXPIRIES",
    "PROCESSOR_CONSUMER_REPLACED",
    "REJECTIONS",
    "SINK_BATCH_SECONDS",
    "SINK_CONSUMER_REPLACED",
    "SINK_EVENTS",
    "SINK_LAG",
    "TRANSACTIONS",
    "WEBHOOK_ATTEMPTS",
    "WEBHOOK_ATTEMPT_SECONDS",
    "WEBHOOK_BACKLOG",
    "WEBHOOK_DEAD_LETTERS",
    "WEBHOOK_DELIVERED",
    "WEBHOOK_LATENCY",
    "WEBHOOK_RETRIES",
    "WORKER_ACQUIRES",
    "WORKER_CANCEL_SECONDS",
    "WORKER_RUNS",
    "WORKER_SELF_FENCES",
    "serve",
]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# -- processor ---------------------------------------------------------------------------
COMMANDS = Counter(
    "sessionstream_commands", "Commands decided, by outcome", ["outcome"]
)  # accepted | rejected | duplicate | dead_letter | forwarded
REJECTIONS = Counter("sessionstream_rejections", "command.rejected events, by reason", ["reason"])
DEAD_LETTERS = Counter(
    "sessionstream_dead_letters", "Records sent to the DLQ, by reason", ["reason"]
)
EVENTS = Counter("sessionstream_events", "Events written to the events topic")
FORWARDED = Counter(
    "sessionstream_commands_forwarded",
    "Commands found on a partition their key does not hash to (a producer without the "
    "murmur2 partitioner), forwarded to the right one",
)
TRANSACTIONS = Counter(
    "sessionstream_transactions", "Processor transactions, by result", ["result"]
)
ACTIVE_RUNS = Gauge("sessionstream_active_runs", "Active runs in this processor's partitions")
LEASE_EXPIRIES = Counter("sessionstream_lease_expiries", "run.lease_expired events")
CANCEL_LATENCY = Histogram(
    "sessionstream_cancel_seconds",
    "run.cancel_requested -> run.finished{cancelled}, by the decider's (log) clock",
    buckets=_LATENCY_BUCKETS,
)
TRANSACTION_PHASE_SECONDS = Histogram(
    "sessionstream_transaction_phase_seconds",
    "Time of each phase of a committed processor transaction (begin, decide, changelogs, "
    "send_offsets, commit, store)",
    ["phase"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0),
)
COMMAND_AGE = Histogram(
    "sessionstream_command_age_seconds",
    "Producer timestamp of a command -> its events committed",
    buckets=_LATENCY_BUCKETS,
)

PROCESSOR_CONSUMER_REPLACED = Counter(
    "sessionstream_processor_consumer_replaced",
    "Times the processor replaced its group consumer, by why: fenced by its own session "
    "timeout, or absent from the group after a revoke",
    ["why"],
)

# -- sink --------------------------------------------------------------------------------
SINK_EVENTS = Counter("sessionstream_sink_events", "Events written to PostgreSQL")
SINK_CONSUMER_REPLACED = Counter(
    "sessionstream_sink_consumer_replaced",
    "Times the sink replaced a consumer stuck outside the group's steady state",
)
SINK_BATCH_SECONDS = Histogram(
    "sessionstream_sink_batch_seconds",
    "One PostgreSQL transaction of the sink",
    buckets=_LATENCY_BUCKETS,
)
SINK_LAG = Gauge(
    "sessionstream_sink_lag", "Events not yet in PostgreSQL, by partition", ["partition"]
)

# -- workers -----------------------------------------------------------------------------
WORKER_RUNS = Counter(
    "sessionstream_worker_runs", "Runs this worker executed, by how they ended", ["end"]
)
WORKER_ACQUIRES = Counter("sessionstream_worker_acquires", "lease.acquire commands sent")
WORKER_SELF_FENCES = Counter(
    "sessionstream_worker_self_fences",
    "Runs this worker gave up because its lease could have passed unrenewed",
)
WORKER_CANCEL_SECONDS = Histogram(
    "sessionstream_worker_cancel_seconds",
    "run.cancel_requested seen -> cancel.ack sent",
    buckets=_LATENCY_BUCKETS,
)

# -- webhooks ----------------------------------------------------------------------------
WEBHOOK_DELIVERED = Counter("sessionstream_webhooks_delivered", "Webhook deliveries answered 2xx")
WEBHOOK_ATTEMPTS = Counter(
    "sessionstream_webhooks_attempts", "Webhook delivery attempts, by result", ["result"]
)  # ok | failed
WEBHOOK_RETRIES = Counter(
    "sessionstream_webhooks_retries", "Failed webhook attempts that will be tried again"
)
WEBHOOK_DEAD_LETTERS = Counter(
    "sessionstream_webhooks_dead_letters",
    "Webhook deliveries given up (tries ran out, backlog full, URL refused, 410 Gone)",
)
WEBHOOK_BACKLOG = Gauge(
    "sessionstream_webhooks_backlog", "Webhook deliveries waiting or retrying in this process"
)
WEBHOOK_ATTEMPT_SECONDS = Histogram(
    "sessionstream_webhooks_attempt_seconds",
    "One webhook attempt: connect to the answer's head",
    buckets=_LATENCY_BUCKETS,
)
WEBHOOK_LATENCY = Histogram(
    "sessionstream_webhooks_latency_seconds",
    "An event appended to the events topic -> its delivery answered 2xx",
    buckets=_LATENCY_BUCKETS,
)


def serve(port: int | None) -> None:
    """Serve /metrics on `port` (all interfaces, so a scraper in another container can reach it)."""
    if port:
        start_http_server(port)
