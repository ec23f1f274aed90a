-- API keys of the HTTP gateway (sessionstream/apps/gateway/keys.py). A key is shown once, when it
-- is created; only its SHA-256 is kept. `key_id` is the key's visible part
-- (`ssk_<key_id>_<secret>`), so a key can be named in logs and revoked without its secret.
-- The gateway takes the tenant and the actor of every command from the key, never from
-- the request.

create table api_keys (
    key_id     text primary key,
    key_hash   text not null,          -- sha256 of the whole key, hex
    tenant_id  text not null,
    actor      text not null,
    name       text,
    created_at timestamptz not null default now(),
    revoked_at timestamptz
);
create index api_keys_tenant_idx on api_keys (tenant_id);
