-- Erasure (docs/protocol.md, erasure and retention): what stays of an erased session. The
-- sink writes one row per `session.erased` it applies, in the transaction that deletes the
-- session's rows; the session is named by a hash of its id only, with the time, who, why,
-- and where the erasure sits in the events log (what the audit checks the topic against).
create table session_erasures (
    session_hash    text not null,          -- sha256: + hex of the session id
    tenant_id       text not null,
    erased_at       timestamptz not null,   -- the session.erased event's ts (the log's clock)
    trigger         text not null,          -- admin | retention
    actor           text,
    reason          text,
    kafka_partition integer not null,
    kafka_offset    bigint not null,
    keys_tombstoned integer not null,
    rows_deleted    integer not null,
    primary key (kafka_partition, kafka_offset)
);
create index session_erasures_hash_idx on session_erasures (session_hash);

-- Pointers the erased session's events held (checkpoints, step results stored outside):
-- listed for an operator's job to delete the objects, then the rows.
create table erasure_pointers (
    session_hash text not null,
    uri          text not null,
    listed_at    timestamptz not null default now(),
    primary key (session_hash, uri)
);

-- Who may erase through the gateway: an API key's role. `producer` keys send the
-- producers' commands; `admin` keys may also erase their tenant's sessions
-- (POST /v1/admin/sessions/{id}/erase).
alter table api_keys add column role text not null default 'producer'
    check (role in ('producer', 'admin'));
