-- Webhooks (sessionstream/runtimes/webhooks, docs/webhooks.md): each tenant's subscriptions
-- and the deliveries that became dead letters.
--
-- A signing secret must be usable to sign, so it is not kept as a hash alone (as an API
-- key is): `secret_sealed` holds it encrypted (AES-256-GCM under
-- SESSIONSTREAM_WEBHOOKS_SECRET_KEY, the subscription id as associated data), and
-- `secret_hash` / `secret_prefix` let a secret be recognised without opening it. It is
-- shown once, when the subscription is created. Deleting a subscription keeps its row
-- (its dead letters name it) and drops the sealed secret.

create table webhook_subscriptions (
    subscription_id text primary key,     -- wh_<16 hex>
    tenant_id       text not null,
    url             text not null,
    event_types     text[] not null,      -- run.finished, run.*, *
    description     text,
    secret_prefix   text not null,        -- the secret's first characters (whsec_AbCd)
    secret_hash     text not null,        -- sha256 of the secret, hex
    secret_sealed   bytea,                -- null once deleted
    -- where the events topic ended (per partition, for a read_committed reader) when the
    -- subscription was made: it is sent the events from there on, no history
    start_offsets   jsonb not null,
    created_at      timestamptz not null default now(),
    deleted_at      timestamptz
);
create index webhook_subscriptions_tenant_idx on webhook_subscriptions (tenant_id)
    where deleted_at is null;

-- One row per (subscription, event) that was not delivered: its tries ran out, the backlog
-- was full, or the URL came to be refused. Where the event is in the log
-- (partition, kafka_offset) is where `sessionstream webhooks redeliver` starts; a
-- redelivery that gets a 2xx deletes the row.
create table webhook_dead_letters (
    subscription_id text not null references webhook_subscriptions (subscription_id),
    event_id        text not null,        -- the webhook-id: the event's key
    event_type      text not null,
    session_id      text not null,
    partition       integer not null,
    kafka_offset    bigint not null,
    attempts        integer not null,
    last_status     integer,              -- the last answer's HTTP status, null: none
    last_error      text not null,
    dead_at         timestamptz not null default now(),
    primary key (subscription_id, event_id)
);
create index webhook_dead_letters_position_idx
    on webhook_dead_letters (subscription_id, partition, kafka_offset);
