-- The seed's tables. Ids are text: the wire format's session ids are the producers' own
-- strings and run ids are uuid5 strings, plus the session log's run id '_session'.

create table agent_sessions (
    session_id    text primary key,
    tenant_id     text not null,
    active_run_id text,
    created_at    timestamptz not null,
    updated_at    timestamptz not null
);

create table agent_runs (
    run_id              text primary key,
    session_id          text not null references agent_sessions (session_id),
    tenant_id           text not null,
    status              text not null check (status in
                          ('running', 'compacting', 'cancelling',
                           'completed', 'cancelled', 'failed', 'timed_out')),
    generation          bigint not null,
    lease_owner         text,
    lease_expires_at    timestamptz,
    timeout_at          timestamptz not null,
    cancel_requested_at timestamptz,
    terminal_status     text check (terminal_status in
                          ('completed', 'cancelled', 'failed', 'timed_out')),
    terminal_at         timestamptz,
    prompt              text not null,
    context_ref         text,
    checkpoint_uri      text,           -- a pointer to object storage, never the blob
    last_seq            bigint not null,
    created_at          timestamptz not null,
    updated_at          timestamptz not null,
    check ((terminal_status is null) = (status in ('running', 'compacting', 'cancelling')))
);

-- the backstop of the single-writer protocol: two active runs of a session cannot exist
create unique index only_one_active_run_per_session on agent_runs (session_id)
    where status in ('running', 'compacting', 'cancelling');
create index active_run_timeout_idx on agent_runs (timeout_at)
    where status in ('running', 'compacting', 'cancelling');
create index session_run_history_idx on agent_runs (session_id, created_at desc);

create table agent_run_events (
    id              bigserial primary key,
    session_id      text not null,
    run_id          text not null,      -- '_session' for the session's own log
    seq             bigint not null,
    type            text not null,
    payload         jsonb not null,
    generation      bigint not null,
    command_id      text not null,
    tenant_id       text not null,
    ts              timestamptz not null,
    kafka_partition integer not null,
    kafka_offset    bigint not null,
    unique (session_id, run_id, seq)
);
create index agent_run_events_run_idx on agent_run_events (run_id, seq);
create index agent_run_events_type_idx on agent_run_events (type);

-- the sink's position, written in the same transaction as the rows (exactly-once)
create table sink_offsets (
    topic       text not null,
    partition   integer not null,
    next_offset bigint not null,
    updated_at  timestamptz not null default now(),
    primary key (topic, partition)
);
